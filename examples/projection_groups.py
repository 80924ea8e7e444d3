"""A grouping strategy of your own, outside raycse: groups of examples that lie next to each other along
the embeddings' main direction, a one-dimensional, cheap cousin of BSC's kNN grouping (papers.md
section 6): the examples of a batch are alike, so its in-batch negatives are harder than a random batch's.

One epoch (seed s, epoch e), over the corpus's embeddings x_1..x_n (from the model being trained):

1. each x_i scaled to length 1, then the mean of them subtracted;
2. u = the unit eigenvector of the largest eigenvalue of C = sum_i x_i x_i^T (the first principal axis);
3. p_i = <x_i, u>, the rows sorted by p (ties broken by a draw seeded by (s, e));
4. the sorted rows cut into consecutive groups of grouping.group_size (the last one shorter);
5. the groups shuffled (seeded by (s, e)); raycse packs them into batches without splitting them.

Train with it, from the folder that holds this file on PYTHONPATH:

    PYTHONPATH=examples raycse train --grouping projection_groups:ProjectionGroups --group-size 8 ...

or register it under a short name from your own package's pyproject.toml:

    [project.entry-points."raycse.groupings"]
    projection = "my_pkg.projection_groups:ProjectionGroups"

What a strategy is: ``features`` (what ``order`` is given: "none", "embeddings" or "shingles") and
``order`` (-> every row id once, in groups), on ``raycse.api.Strategy``. With
``features = "embeddings"`` and ``grouping.regroup_every_epoch`` (the default) every training worker
regroups before each epoch with its current weights, so the module must import on every node.
"""

from __future__ import annotations

import numpy as np

from raycse.api import GroupOrder, Strategy


class ProjectionGroups(Strategy):
    features = "embeddings"

    def order(self, cfg, n, seed, epoch, features):
        rng = np.random.default_rng([seed, epoch, 7])
        x = np.asarray(features, dtype=np.float64)
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        x -= x.mean(axis=0)
        u = np.linalg.eigh(x.T @ x)[1][:, -1]  # (d x d: the corpus is read once, not held twice)
        order = np.lexsort((rng.random(n), x @ u))
        sizes = np.array([min(cfg.group_size, n - start) for start in range(0, n, cfg.group_size)], dtype=np.int64)
        groups = np.split(order, np.cumsum(sizes)[:-1])
        shuffled = rng.permutation(len(groups))
        return GroupOrder(np.concatenate([groups[g] for g in shuffled]) if n else order, sizes[shuffled],
                          {"projection_spread": float(np.ptp(x @ u)) if n else 0.0})
