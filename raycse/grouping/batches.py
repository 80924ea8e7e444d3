"""From a group order to batches of row ids (one per worker and step).

Packing (:func:`pack`): groups are laid, in order, into the first of the last 64 open batches
with room for them (first fit), else into a new batch. Batches left short at the end are topped
up from the last short ones, which splits only those donors' groups (counted; none when the
group size divides the batch size and all groups are full). Consecutive batches form a step: batch ``b`` goes
to worker ``b % world_size`` at step ``b // world_size``. Only whole steps are kept, so every
worker runs the same number of steps (no DDP hang) and at most one global batch minus one
example is left out per epoch (the final partial step).

The batches reach the workers as row ids (:mod:`raycse.grouping.layout`): a batch is one row
of ids, so groups stay intact on the way.
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
    """First-fit packing (see the module doc); orders of equal groups that tile a batch (random and
    file orders: groups of one) are packed in one reshape, without a Python object per row."""
    sizes = order.sizes
    if len(sizes) and sizes.min() == sizes.max() and batch_size % int(sizes[0]) == 0:
        return _pack_tiling(order, batch_size, world_size)
    return _first_fit(order, batch_size, world_size)


def _pack_tiling(order: GroupOrder, batch_size: int, world_size: int) -> Packing:
    """What first fit gives when every group has the same size and tiles a batch: consecutive
    groups fill each batch in turn, the one short batch at the end is left out, nothing is split."""
    n = len(order.order)
    usable = (n // batch_size // world_size) * world_size
    arr = np.ascontiguousarray(order.order[:usable * batch_size], dtype=np.int64).reshape(usable, batch_size)
    return Packing(arr, 0, n - arr.size)


def _first_fit(order: GroupOrder, batch_size: int, world_size: int) -> Packing:
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
