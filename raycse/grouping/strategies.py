"""Grouping strategies: which examples share a batch (papers.md section 6, BSC).

Each strategy returns a *group order* for one epoch: ``order`` (every row id once) and
``sizes`` (consecutive group lengths in ``order``). :mod:`raycse.grouping.batches` packs the
groups into batches without splitting them.

- ``random``: a seeded permutation, groups of one.
- ``none``: the corpus's file order, groups of one (BSC's "w/o shuffle" ablation).
- ``knn``: example-based shuffling over faiss neighbours of the current model's embeddings.
- ``shingle``: key = a random subset of ``shingle_size`` content words of the example; sort by key, a new group whenever
  the key changes or the group is full (BSC's Algorithm 2), shuffle the groups.
- ``cluster``: key = faiss k-means cluster of the embedding; same cut and shuffle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from raycse.grouping import knn as knn_search
from raycse.platform.machine import import_faiss

STOPWORDS = frozenset("""a about above after again against all also am an and any are as at be because been before
being below between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most my myself no nor
not now of off on once only or other our ours ourselves out over own same she should so some such than that the
their theirs them themselves then there these they this those through to too under until up very was we were what
when where which while who whom why will with would you your yours yourself yourselves one two three first
new may many most much""".split())
WORD = re.compile(r"[^\W\d_]+", re.UNICODE)


@dataclass
class GroupOrder:
    """One epoch's grouping: the row ids in order, cut into consecutive groups that are packed into batches whole.

    Args:
        order: every row id once.
        sizes: the groups' lengths, in order, summing to ``len(order)``.
        info: facts the epoch's log reports (e.g. a kNN search's recall).

    Returns:
        ``groups()`` returns the groups as arrays of row ids.

    Raises:
        Nothing itself; raycse.grouping.registry refuses a user strategy's order that loses or repeats a row.

    >>> GroupOrder(np.array([2, 0, 1]), np.array([1, 2])).groups()
    [array([2]), array([0, 1])]
    """

    order: np.ndarray  # row ids, each once
    sizes: np.ndarray  # group lengths, summing to len(order)
    info: dict = field(default_factory=dict)

    def groups(self) -> list[np.ndarray]:
        return np.split(self.order, np.cumsum(self.sizes)[:-1])


def epoch_rng(seed: int, epoch: int, salt: int = 0) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, salt])


def random_order(n: int, seed: int, epoch: int) -> GroupOrder:
    return GroupOrder(epoch_rng(seed, epoch).permutation(n), np.ones(n, dtype=np.int64))


def knn_order(vectors: np.ndarray, cfg, seed: int, epoch: int) -> GroupOrder:
    x = knn_search.normalize(vectors)  # once: the search and the duplicate check read the same copy
    res = knn_search.search(x, cfg.neighbours, cfg.search, cfg.exact_threshold, cfg.nlist, cfg.nprobe,
                            cfg.shards, cfg.recall_sample, seed=seed + epoch, assume_normalized=True,
                            cell_size=cfg.cell_size, neighbour_cells=cfg.neighbour_cells)
    groups = knn_search.greedy_groups(res.neighbours, cfg.group_size, epoch_rng(seed, epoch, 1),
                                      identical=x if cfg.drop_identical else None)
    info = {"knn_method": res.method, "knn_seconds": res.seconds, "knn_recall": res.recall}
    return GroupOrder(np.concatenate(groups), np.array([len(g) for g in groups], dtype=np.int64), info)


def keyed_order(keys: np.ndarray, group_size: int, rng: np.random.Generator) -> GroupOrder:
    """BSC's Algorithm 2 (shuffling by words; by clusters with t = 1): sort by key (random
    tie-break), walk the sorted list starting a new group whenever the key changes or the current
    group has reached ``group_size``, then shuffle the groups. No group mixes keys; only a key run
    longer than ``group_size`` is split."""
    n = len(keys)
    order = np.lexsort((rng.random(n), keys))
    sorted_keys = np.asarray(keys)[order]
    run_starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]) if n else np.zeros(0, np.int64)
    run_lengths = np.diff(np.r_[run_starts, n])
    sizes = np.array([s for r in run_lengths for s in [group_size] * (r // group_size) + [r % group_size] if s],
                     dtype=np.int64)
    starts = np.r_[0, np.cumsum(sizes)[:-1]] if len(sizes) else sizes
    perm = rng.permutation(len(sizes))
    order = np.concatenate([order[starts[g]:starts[g] + sizes[g]] for g in perm]) if n else order
    return GroupOrder(order, sizes[perm])


def shingle_key(text: str, seed: int, epoch: int, row_id: int, size: int = 1) -> int:
    """Hash of a random subset of ``size`` distinct content words of ``text`` (BSC's shingle, t =
    ``size``; the set, so word order does not matter); a random, unique key when it has fewer."""
    from raycse.data.corpus import text_key

    words = sorted({w for w in WORD.findall(text.lower()) if len(w) > 2 and w not in STOPWORDS})
    rng = np.random.default_rng([seed, epoch, row_id])
    if len(words) < size or not words:
        return int(rng.integers(1 << 62)) | (1 << 62)  # its own group: no shared shingle to group by
    picked = sorted(words[i] for i in rng.choice(len(words), size=size, replace=False))
    return text_key(" ".join(picked))


def cluster_keys(vectors: np.ndarray, k: Optional[int], group_size: int, seed: int) -> np.ndarray:
    faiss = import_faiss()

    x = knn_search.normalize(vectors).astype(np.float32, copy=False)  # faiss's k-means reads float32
    n = len(x)
    k = int(min(n, k or max(1, min(4096, n // max(4 * group_size, 40)))))  # faiss wants >= 39 points per centroid
    km = faiss.Kmeans(x.shape[1], k, niter=20, seed=seed, spherical=True, max_points_per_centroid=256)
    km.train(x)
    _, assign = km.index.search(x, 1)
    return assign[:, 0].astype(np.int64)
