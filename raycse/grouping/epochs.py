"""One epoch's batch order made by the driver before a fit: its strategy's group order (raycse.grouping.registry)
packed into batches of row ids (raycse.grouping.batches), and the planned epochs as the
:class:`~raycse.grouping.layout.Layout` list the train workers read their rows by
(:func:`raycse.grouping.layout.epoch_rows`)."""


from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from raycse.grouping.batches import Packing, pack_epoch
from raycse.grouping.layout import Layout
from raycse.grouping.registry import group_order
from raycse.grouping.strategies import GroupOrder

log = logging.getLogger("raycse.grouping")


@dataclass
class EpochPlan:
    """One epoch's group order packed into batches (row ids), before any Ray Data work."""
    epoch: int
    first_step: int
    packing: Packing
    order: GroupOrder
    info: dict = field(default_factory=dict)


def plan_epoch(corpus, grouping, batch_size: int, world_size: int, seed: int, epoch: int, first_step: int,
               vectors: Optional[Callable[[], np.ndarray]] = None, max_steps: Optional[int] = None) -> EpochPlan:
    """Group and pack one epoch for ``world_size`` workers.

    ``vectors``: returns the corpus embeddings by row id (knn, cluster), e.g. :func:`embed_corpus`
    with the current model.
    """
    import time

    from raycse.grouping.embed import shingle_keys

    t0 = time.perf_counter()
    order = group_order(grouping, corpus.num_examples, seed, epoch, vectors=vectors,
                        shingles=lambda: shingle_keys(corpus, seed, epoch, grouping.shingle_size, grouping.by))
    packing, info = pack_epoch(order, batch_size, world_size, max_steps)
    info["seconds"] = time.perf_counter() - t0
    log.info(f"[raycse] epoch {epoch}: {grouping.strategy} grouping, {info['groups']} groups "
             f"(mean size {info['mean_group_size']:.2f}), {packing.steps(world_size)} steps, "
             f"{packing.split_groups} group(s) split, {packing.dropped} example(s) left out")
    return EpochPlan(epoch, first_step, packing, order, info)


def layouts(plans: list[EpochPlan]) -> list[Layout]:
    """The planned epochs as the layouts a fit's workers read (FitPlan.layouts)."""
    return [Layout(p.epoch, p.packing.batches, p.info) for p in plans]
