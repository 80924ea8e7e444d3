"""HiCL: hierarchical contrastive learning (Wu et al., 2023), wrapping any base objective.

Each sequence (truncated to ``model.max_length`` first) is sliced by the queue rule into segments
of ``slice_length`` tokens (``raycse.objectives.views.slice_pieces``); all segments of the batch go through
the encoder in one call; a sequence's vector is the length-weighted mean of its segments

    h_i = sum_j h_ij |seg_ij| / sum_k |seg_ik|     (``weighted: false`` for the plain mean)

    L_local  = InfoNCE over segments, positive = the segment's second dropout view, negatives =
               segments of *other* sequences; same-sequence segments are masked out of the
               denominator (neither positive nor negative)
    L_global = the base objective's loss, computed on the pooled sequence vectors
    L_ent    = (HiCLv2, appendix eq. 3) InfoNCE of segment seg_ij against the sequence vectors of
               the same forward pass (view), positive = its own h_i
    L        = alpha * L_local + beta * L_ent + (1 - alpha - beta) * L_global

One tau: ``tau`` set on HiCL is used by every term, the base's included (unless
``base_params`` names the base's own); left unset, every term uses the base's default.

The base objective runs unchanged on a :class:`SegmentedEncoder`, a stand-in for the encoder that
slices, encodes and pools; so HiCL composes with every other objective that encodes only
through it (``sliceable``: ``simcse``, ``bsc``, ``laser``) without a class per combination;
``compcse`` and ``sgopt`` are refused before anything starts. Why it is fast: attention is quadratic,
so l segments of L tokens cost about l*L^2 instead of (l*L)^2.

Across workers the global loss gathers as its base does; the local and entailment losses use the
worker's own segments (segment counts differ between workers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor, nn

from raycse.errors import ConfigError
from raycse.objectives.base import LossOutput, Objective, Params, positive
from raycse.objectives.catalog import BASES
from raycse.objectives.contrastive import info_nce
from raycse.objectives.views import Pieces, segment_mean, slice_pieces, special_ids


@dataclass
class HiCLParams(Params):
    base: str = "simcse"
    base_params: dict = field(default_factory=dict)
    alpha: float = 0.05
    beta: float = 0.0  # > 0 turns on HiCLv2's entailment term
    slice_length: int = 32
    weighted: bool = True
    # One tau for every term: set here, it is also the base's (unless base_params names its own);
    # None: the base's own default, which the local and entailment terms then use too
    tau: Optional[float] = None

    def validate(self) -> None:
        if self.base not in BASES.classes or not BASES.get(self.base).sliceable:
            able = [n for n in BASES.names() if BASES.get(n).sliceable]
            raise ConfigError(f"objective.base {self.base!r} cannot be sliced by HiCL; choose one of: {', '.join(able)}")
        BASES.build_params(self.base, self.base_params)
        if self.alpha < 0 or self.beta < 0 or self.alpha + self.beta > 1:
            raise ConfigError(f"objective.alpha and beta must be >= 0 with alpha + beta <= 1, got {self.alpha} + {self.beta}")
        if self.slice_length < 1:
            raise ConfigError(f"objective.slice_length must be >= 1, got {self.slice_length}")
        if self.tau is not None:
            positive("tau", self.tau)


class SegmentedEncoder(nn.Module):
    """Looks like the encoder to the base objective; records segments for the local losses."""

    def __init__(self, encoder: nn.Module, slice_length: int, weighted: bool, ids: tuple[int, int, int]):
        super().__init__()
        self.encoder = encoder
        self.slice_length = slice_length
        self.weighted = weighted
        self.ids = ids
        self.calls: list[tuple[Pieces, Tensor, Tensor, Tensor]] = []

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        pieces = slice_pieces(input_ids, attention_mask, self.slice_length, self.ids)
        z = self.encoder(**pieces.batch())
        h = segment_mean(z, pieces.owner, pieces.length, input_ids.shape[0], self.weighted)
        self.calls.append((pieces, z, h, input_ids))
        return h


class HiCL(Objective):
    name = "hicl"
    Params = HiCLParams
    derives_widths = True  # the pieces
    sliceable = False  # not twice

    def __init__(self, params: HiCLParams):
        super().__init__(params)
        base_params = dict(params.base_params)
        if params.tau is not None and "tau" in BASES.knobs(params.base):
            base_params.setdefault("tau", params.tau)
        self.base = BASES.build(params.base, base_params)
        self.tau = (params.tau if params.tau is not None
                    else getattr(self.base.params, "tau", 0.05))  # the local and entailment terms'.
        # over SimCSE, HiCL is the unsupervised method of its paper: supervised pairs are not sliced
        self.accepts = ("single",) if params.base == "simcse" else self.base.accepts
        self.collate_draws_random = self.base.collate_draws_random  # (its collate is the base's)
        self.ids = None

    def setup(self, encoder) -> None:
        self.base.setup(encoder)
        self.ids = special_ids(encoder.tokenizer)

    def custom_lr(self) -> dict:
        return {f"base.{k}": v for k, v in self.base.custom_lr().items()}

    def collate(self, examples, tokenizer, max_length):
        return self.base.collate(examples, tokenizer, max_length)

    def local_loss(self, z1: Tensor, z2: Tensor, owner: Tensor) -> Tensor:
        """Segment InfoNCE: same-sequence segments (other than itself) leave the denominator."""
        same = owner[:, None] == owner[None, :]
        exclude = same & ~torch.eye(len(owner), dtype=torch.bool, device=owner.device)
        return info_nce(z1, z2, self.tau, exclude=exclude, gather_candidates=False)

    def entailment_loss(self, z: Tensor, h: Tensor, owner: Tensor) -> Tensor:
        return info_nce(z, h, self.tau, targets=owner, gather_candidates=False)

    def forward(self, encoder, batch) -> LossOutput:
        p = self.params
        proxy = SegmentedEncoder(encoder, p.slice_length, p.weighted, self.ids or special_ids(encoder.tokenizer))
        glob = self.base(proxy, batch)
        pieces, z, h, ids = proxy.calls[0]
        n = ids.shape[0] // 2
        if ids.shape[0] % 2 == 0 and n > 0 and torch.equal(ids[:n], ids[n:]):
            # the base stacked two dropout views of the same sequences (SimCSE): reuse them
            half = int((pieces.owner < n).sum())
            z1, z2, owner = z[:half], z[half:], pieces.owner[:half]
            h1 = h[:n]  # pooled from the same view as z1
        else:
            z1, z2, owner, h1 = z, encoder(**pieces.batch()), pieces.owner, h
        total = (1 - p.alpha - p.beta) * glob.loss
        metrics = {"global": glob.loss.detach()}
        if p.alpha > 0:
            local = self.local_loss(z1, z2, owner)
            total = total + p.alpha * local
            metrics["local"] = local.detach()
        if p.beta > 0:
            ent = self.entailment_loss(z1, h1, owner)
            total = total + p.beta * ent
            metrics["entailment"] = ent.detach()
        metrics["segments_per_sequence"] = len(owner) / (owner.max() + 1).clamp(min=1)
        return LossOutput(total, {**glob.metrics, **metrics})
