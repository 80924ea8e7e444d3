"""Batch orders: which examples each worker sees at each step.

One global permutation per (seed, epoch); global step ``s`` takes the next
``batch_size * world_size`` examples and worker ``r`` takes slice ``r`` of it. Every worker
therefore runs the same number of steps (no DDP hang), the concatenation of the local batches
in rank order is exactly the global batch (what the gathered loss assumes), and a run is
reproducible for a given seed. The final partial global batch of an epoch is dropped.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np


def steps_per_epoch(num_examples: int, batch_size: int, world_size: int) -> int:
    return num_examples // (batch_size * world_size)


def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


def global_batches(num_examples: int, batch_size: int, world_size: int, seed: int, epoch: int) -> Iterator[np.ndarray]:
    order = epoch_order(num_examples, seed, epoch)
    g = batch_size * world_size
    for s in range(steps_per_epoch(num_examples, batch_size, world_size)):
        yield order[s * g:(s + 1) * g]


def worker_batches(num_examples: int, batch_size: int, world_size: int, rank: int, seed: int,
                   epoch: int) -> Iterator[np.ndarray]:
    for batch in global_batches(num_examples, batch_size, world_size, seed, epoch):
        yield batch[rank * batch_size:(rank + 1) * batch_size]
