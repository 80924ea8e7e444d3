"""A fit's batches as row ids, and the corpus they index: the one route from a batch order to the
train workers.

A :class:`Layout` is one epoch's batches (``num_batches x batch_size`` row ids; batch ``b`` goes to
rank ``b % W`` at the epoch's step ``b // W``). The driver lays out fixed orders (random, shingle,
none, and knn/cluster grouped once) before the fit; knn/cluster regrouped every epoch are laid out
by the workers with their current weights (:mod:`raycse.train.regroup`). Either way each worker reads
the numbered corpus's blocks once, from the object store, into a :class:`CorpusTable` (Arrow
columns, ~the corpus's UTF-8 size) and takes its batches' rows from it with :func:`epoch_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

COLUMNS = ("text", "pair", "score", "negatives")
LAYOUT_FILE = "layout.npz"


class CorpusTable:
    """Every example's columns by row id (``_id``), from the numbered corpus's Arrow ``tables`` (its
    blocks, :attr:`raycse.data.dataset.Corpus.blocks`): any batch may hold examples from anywhere in the corpus."""

    def __init__(self, tables: list):
        import pyarrow as pa
        import pyarrow.compute as pc

        tables = [t for t in tables if t.num_rows]
        table = (pa.concat_tables(tables, promote_options="default") if tables
                 else pa.table({"_id": pa.array([], pa.int64())}))
        table = table.take(pc.sort_indices(table["_id"]))
        self.n = table.num_rows
        self.columns = {c: table[c].combine_chunks() for c in COLUMNS if c in table.column_names}

    def values(self, column: str, start: int = 0, step: int = 1, stop: Optional[int] = None) -> list:
        """Rows ``start:stop:step`` of one column, as Python values."""
        return self.columns[column].take(np.arange(start, self.n if stop is None else stop, step)).to_pylist()

    def row(self, ids: np.ndarray, step: int, epoch: int) -> dict:
        """One batch as the loop reads it: its step and epoch, its row ids, and a list per column."""
        import pyarrow as pa

        index = pa.array(np.asarray(ids, dtype=np.int64))
        return {"step": step, "epoch": epoch, "ids": np.asarray(ids, dtype=np.int64),
                **{c: col.take(index).to_pylist() for c, col in self.columns.items()}}


@dataclass
class Layout:
    epoch: int
    batches: np.ndarray  # (num_batches, batch_size) row ids; batch b -> step first + b // world, rank b % world
    info: dict = field(default_factory=dict)

    def save(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        np.savez(state_dir / LAYOUT_FILE, epoch=np.array([self.epoch]), batches=self.batches)

    @staticmethod
    def load(state_dir: Path) -> Optional["Layout"]:
        path = state_dir / LAYOUT_FILE
        if not path.is_file():
            return None
        with np.load(path, allow_pickle=False) as z:
            return Layout(int(z["epoch"][0]), z["batches"].astype(np.int64))


def epoch_rows(table: CorpusTable, layout: Layout, rank: int, world: int, first_step: int,
               from_step: int = 0) -> Iterator[dict]:
    """Rank ``rank``'s rows of ``layout`` (its epoch starting at ``first_step``), from ``from_step`` on."""
    for b in range(rank, len(layout.batches), world):
        step = first_step + b // world
        if step >= from_step:
            yield table.row(layout.batches[b], step, layout.epoch)


def row_examples(row: dict, pairs: Optional[bool] = None, negatives: Optional[bool] = None) -> list:
    """One dataset row (a whole batch) -> the examples the objective collates: texts or pairs (with hard
    negatives): as a mixture's source says, else as the row's columns say."""
    from raycse.objectives.base import Pair

    texts = list(row["text"])
    if not (("pair" in row) if pairs is None else pairs):
        return texts
    scores = [None if s is None or s != s else float(s) for s in row["score"]]
    if ("negatives" in row) if negatives is None else negatives:  # triplets: hard negatives with each pair
        return [Pair(t, p, s, tuple(n)) for t, p, s, n in zip(texts, list(row["pair"]), scores, list(row["negatives"]))]
    return [Pair(t, p, s) for t, p, s in zip(texts, list(row["pair"]), scores)]
