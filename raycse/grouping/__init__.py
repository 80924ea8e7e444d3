"""Batch construction: group orders (random, knn, shingle, cluster) packed into per-worker batch rows.

corpus (raycse.data.dataset) -> features (embed) -> group order (strategies, knn) -> batches.
:func:`epoch_batches` is the one entry point the train driver calls per epoch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from raycse.grouping.batches import Packing, batch_rows, pack_epoch, split_by_rank
from raycse.grouping.strategies import GroupOrder, group_order

log = logging.getLogger("raycse.grouping")


@dataclass
class EpochBatches:
    datasets: dict  # rank{r} -> materialized Ray Dataset of batch rows, in step order
    steps: int
    packing: Packing
    order: GroupOrder
    info: dict = field(default_factory=dict)


def epoch_batches(corpus, grouping, batch_size: int, world_size: int, seed: int, epoch: int, first_step: int,
                  vectors: Optional[Callable[[], np.ndarray]] = None, max_steps: Optional[int] = None) -> EpochBatches:
    """Group, pack and lay out one epoch of batches for ``world_size`` workers.

    ``vectors``: returns the corpus embeddings by row id (knn, cluster), e.g. :func:`embed_corpus`
    with the current model.
    """
    import time

    from raycse.grouping.embed import shingle_keys

    t0 = time.perf_counter()
    order = group_order(grouping, corpus.num_examples, seed, epoch, vectors=vectors,
                        shingles=lambda: shingle_keys(corpus, seed, epoch, grouping.shingle_size, grouping.by))
    packing, info = pack_epoch(order, batch_size, world_size, max_steps)
    rows = batch_rows(corpus.dataset, packing, corpus.num_examples, world_size, first_step, epoch)
    info["seconds"] = time.perf_counter() - t0
    log.info(f"[raycse] epoch {epoch}: {grouping.strategy} grouping, {info['groups']} groups "
             f"(mean size {info['mean_group_size']:.2f}), {packing.steps(world_size)} steps, "
             f"{packing.split_groups} group(s) split, {packing.dropped} example(s) left out")
    return EpochBatches(split_by_rank(rows, world_size), packing.steps(world_size), packing, order, info)
