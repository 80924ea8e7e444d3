"""A teacher and a guide around any objective: what the step adds to the objective's loss and mask.

``--teacher MODEL`` adds a distillation term (:mod:`raycse.objectives.distill`), ``--guide MODEL|initial``
masks guided negatives (:mod:`raycse.objectives.guide`). Both read reference vectors, a model's
embeddings of the batch's sentences computed once per corpus (:mod:`raycse.grouping.references`) and
handed to the step with the batch under ``teacher.COLUMN`` and ``guide.COLUMN`` (COLUMN: ``text``,
``pair``, ``negatives``).

What the teacher is compared with: the student's embedding of the batch's own sentences, as the objective
computed it. The encoder calls the objective makes are recorded (:class:`Recorder`); the rows of a call
whose tokens are the sentences' (SimCSE's first dropout view, a pair's first and second texts, its hard
negatives; HiCL's whole-sequence pass; LA(SER)^3's anchor, the sentence as written) are the student's
embeddings. An objective that never embeds the sentences as they are (CompCSE, which embeds halves) gets one
more encoder pass of them: the teacher always embeds the whole sentence (never HiCL's slices, LA(SER)^3's
elongated views or CompCSE's halves), and the student is distilled on the whole sentence too. The place found
is kept per batch shape, so later steps read it without comparing tokens again (no wait for the device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from raycse.errors import ConfigError
from raycse.objectives.base import LossOutput, Objective, Pair
from raycse.objectives.distill import kl_term, margin_mse_term, mse_term
from raycse.objectives.guide import Guide, guided

COLUMNS = ("text", "pair", "negatives")
STUDENT = "distill."  # the student's tokens of a column, as the batch carries them: distill.COLUMN.input_ids
REFERENCES = ("teacher.", "guide.")
# what a step says of its teacher and guide (raycse.train.reporter, every train.log_steps)
NOTES = {"guide_masked": "guide masked {:.1%} of negatives", "distill": "distill {:.4f}"}


@dataclass(frozen=True)
class ReferenceSpec:
    """What the step adds: ``distill`` (kl, mse, margin_mse; None: no teacher) with its weight and the two
    temperatures of ``kl``; ``guide`` with GISTEmbed's ``margin``."""

    distill: Optional[str] = None
    weight: float = 1.0
    student_tau: float = 0.05
    teacher_tau: float = 0.05
    guide: bool = False
    margin: float = 0.0

    def teacher_columns(self, pairs: bool, negatives: bool) -> tuple[str, ...]:
        """The columns the teacher embeds for this data."""
        if self.distill is None:
            return ()
        return ("text", "pair", "negatives") if self.distill == "margin_mse" else ("text", "pair") if pairs else ("text",)

    def guide_columns(self, pairs: bool, negatives: bool) -> tuple[str, ...]:
        if not self.guide:
            return ()
        return ("text",) + (("pair",) if pairs else ()) + (("negatives",) if pairs and negatives else ())


def step_notes(metrics: dict) -> tuple[dict, str]:
    """A step's guide and teacher figures from its metrics (a read of the device): as numbers, and as the
    step line's ending."""
    notes = {k: float(metrics[k]) for k in NOTES if k in metrics}
    return notes, "".join(f"; {NOTES[k].format(v)}" for k, v in notes.items())


class Recorder:
    """The encoder as the objective sees it, with every call's tokens and embeddings kept."""

    def __init__(self, encoder: nn.Module):
        self._encoder, self.calls = encoder, []

    def __getattr__(self, name):  # tokenizer, hidden_size, pooled, head, forward_options, ...
        return getattr(self._encoder, name)

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Optional[Tensor] = None) -> Tensor:
        z = self._encoder(input_ids, attention_mask, token_type_ids)
        self.calls.append((input_ids, attention_mask, z))
        return z

    def forward(self, *args, **kwargs) -> Tensor:
        return self(*args, **kwargs)


def rows_of(ids: Tensor, mask: Tensor, want_ids: Tensor, want_mask: Tensor) -> Optional[int]:
    """The first row where ``want_ids`` (n, w) sit in the recorded call's ``ids`` (N, W >= w), at a multiple of n
    (the rest of each row padding), or None."""
    n, w = want_ids.shape
    if ids.shape[1] < w:
        return None
    for start in range(0, ids.shape[0] - n + 1, n):
        block, block_mask = ids[start:start + n], mask[start:start + n]
        if (torch.equal(block[:, :w], want_ids) and torch.equal(block_mask[:, :w], want_mask)
                and not block_mask[:, w:].any()):
            return start
    return None


class WithReferences(Objective):
    """``base`` with the teacher's term added and the guide's mask in force (module docstring)."""

    name = "references"

    def __init__(self, base: Objective, spec: ReferenceSpec):
        if spec.guide and not base.guided_negatives:
            raise ConfigError(f"a guide (model.guide) masks the in-batch negatives of raycse's InfoNCE, which objective "
                              f"'{base.name}' does not score its negatives with; use simcse, compcse or laser, or "
                              f"drop --guide")
        super().__init__(base.params)
        self.base, self.spec = base, spec
        self.places: dict = {}  # (batch shapes) -> where each column's student rows are
        self.flags_of(base)

    def setup(self, encoder: nn.Module) -> None:
        self.base.setup(encoder)

    def matryoshka_refusal(self) -> Optional[str]:
        return self.base.matryoshka_refusal()

    def lora_refusal(self) -> Optional[str]:
        return self.base.lora_refusal()

    def custom_lr(self) -> dict[str, float]:
        return {f"base.{k}": v for k, v in self.base.custom_lr().items()}

    def collate(self, examples, tokenizer, max_length):
        batch = self.base.collate(examples, tokenizer, max_length)
        if self.spec.distill is None:
            return batch
        pairs = None if isinstance(examples[0], str) else [Pair(*e) for e in examples]
        columns = {"text": list(examples) if pairs is None else [p.query for p in pairs]}
        if pairs is not None:
            columns["pair"] = [p.positive for p in pairs]
            if self.spec.distill == "margin_mse":
                columns["negatives"] = [t for p in pairs for t in p.negatives]
        for column, texts in columns.items():  # (each column's prompt, as the objective's own collate puts it)
            tokens = self.tokenize(texts, tokenizer, max_length, pairs_from=None if column == "text" else 0)
            batch.update({f"{STUDENT}{column}.{k}": v for k, v in tokens.items()})
        return batch

    def forward(self, encoder, batch) -> LossOutput:
        inner = {k: v for k, v in batch.items() if not k.startswith((STUDENT, *REFERENCES))}
        guide = self._guide(batch)
        recorder = Recorder(encoder) if self.spec.distill else encoder
        with guided(guide):
            out = self.base(recorder, inner)
        loss, metrics = out.loss, dict(out.metrics)
        if guide is not None and (fraction := guide.fraction()) is not None:
            metrics["guide_masked"] = fraction.detach()
        if self.spec.distill:
            term = self._distill(recorder, encoder, batch)
            loss = loss + self.spec.weight * term
            metrics["distill"] = term.detach()
        return LossOutput(loss, metrics)

    def _guide(self, batch: dict) -> Optional[Guide]:
        if not self.spec.guide:
            return None
        return Guide(batch["guide.text"], self.spec.margin, batch.get("guide.pair"), batch.get("guide.negatives"))

    def _student(self, recorder: Recorder, encoder, batch: dict, column: str) -> Tensor:
        """The student's embeddings of ``column``'s sentences: rows of a call the objective made, else a pass now."""
        tokens = {k[len(STUDENT) + len(column) + 1:]: v for k, v in batch.items() if k.startswith(f"{STUDENT}{column}.")}
        key = (column, tuple(tuple(c[0].shape) for c in recorder.calls), tuple(tokens["input_ids"].shape))
        if key not in self.places:
            self.places[key] = next(((i, start) for i, (ids, mask, _) in enumerate(recorder.calls)
                                     if (start := rows_of(ids, mask, tokens["input_ids"], tokens["attention_mask"]))
                                     is not None), None)
        place = self.places[key]
        if place is None:
            return encoder(**tokens)
        i, start = place
        return recorder.calls[i][2][start:start + tokens["input_ids"].shape[0]]

    def _distill(self, recorder: Recorder, encoder, batch: dict) -> Tensor:
        spec, pairs = self.spec, "teacher.pair" in batch
        s = {c: self._student(recorder, encoder, batch, c) for c in COLUMNS if f"{STUDENT}{c}.input_ids" in batch}
        t = {c: batch[f"teacher.{c}"] for c in COLUMNS if f"teacher.{c}" in batch}
        if spec.distill == "kl":
            return kl_term(s["text"], t["text"], s.get("pair") if pairs else None, t.get("pair"), spec.student_tau,
                           spec.teacher_tau)
        if spec.distill == "mse":
            return mse_term([s[c] for c in t], [t[c] for c in t])
        n = s["text"].shape[0]
        return margin_mse_term(s["text"], s["pair"], s["negatives"].reshape(n, -1, s["text"].shape[-1]),
                               t["text"], t["pair"], t["negatives"].reshape(n, -1, t["text"].shape[-1]))
