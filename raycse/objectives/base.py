"""What an objective is: a small ``nn.Module`` that turns a batch of texts into a loss.

An objective owns three things:
- ``Params``: a dataclass of its knobs, validated with clear errors (``validate``);
- ``collate(texts, tokenizer, max_length)``: builds the tensors of its views on the CPU
  (in the data loader, not the hot path);
- ``forward(encoder, batch)``: runs the encoder and returns :class:`LossOutput`; the maths
  lives in ``loss(...)`` on plain tensors so it can be tested against its formula.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar, NamedTuple, Optional

import torch
from torch import Tensor, nn

from raycse.errors import ConfigError


class Pair(NamedTuple):
    """One paired example as an objective collates it. ``Pair(*row)`` reads a plain ``(q, a[, score[, negatives]])``
    tuple too, as a user of the Python API may hand one.

    Args:
        query: the first text (the data's text column).
        positive: its positive (the pair column).
        score: the pair's label scaled to [0, 1]; None: unlabelled.
        negatives: its hard negatives (the negative columns), a tuple of texts.

    Returns:
        A named tuple; an objective's ``collate`` gets a list of them where the data holds pairs.

    Raises:
        TypeError: a missing query or positive.

    >>> p = Pair("a cat sits", "a cat is sitting", 0.9)
    >>> p.positive, p.score, p.negatives
    ('a cat is sitting', 0.9, ())
    """

    query: str
    positive: str
    score: Optional[float] = None
    negatives: tuple = ()


@dataclass
class LossOutput:
    """What an objective's ``forward`` returns.

    Args:
        loss: the 0-d loss the step differentiates.
        metrics: diagnostics by name (numbers or 0-d tensors), logged with the step's loss.

    Returns:
        The value of :meth:`Objective.forward`.

    Raises:
        Nothing of its own; a loss that is not finite stops the run at its step (raycse.errors.LossNotFinite).

    >>> import torch
    >>> out = LossOutput(torch.tensor(0.5), {"positive_cosine": 0.8})
    >>> float(out.loss), out.metrics
    (0.5, {'positive_cosine': 0.8})
    """

    loss: Tensor
    # diagnostics: numbers or 0-d tensors left on the device (read back only at checkpoints: a read
    # per step would make the host wait for the device)
    metrics: dict = field(default_factory=dict)


@dataclass
class Params:
    """An objective's knobs: a dataclass whose fields are ``objective.KNOB`` (YAML, ``--set objective.KNOB=V``, a
    search space's knob), each with its default.

    Args:
        the fields a subclass declares (``tau: float = 0.05``).

    Returns:
        ``validate()`` returns None when every knob is usable.

    Raises:
        raycse.errors.ConfigError: from ``validate``, one line naming the knob and its allowed range.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class TauParams(Params):
    ...     tau: float = 0.05
    ...     def validate(self):
    ...         positive("tau", self.tau)
    >>> TauParams(tau=0.1).validate()
    >>> TauParams(tau=0).validate()
    Traceback (most recent call last):
    ...
    raycse.errors.ConfigError: objective.tau must be > 0, got 0
    """

    def validate(self) -> None:  # pragma: no cover - overridden
        pass


def positive(key: str, value: float, hint: str = "") -> None:
    """Check that knob ``objective.KEY`` is above 0 (a ``Params.validate`` helper).

    Args:
        key: the knob's name; value: its value; hint: more words for the message.

    Returns:
        None when ``value > 0``.

    Raises:
        raycse.errors.ConfigError: one line naming the knob and its value.

    >>> positive("tau", 0.05)
    >>> positive("tau", -1.0, "; e.g. 0.05")
    Traceback (most recent call last):
    ...
    raycse.errors.ConfigError: objective.tau must be > 0, got -1.0; e.g. 0.05
    """
    if not value > 0:
        raise ConfigError(f"objective.{key} must be > 0, got {value}{hint}")


class Objective(nn.Module):
    """A training objective: texts in, a loss out. A subclass names itself (``name``), its knobs (``Params``), what
    data it takes (``accepts``: "single" sentences and/or "pairs"), and implements two methods:
    ``collate(texts, tokenizer, max_length) -> dict of tensors`` (on the CPU, in the data path; ``texts``: strings,
    or :class:`Pair` s for paired data) and ``forward(encoder, batch) -> LossOutput`` (``encoder(input_ids,
    attention_mask)`` gives the pooled embeddings). Registered by import path (``--objective my_pkg.mod:Cls``) or
    an installed package's entry point in ``raycse.objectives``.

    Args:
        params: its ``Params``, validated.

    Returns:
        ``forward`` returns a :class:`LossOutput`.

    Raises:
        raycse.errors.ConfigError: a combination it cannot train, said by its ``*_refusal`` hooks (Matryoshka, LoRA,
            sharding) before a run starts.

    >>> import torch
    >>> from raycse.objectives.contrastive import info_nce
    >>> class TwoViews(Objective):
    ...     name, Params = "two_views", Params
    ...     def collate(self, texts, tokenizer, max_length):
    ...         return self.tokenize(texts + texts, tokenizer, max_length)
    ...     def forward(self, encoder, batch):
    ...         z1, z2 = encoder(batch["input_ids"], batch["attention_mask"]).chunk(2)
    ...         return LossOutput(info_nce(z1, z2, tau=0.05))
    >>> encoder = lambda ids, mask: torch.nn.functional.one_hot(ids[:, 0], 3).float()  # (an encoder stand-in)
    >>> batch = {"input_ids": torch.tensor([[0], [1], [2], [0], [1], [2]]), "attention_mask": torch.ones(6, 1)}
    >>> round(TwoViews(Params()).forward(encoder, batch).loss.item(), 6)
    0.0
    """

    name: ClassVar[str]
    Params: ClassVar[type[Params]]
    # What the data must hold: "single" sentences and/or "pairs" (q, a, score-or-None).
    accepts: ClassVar[tuple[str, ...]] = ("single",)
    # HiCL can wrap it: it reaches the encoder only through ``encoder(input_ids, attention_mask)``,
    # which HiCL's segmenting stand-in answers (objectives that need the pooled states before the
    # head, or the backbone itself, cannot be sliced)
    sliceable: ClassVar[bool] = True
    # It uses a pair's hard negatives (data.negative_column) when the data has them.
    takes_negatives: ClassVar[bool] = False
    # Its negatives are scored by InfoNCE (raycse.objectives.contrastive) on the batch's rows, where a guide
    # masks them (raycse.objectives.guide)
    guided_negatives: ClassVar[bool] = False
    # Its collate draws from torch's global generator: the training thread must collate it, in step
    # order with dropout's draws (raycse.train.ahead); a property where it depends on the knobs.
    collate_draws_random: ClassVar[bool] = False
    # It cuts or repeats sentences after tokenizing, making token widths of its own (said at a run's start).
    derives_widths: ClassVar[bool] = False
    # Token widths are padded up to a multiple of this (train.pad_to_multiple_of; set by the train loop).
    pad_multiple: int = 1
    # the flags above, which an objective wrapping another (Matryoshka, a teacher and guide) takes from it
    WRAPPED_FLAGS: ClassVar[tuple[str, ...]] = ("accepts", "sliceable", "takes_negatives", "guided_negatives",
                                                "collate_draws_random", "derives_widths")

    def __init__(self, params: Params):
        super().__init__()
        self.params = params
        # Text put before each sentence of a column, "text" and "pair" (data.prompts or the model's
        # default prompt; set by the train loop). Objectives that derive widths never get one.
        self.prompts: dict[str, str] = {}

    def flags_of(self, base: "Objective") -> None:
        """Say what ``base``, the objective this one wraps, says of itself (:data:`WRAPPED_FLAGS`)."""
        for flag in self.WRAPPED_FLAGS:
            setattr(self, flag, getattr(base, flag))

    @classmethod
    def row_expander(cls, params: Params) -> Optional[Callable]:
        """``expand(text, rng) -> extra rows``, applied to each row where the corpus is read (CompCSE's
        subsampling), or None. A picklable ``functools.partial``: its keywords are part of the run's
        data key, since they change the rows."""
        return None

    def setup(self, encoder: nn.Module) -> None:
        """Hook run once with the encoder before DDP wrapping (frozen copies, extra heads)."""

    def matryoshka_refusal(self) -> Optional[str]:
        """Why this objective, with these knobs, cannot be trained on nested prefixes of the embedding
        (raycse.objectives.matryoshka), or None."""
        return None

    def lora_refusal(self) -> Optional[str]:
        """Why this objective, with these knobs, cannot train LoRA adapters in place of the backbone's
        weights (raycse.model.adapters), or None."""
        return None

    def sharding_refusal(self) -> Optional[str]:
        """Why this objective cannot train a sharded model (``--sharding fsdp``: outside a block's forward its weights
        are each worker's shard, a ``DTensor``; an objective that reads weights directly must reduce across workers,
        as SG-OPT's regularizer does), or None."""
        return None

    def custom_lr(self) -> dict[str, float]:
        """Learning rates for this objective's own parameters, by name (e.g. a trainable tau)."""
        return {}

    def collate(self, texts: list[str], tokenizer, max_length: int) -> dict[str, Tensor]:
        raise NotImplementedError

    def forward(self, encoder: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        raise NotImplementedError

    def tokenize(self, texts: list[str], tokenizer, max_length: int, pairs_from: Optional[int] = None
                 ) -> dict[str, Tensor]:
        """Each text after its column's prompt (the pair column's from index ``pairs_from`` on, the
        text column's before); padded to the longest in the batch (up to a multiple of
        ``pad_multiple``); truncated (never failing) at ``max_length``."""
        cut = len(texts) if pairs_from is None else pairs_from
        prefixes = [(self.prompts.get("text", ""), texts[:cut]), (self.prompts.get("pair", ""), texts[cut:])]
        texts = [prefix + t for prefix, part in prefixes for t in part] if any(p for p, _ in prefixes) else texts
        enc = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt",
                        pad_to_multiple_of=self.pad_multiple if self.pad_multiple > 1 else None)
        return {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}

    @staticmethod
    def batch_size_of(batch: dict[str, Tensor]) -> int:
        return int(next(iter(batch.values())).shape[0])


def stack_twice(batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """(n, L) -> (2n, L): a batch's rows twice, so both dropout views (SimCSE) come from one encoder call with
    identical padding.

    Args:
        batch: the tokenized batch (``input_ids``, ``attention_mask``, ...), each (n, L).

    Returns:
        The same keys, each (2n, L): the rows, then the rows again.

    Raises:
        Nothing of its own.

    >>> import torch
    >>> stack_twice({"input_ids": torch.tensor([[1, 2]])})["input_ids"].tolist()
    [[1, 2], [1, 2]]
    """
    return {k: torch.cat([v, v], dim=0) for k, v in batch.items()}
