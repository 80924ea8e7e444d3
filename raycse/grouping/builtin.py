"""raycse's own grouping strategies, each a :class:`~raycse.grouping.registry.Strategy` as a user's is, named in
:data:`raycse.config.grouping.STRATEGIES` and loaded through the same door (raycse.platform.plugins). The orders
themselves are :mod:`raycse.grouping.strategies`'s."""

from __future__ import annotations

import numpy as np

from raycse.grouping import strategies as orders
from raycse.grouping.registry import Strategy
from raycse.grouping.strategies import GroupOrder, epoch_rng

FAISS = {"faiss": "raycse[grouping]"}  # (the module, and what pip installs it by)


class Random(Strategy):
    """A seeded permutation, groups of one."""

    def order(self, cfg, n, seed, epoch, features):
        return orders.random_order(n, seed, epoch)


class FileOrder(Strategy):
    """The corpus's own order, groups of one (it was read without its pre-shuffle: BSC's "w/o shuffle")."""

    def order(self, cfg, n, seed, epoch, features):
        return GroupOrder(np.arange(n), np.ones(n, dtype=np.int64))


class Knn(Strategy):
    """Example-based shuffling over faiss neighbours of the current model's embeddings (BSC)."""

    features, requires = "embeddings", FAISS

    def order(self, cfg, n, seed, epoch, features):
        return orders.knn_order(features, cfg, seed, epoch)


class Cluster(Strategy):
    """Groups of one faiss k-means cluster of the embeddings, cut to ``group_size`` and shuffled."""

    features, requires = "embeddings", FAISS

    def order(self, cfg, n, seed, epoch, features):
        keys = orders.cluster_keys(features, cfg.clusters, cfg.group_size, seed + epoch)
        return orders.keyed_order(keys, cfg.group_size, epoch_rng(seed, epoch, 2))


class Shingle(Strategy):
    """Groups sharing a random content-word shingle (BSC's Algorithm 2)."""

    features = "shingles"

    def order(self, cfg, n, seed, epoch, features):
        return orders.keyed_order(features, cfg.group_size, epoch_rng(seed, epoch, 3))
