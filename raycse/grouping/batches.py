"""From a group order to the rows the train workers read: one row = one worker's batch.

Packing (:func:`pack`): groups are laid, in order, into the first of the last 64 open batches
with room for them (first fit), else into a new batch. Batches left short at the end are topped
up from the last short ones, which splits only those donors' groups (counted; none when the
group size divides the batch size and all groups are full). Consecutive batches form a step: batch ``b`` goes
to worker ``b % world_size`` at step ``b // world_size``. Only whole steps are kept, so every
worker runs the same number of steps (no DDP hang) and at most one global batch minus one
example is left out per epoch (the final partial step).

Rows (:func:`batch_rows`): the corpus rows are tagged with their batch and slot by a broadcast
lookup table, grouped by batch on the cluster (``groupby().map_groups``), sorted into step
order and split into one dataset per rank. Storing a whole batch per row is what keeps groups
intact: a row-per-sentence dataset is re-blocked and mixed on its way to the workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from raycse.grouping.strategies import GroupOrder

LOOKAHEAD = 64


@dataclass
class Packing:
    batches: np.ndarray  # (num_batches, batch_size) row ids; batch b -> step b // W, rank b % W
    split_groups: int
    dropped: int

    def steps(self, world_size: int) -> int:
        return len(self.batches) // world_size


def pack(order: GroupOrder, batch_size: int, world_size: int) -> Packing:
    groups = order.groups()
    bins: list[list[int]] = []
    open_bins: list[int] = []  # bins with room left, oldest first
    for g in groups:
        g = g.tolist()
        while len(g) > batch_size:  # cannot happen with validated configs; keep it total anyway
            bins.append(g[:batch_size])
            g = g[batch_size:]
        for k in open_bins[-LOOKAHEAD:]:
            if batch_size - len(bins[k]) >= len(g):
                bins[k].extend(g)
                if len(bins[k]) == batch_size:
                    open_bins.remove(k)
                break
        else:
            bins.append(g)
            if len(g) < batch_size:
                open_bins.append(len(bins) - 1)
    # Bins nobody could fill: top them up from the last ones (splitting only those donors' groups).
    partial = [k for k in range(len(bins)) if len(bins[k]) < batch_size]
    i, j = 0, len(partial) - 1
    while i < j:
        need = batch_size - len(bins[partial[i]])
        donor = bins[partial[j]]
        moved = donor[-need:]
        del donor[-need:]
        bins[partial[i]].extend(moved)
        if len(bins[partial[i]]) == batch_size:
            i += 1
        if not donor:
            j -= 1
    full = [b for b in bins if len(b) == batch_size]
    usable = (len(full) // world_size) * world_size
    arr = np.asarray(full[:usable], dtype=np.int64).reshape(usable, batch_size)
    batch_of = np.full(len(order.order), -1, dtype=np.int64)
    if arr.size:
        batch_of[arr.reshape(-1)] = np.repeat(np.arange(usable), batch_size)
    split = sum(len(set(batch_of[g].tolist()) - {-1}) > 1 for g in groups if len(g) > 1)
    return Packing(arr, int(split), len(order.order) - arr.size)


def pack_epoch(order: GroupOrder, batch_size: int, world_size: int,
               max_steps: Optional[int] = None) -> tuple[Packing, dict]:
    """One epoch's packing, cut to ``max_steps`` steps (the run's last epoch may be short), and the
    facts the epoch log reports: the one place both the driver's layouts and the in-fit regroup
    pack an order."""
    packing = pack(order, batch_size, world_size)
    n = len(order.order)
    if max_steps is not None and packing.steps(world_size) > max_steps:
        packing = Packing(packing.batches[:max_steps * world_size], packing.split_groups,
                          n - max_steps * world_size * batch_size)
    info = {**order.info, "split_groups": packing.split_groups, "dropped": packing.dropped,
            "groups": int(len(order.sizes)),
            "mean_group_size": float(order.sizes.mean()) if len(order.sizes) else 0.0}
    return packing, info

class _Tag:
    """map_batches: add each corpus row's (batch, slot) for this epoch; drop rows left out."""

    def __init__(self, slot_of):
        self.slot_of = slot_of

    def __call__(self, table):
        import pyarrow as pa
        import ray

        if not isinstance(self.slot_of, np.ndarray):
            self.slot_of = ray.get(self.slot_of)
        slots = self.slot_of[table["_id"].to_numpy()]
        keep = slots >= 0
        table = table.filter(pa.array(keep))
        return table.append_column("_slot", pa.array(slots[keep]))


def _to_row(batch_size: int, world_size: int, first_step: int, epoch: int):
    """map_groups: the rows of one batch (in slot order) -> one row holding the whole batch."""

    def to_row(group: dict) -> dict:
        order = np.argsort(group["_slot"])
        b = int(group["_slot"][0]) // batch_size
        row = {"step": np.array([first_step + b // world_size]), "rank": np.array([b % world_size]),
               "epoch": np.array([epoch]), "batch": np.array([b])}
        for col in ("text", "pair", "score", "negatives"):
            if col in group:
                cell = np.empty(1, dtype=object)
                cell[0] = group[col][order].tolist()
                row[col] = cell
        return row

    return to_row


def batch_rows(corpus_ds, packing: Packing, num_examples: int, world_size: int, first_step: int, epoch: int):
    """The epoch's batches as a Ray Dataset, one row per (step, rank), sorted by step then rank."""
    import ray

    bs = packing.batches.shape[1] if packing.batches.size else 1
    slot_of = np.full(num_examples, -1, dtype=np.int64)
    slot_of[packing.batches.reshape(-1)] = np.arange(packing.batches.size)
    tagged = corpus_ds.map_batches(_Tag(ray.put(slot_of)), batch_format="pyarrow", zero_copy_batch=False)
    keyed = tagged.map_batches(_add_batch_key(bs), batch_format="pyarrow")
    # Few partitions: Ray's default (200) costs seconds of scheduling for a few hundred batches.
    parts = max(1, min(16, len(packing.batches) // 256))
    rows = keyed.groupby("_b", num_partitions=parts).map_groups(_to_row(bs, world_size, first_step, epoch),
                                                                batch_format="numpy")
    # Known key range: give the sort its boundaries instead of letting it sample.
    # (batch = step * world_size + rank, so this is step order.)
    bounds = [len(packing.batches) * i // parts for i in range(1, parts)]
    return rows.sort("batch", boundaries=bounds or None)


def _add_batch_key(batch_size: int):
    def add(table):
        import pyarrow as pa

        return table.append_column("_b", pa.array(table["_slot"].to_numpy() // batch_size))

    return add


class preserve_order:
    """Run Ray Data with ``preserve_order`` on (map and union operators may reorder blocks otherwise)."""

    def __enter__(self):
        from ray.data import DataContext

        self.ctx = DataContext.get_current()
        self.before = self.ctx.execution_options.preserve_order
        self.ctx.execution_options.preserve_order = True
        return self

    def __exit__(self, *exc):
        self.ctx.execution_options.preserve_order = self.before
        return False


def split_by_rank(rows, world_size: int) -> dict:
    """One materialized dataset per rank (``rank0``, ``rank1``, ...), each in step order."""
    with preserve_order():
        return {f"rank{r}": _quiet(rows.filter(expr=f"rank == {r}").materialize()) for r in range(world_size)}


def _quiet(ds):
    """No progress bar when a Train worker iterates it: it has nothing left to compute, and the bar
    repeats itself in the worker's log at every step."""
    ds.context.enable_progress_bars = False
    return ds


def concat_epochs(per_epoch: list[dict]) -> dict:
    """Per-rank datasets of several epochs, one after the other, materialized in that order."""
    if len(per_epoch) == 1:
        return per_epoch[0]
    with preserve_order():
        return {name: _quiet(per_epoch[0][name].union(*[e[name] for e in per_epoch[1:]]).materialize())
                for name in per_epoch[0]}
