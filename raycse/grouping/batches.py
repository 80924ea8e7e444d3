"""From a group order to the rows the train workers read: one row = one worker's batch.

Packing (:func:`pack`): groups are laid, in order, into the first of the last 64 open batches
with room for them (first fit), else into a new batch. Batches left short at the end are topped
up from the last short ones, which splits only those donors' groups (counted; none when the
group size divides the batch size and all groups are full). Consecutive batches form a step: batch ``b`` goes
to worker ``b % world_size`` at step ``b // world_size``. Only whole steps are kept, so every
worker runs the same number of steps (no DDP hang) and at most one global batch minus one
example is left out per epoch (the final partial step).

Rows (:func:`batch_rows`): the corpus rows are tagged with their batch and slot by a broadcast
lookup table (one copy per epoch), grouped by batch on the cluster (``groupby().map_groups``),
sorted into step order and split into one dataset per rank, every epoch in one pass. Storing a
whole batch per row is what keeps groups intact: a row-per-sentence dataset is re-blocked and
mixed on its way to the workers.
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
    """map_batches: one copy of each corpus row per epoch it is trained in, with its global slot
    (``slot_of[e, row]``: the epoch's batch offset * batch size + its slot, -1 when left out)."""

    def __init__(self, slot_of):
        self.slot_of = slot_of

    def __call__(self, table):
        import pyarrow as pa
        import ray

        if not isinstance(self.slot_of, np.ndarray):
            self.slot_of = ray.get(self.slot_of)
        ids = table["_id"].to_numpy()
        copies = []
        for epoch_slots in self.slot_of:
            slots = epoch_slots[ids]
            keep = slots >= 0
            copies.append(table.filter(pa.array(keep)).append_column("_slot", pa.array(slots[keep])))
        return pa.concat_tables(copies)


def _to_row(batch_size: int, world_size: int, offsets: np.ndarray, first_steps: list[int], epochs: list[int]):
    """map_groups: the rows of one batch (in slot order) -> one row holding the whole batch.
    Global batch ``g`` is batch ``g - offsets[i]`` of the i-th epoch laid out."""

    def to_row(group: dict) -> dict:
        order = np.argsort(group["_slot"])
        g = int(group["_slot"][0]) // batch_size
        i = int(np.searchsorted(offsets, g, side="right")) - 1
        b = g - int(offsets[i])
        row = {"step": np.array([first_steps[i] + b // world_size]), "rank": np.array([b % world_size]),
               "epoch": np.array([epochs[i]]), "batch": np.array([g])}
        for col in ("text", "pair", "score", "negatives"):
            if col in group:
                cell = np.empty(1, dtype=object)
                cell[0] = group[col][order].tolist()
                row[col] = cell
        return row

    return to_row


def batch_rows(corpus_ds, packings: list[Packing], num_examples: int, world_size: int, first_steps: list[int],
               epochs: list[int]):
    """Several epochs' batches as one Ray Dataset, one row per (step, rank), sorted by step then rank.

    All epochs in one pass (one tagging map, one groupby, one sort): a pass costs ~7 s of Ray Data
    scheduling on 2 cores whatever its size, and small corpora are trained for many epochs."""
    import ray

    bs = next((p.batches.shape[1] for p in packings if p.batches.size), 1)
    counts = [len(p.batches) for p in packings]
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    slot_of = np.full((len(packings), num_examples), -1, dtype=np.int64)
    for e, p in enumerate(packings):
        slot_of[e, p.batches.reshape(-1)] = offsets[e] * bs + np.arange(p.batches.size)
    tagged = corpus_ds.map_batches(_Tag(ray.put(slot_of)), batch_format="pyarrow", zero_copy_batch=False)
    keyed = tagged.map_batches(_add_batch_key(bs), batch_format="pyarrow")
    total = int(sum(counts))
    # Few partitions: Ray's default (200) costs seconds of scheduling for a few hundred batches.
    parts = max(1, min(16, total // 256))
    rows = keyed.groupby("_b", num_partitions=parts).map_groups(
        _to_row(bs, world_size, offsets, list(first_steps), list(epochs)), batch_format="numpy")
    # Known key range: give the sort its boundaries instead of letting it sample.
    # (global batch = epochs laid out one after the other, each step * world_size + rank: step order)
    bounds = [total * i // parts for i in range(1, parts)]
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
        if world_size > 1:
            rows = rows.materialize()  # else each rank's filter runs the whole groupby and sort again
        return {f"rank{r}": _quiet(rows.filter(expr=f"rank == {r}").materialize()) for r in range(world_size)}


def _quiet(ds):
    """No progress bar when a Train worker iterates it: it has nothing left to compute, and the bar
    repeats itself in the worker's log at every step."""
    ds.context.enable_progress_bars = False
    return ds
