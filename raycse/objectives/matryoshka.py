"""Matryoshka representation learning (Kusupati et al., 2022, Sec. 3) around any objective.

``objective.matryoshka_dims: [384, 256, 128, 64]`` (optional ``matryoshka_weights``, 1 each by
default): the objective's loss on each nested prefix of the embedding, summed,

    L_MRL = sum_{m in M} c_m * L(z_{1:m} / ||z_{1:m}||)

so that the first m coordinates, re-normalised, are an embedding on their own (what
``SentenceTransformer(path, truncate_dim=m)`` serves). The encoder runs once a step: the objective
runs once per dimension on a stand-in encoder (:class:`Truncated`) that answers every call with the
first pass's vectors, cut to m and re-normalised. So it composes with what the objective does
through the encoder: the cross-worker gather (each prefix is gathered), HiCL (each segment's prefix),
CompCSE (the composed halves' prefixes; a fractional ``d0`` is that share of each prefix) and
GradCache (its leaves collect every prefix's gradient). What needs the whole width is refused
(``Objective.matryoshka_refusal``): SG-OPT, whose projection head scores the embedding against the
frozen copy's full-width hidden layers, and CompCSE's ``sbert`` composition of projected halves. Every prefix is re-normalised, the
whole width too: objectives that score by cosine see what they saw without Matryoshka; BSC with
``normalization: none`` or ``coord`` scores unit vectors under it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch.nn.functional as F
from torch import Tensor, nn

from raycse.errors import ConfigError
from raycse.objectives.base import LossOutput, Objective


@dataclass
class MatryoshkaSpec:
    """The nested dimensions, largest first, and each one's weight in the sum."""

    dims: tuple[int, ...]
    weights: tuple[float, ...]

    @classmethod
    def build(cls, dims, weights=None) -> "MatryoshkaSpec":
        where = "objective.matryoshka_dims"
        if not isinstance(dims, (list, tuple)) or not dims or not all(_whole(d) and int(d) >= 1 for d in dims):
            raise ConfigError(f"{where} must be a list of embedding sizes >= 1, e.g. [384, 256, 128, 64]; "
                              f"got {dims!r}")
        dims = [int(d) for d in dims]
        if len(set(dims)) != len(dims):
            raise ConfigError(f"{where} repeats a size: {dims}")
        if weights is None:
            weights = [1.0] * len(dims)
        if (not isinstance(weights, (list, tuple)) or len(weights) != len(dims)
                or not all(isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0 for w in weights)
                or not any(weights)):
            raise ConfigError(f"objective.matryoshka_weights must be one weight >= 0 per size of {where} "
                              f"({len(dims)}), not all 0; got {weights!r}")
        order = sorted(range(len(dims)), key=lambda i: -dims[i])
        return cls(tuple(dims[i] for i in order), tuple(float(weights[i]) for i in order))


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) or isinstance(x, float) and x.is_integer()


def shrink(z: Tensor, dim: int) -> Tensor:
    """The first ``dim`` coordinates of each row, re-normalised (in float32, as the objectives score)."""
    return F.normalize(z[..., :dim].float(), dim=-1)


class Replay:
    """The encoder's answers in the first pass, handed out again in the same order in later passes."""

    def __init__(self):
        self.answers: list[tuple[tuple, Tensor]] = []
        self.recording, self.position = True, 0

    def rewind(self) -> None:
        self.recording, self.position = False, 0

    def get(self, kind: str, shape: tuple, compute) -> Tensor:
        if self.recording:
            out = compute()
            self.answers.append(((kind, shape), out))
            return out
        if self.position >= len(self.answers) or self.answers[self.position][0] != (kind, shape):
            raise RuntimeError("matryoshka: the objective called the encoder differently for another dimension")
        out = self.answers[self.position][1]
        self.position += 1
        return out


class Truncated:
    """The encoder as the objective sees it at one dimension: the embedding (``encoder(...)`` and
    ``head(...)``) cut to ``dim`` and re-normalised; pooled states (what the head reads) whole."""

    def __init__(self, encoder: nn.Module, dim: int, replay: Replay):
        self._encoder, self._dim, self._replay = encoder, dim, replay

    def __getattr__(self, name):  # tokenizer, hidden_size, forward_options, ...
        return getattr(self._encoder, name)

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Optional[Tensor] = None) -> Tensor:
        z = self._replay.get("embed", tuple(input_ids.shape),
                             lambda: self._encoder(input_ids, attention_mask, token_type_ids))
        return shrink(z, self._dim)

    def forward(self, *args, **kwargs) -> Tensor:
        return self(*args, **kwargs)

    def pooled(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Optional[Tensor] = None) -> Tensor:
        return self._replay.get("pooled", tuple(input_ids.shape),
                                lambda: self._encoder.pooled(input_ids, attention_mask, token_type_ids))

    def head(self, x: Tensor) -> Tensor:
        return shrink(self._replay.get("head", tuple(x.shape), lambda: self._encoder.head(x)), self._dim)


class Matryoshka(Objective):
    """``base``'s loss summed over the nested prefixes of ``spec`` (module docstring)."""

    name = "matryoshka"

    def __init__(self, base: Objective, spec: MatryoshkaSpec):
        refusal = base.matryoshka_refusal()
        if refusal:
            raise ConfigError(f"objective.matryoshka_dims cannot wrap {base.name}: {refusal}")
        super().__init__(base.params)
        self.base, self.spec = base, spec
        self.flags_of(base)

    def setup(self, encoder: nn.Module) -> None:
        self.base.setup(encoder)
        check_fits(self.spec, encoder.output_size)

    def custom_lr(self) -> dict[str, float]:
        return {f"base.{k}": v for k, v in self.base.custom_lr().items()}

    def collate(self, examples, tokenizer, max_length):
        return self.base.collate(examples, tokenizer, max_length)

    def forward(self, encoder, batch) -> LossOutput:
        replay, total, metrics = Replay(), 0.0, {}
        for dim, weight in zip(self.spec.dims, self.spec.weights):
            out = self.base(Truncated(encoder, dim, replay), batch)
            replay.rewind()
            total = total + weight * out.loss
            metrics = {**out.metrics, **metrics}  # the largest dimension's diagnostics
            metrics[f"loss_{dim}d"] = out.loss.detach()
        return LossOutput(total, metrics)


def check_fits(spec: MatryoshkaSpec, width: int) -> None:
    """Refuse sizes the model cannot give."""
    if spec.dims[0] > width:
        raise ConfigError(f"objective.matryoshka_dims has {spec.dims[0]}, more than the model's {width} "
                          f"embedding coordinates; use sizes up to {width}")

