"""The batch source: this rank's batches, one row per step, on one route for every batch order.

The batches are row ids (:class:`raycse.grouping.layout.Layout`, one per epoch), laid out by the
driver before the fit (``FitPlan.layouts``) or regrouped by the workers before every epoch with the
weights they hold (:mod:`raycse.train.regroup`); either way the rows come from the corpus, read once
per worker into a :class:`~raycse.grouping.layout.CorpusTable`. A row is one worker batch with its
``step`` and ``epoch``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from raycse.grouping.layout import CorpusTable, epoch_rows, row_examples
from raycse.grouping.mixing import source_of
from raycse.platform.ray_session import fetch
from raycse.train import ahead, regroup
from raycse.train.plan import FitPlan


def reference_rows(references: dict, ids, corpus_rows: int) -> dict:
    """Each reference's vectors of the batch's rows ``ids``: (n, d); a row's k hard negatives, (n * k, d)."""
    ids = np.asarray(ids, dtype=np.int64)
    out = {}
    for key, vectors in references.items():
        k = len(vectors) // max(corpus_rows, 1)
        rows = (ids[:, None] * k + np.arange(k)[None, :]).reshape(-1) if key.endswith(".negatives") else ids
        out[key] = torch.from_numpy(np.ascontiguousarray(vectors[rows]))
    return out


def record_batch(directory: Path, rank: int, step: int, epoch: int, examples: list) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"rank{rank}.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"step": step, "epoch": epoch, "time": time.time(), "pid": os.getpid(),
                             # a digest of the dropout stream: a resumed run must continue it exactly
                             "rng": int(torch.get_rng_state().to(torch.int64).sum()),
                             "examples": examples}) + "\n")


class BatchSource:
    """Rank ``rank``'s batches of ``plan``; ``engine`` (raycse.train.steps.StepEngine) embeds for
    in-fit regrouping. ``grouping``: the current epoch's regrouped layout (saved in checkpoints, so a
    restart mid-epoch trains on the same batches) and every epoch's grouping record."""

    def __init__(self, plan: FitPlan, rank: int, world_size: int, engine):
        self.plan, self.rank, self.world_size, self.engine = plan, rank, world_size, engine
        self.objective = engine.core.objective
        self.grouping = {"layout": None, "log": []}
        self.offsets = np.array([s.offset for s in plan.sources], dtype=np.int64)
        self._table, self._references = None, None

    def table(self) -> CorpusTable:
        """The corpus, read on first use (a fit resumed at its end reads nothing)."""
        if self._table is None:
            self._table = CorpusTable(fetch(list(self.plan.corpus), "the corpus's blocks"))
        return self._table

    def rows(self, start: int) -> Iterator[dict]:
        """Rows from step ``start`` on: the driver's layouts, or regrouped epoch by epoch in the fit."""
        p = self.plan
        if p.regroup_in_fit:
            build = lambda epoch, most: regroup.regroup_epoch(p, self.table(), self.engine, self.rank,  # noqa: E731
                                                              self.world_size, epoch, most)
            return regroup.regrouped_rows(build, self.table, p.run, self.rank, self.world_size, p.steps_per_epoch,
                                          p.total_steps, p.stop_at, start, self.grouping)
        layouts = fetch(p.layouts, "the batch layouts")
        return (row for layout in layouts
                for row in epoch_rows(self.table(), layout, self.rank, self.world_size,
                                      layout.epoch * p.steps_per_epoch, start))

    def step_rows(self, start: int) -> Iterator[dict]:
        """The rows of steps ``start`` .. ``stop_at - 1``, in order (earlier ones were done before the
        checkpoint this run resumed from)."""
        expected, stop = start, self.plan.stop_at
        if expected >= stop:
            return
        for row in self.rows(start):
            if int(row["step"]) < expected:
                continue
            if int(row["step"]) != expected:
                raise RuntimeError(f"rank {self.rank} expected the batch of step {expected}, got step {row['step']}")
            yield row
            expected += 1
            if expected >= stop:
                return

    def references(self) -> dict:
        """The teacher's and guide's vectors by row id (``teacher.text``, ...; a mixture's ``I/teacher.text`` by
        source I's own row ids), fetched once; {} without them."""
        if self._references is None:
            self._references = {key: fetch(ref, f"the {key.split('/')[-1].split('.')[0]}'s embeddings")
                                for key, ref in (self.plan.references or {}).items()}
        return self._references

    def collate(self, row: dict, tokenizer) -> tuple[list, dict]:
        """A row -> (its examples, the objective's batch of tensors, with the row's reference vectors)."""
        length, sources, ids = self.plan.run.model.max_length, self.plan.sources, np.asarray(row["ids"])
        if sources:  # a mixture: the batch's source collates it (its rows are of one source), with its references
            i = source_of(ids, self.offsets)
            examples = row_examples(row, sources[i].pairs, sources[i].negatives)
            batch = self.objective.collate_source(i, examples, tokenizer, length)
            refs = {k.split("/", 1)[1]: v for k, v in self.references().items() if k.startswith(f"{i}/")}
            ids, rows = ids - sources[i].offset, sources[i].rows  # (a source's references are by its own row ids)
        else:
            examples, refs, rows = row_examples(row), self.references(), None
            batch = self.objective.collate(examples, tokenizer, length)
        if refs:
            batch.update(reference_rows(refs, ids, rows if rows is not None else self.table().n))
        return examples, batch

    def looks_ahead(self, step: int, helper: ahead.CollateAhead) -> bool:
        """Whether the next step's row is fetched and collated during step ``step``: not across an
        in-fit regroup, which must embed with the weights of the epoch's last step."""
        crosses_regroup = self.plan.regroup_in_fit and (step + 1) % self.plan.steps_per_epoch == 0
        return helper.enabled and not crosses_regroup

    def record(self, step: int, epoch: int, examples: list) -> None:
        """train.record_batches: every rank's examples per step, for tests and audits."""
        if self.plan.run.train.record_batches:
            record_batch(Path(self.plan.run.train.record_batches), self.rank, step, epoch, examples)
