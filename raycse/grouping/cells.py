"""All-pairs kNN whose cost grows linearly with N: a cell join.

Grouping needs every example's neighbours among all examples, not answers to outside queries.
So instead of N single-query searches (IVF: each query scans ``nprobe`` lists, costing
~N^1.5 once lists grow with sqrt(N)), the vectors are cut into cells of a fixed size and each
cell is joined, as one matrix product, with its nearest cells:

1. **Partition**: k-means cuts the vectors into coarse clusters, and each coarse cluster is cut
   into cells of ~``cell_size`` rows (at most 1.5x it) by halving it, again and again, at its members'
   median along their principal direction. Every vector belongs to exactly one cell, and every
   cell has about the same size: a join costs |cell| x |its near cells|, and k-means cells come out
   uneven (rich get richer: at 4M vectors the largest held 24x the mean). The coarse count is
   held at ``COARSE_MAX`` for large N, so assigning rows to it grows as N and the halving as
   N log N.
2. **Join**: cell ``c``'s members ``Q`` are compared with the members ``U`` of the
   ``neighbour_cells`` cells whose centroids are nearest ``c``'s (``c`` included):
   ``S = Q U^T`` and the top-``k`` of each row. Per example that is ``neighbour_cells *
   cell_size`` inner products: constant in N. Cells are independent, so with ``shards > 1``
   they are split over Ray tasks (the vectors travel once, through the object store).

Greedy grouping needs good neighbours, not exact ones; ``knn.search`` measures recall against
exact search on a sample and reports it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from raycse.grouping.vectors import as_float32, float32_chunks, id_dtype
from raycse.platform.machine import import_faiss

log = logging.getLogger("raycse.grouping")

KMEANS_ITERATIONS = 10  # faiss's default is 25; coarse clusters only have to be compact, not optimal
POINTS_PER_CENTROID = 20  # k-means sample per centroid (faiss asks 39 for optimal centroids; these need not be)
JOIN_ROWS = 2048  # query rows per matrix product (bounds the score block's memory)
CELLS_PER_COARSE = 2  # cells a coarse cluster holds, within the bounds below (more: easier batches at 100k)
COARSE_MIN = 256  # coarse clusters at least (or one per cell below that)
COARSE_MAX = 1024  # and at most: assigning N rows to C of them costs N x C
COARSE_AROUND = 4  # a cell's near cells are looked for among at least this many coarse clusters around its own
NEAR_CHOICE = 32  # a cell's near cells are chosen among ~this many times as many candidate cells
POWER_STEPS = 2  # power iterations for a cut's principal direction (a rough one cuts as well)


@dataclass(frozen=True)
class Cells:
    """A partition of N vectors: ``order`` lists the rows cell by cell, cell ``c``'s rows are
    ``order[bounds[c]:bounds[c + 1]]``; ``near[c]`` are the cells it is joined with (-1: none)."""

    order: np.ndarray
    bounds: np.ndarray
    near: np.ndarray

    @property
    def count(self) -> int:
        return len(self.bounds) - 1

    def members(self, c: int) -> np.ndarray:
        return self.order[self.bounds[c]:self.bounds[c + 1]]


def _kmeans(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """``k`` unit-norm centroids of normalised ``x``, trained on <= ``POINTS_PER_CENTROID * k`` rows."""
    faiss = import_faiss()

    k = max(1, min(k, len(x)))
    rng = np.random.default_rng(seed)
    sample = x if len(x) <= k * POINTS_PER_CENTROID else x[np.sort(rng.choice(len(x), k * POINTS_PER_CENTROID,
                                                                            replace=False))]
    km = faiss.Kmeans(x.shape[1], k, niter=KMEANS_ITERATIONS, seed=seed, spherical=True, verbose=False,
                      min_points_per_centroid=1)
    km.train(as_float32(sample))
    return km.centroids


def _nearest(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Each row's nearest centroid (float16 rows are read a chunk at a time in float32)."""
    faiss = import_faiss()

    ids = np.empty(len(x), dtype=np.int64)
    for start, rows in float32_chunks(x):
        ids[start:start + len(rows)] = faiss.knn(rows, centroids, 1, metric=faiss.METRIC_INNER_PRODUCT)[1][:, 0]
    return ids


def _sort_by(ids: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, bounds): positions of ``ids`` (1-d, values in ``range(count)``) sorted by id, stable;
    id ``i``'s positions are ``order[bounds[i]:bounds[i + 1]]``. One sort, not ``count`` scans."""
    order = np.argsort(ids, kind="stable")
    return order, np.searchsorted(ids[order], np.arange(count + 1))


def coarse_count(n_cells: int) -> int:
    """Coarse clusters for ``n_cells`` cells: ~``CELLS_PER_COARSE`` cells each, at least
    ``COARSE_MIN`` (a small corpus's coarse clusters stay topical), at most ``COARSE_MAX``."""
    return int(min(max(round(n_cells / CELLS_PER_COARSE), min(n_cells, COARSE_MIN)), COARSE_MAX))


def partition(x: np.ndarray, cell_size: int, neighbour_cells: int, seed: int = 0) -> Cells:
    """Cut normalised ``x`` (float32 or float16) into cells of ~``cell_size`` rows (at most 1.5x
    it), coarse cluster by coarse cluster (k-means, then :func:`_halve`), and find each cell's
    ``neighbour_cells`` nearest cells by the centroid of its members."""
    n = x.shape[0]
    n_cells = max(1, round(n / cell_size))
    coarse = _kmeans(x, coarse_count(n_cells), seed)
    coarse_order, coarse_bounds = _sort_by(_nearest(x, coarse), len(coarse))
    rng = np.random.default_rng(seed)
    pieces, subs = [], []
    for i in range(len(coarse)):
        rows = coarse_order[coarse_bounds[i]:coarse_bounds[i + 1]]
        centroids = []
        if len(rows):
            # one copy of the cluster; the cuts index it locally. numpy's cast, not torch's: torch's
            # threads would then spin against numpy's BLAS in the cuts
            v = x[rows].astype(np.float32)
            for local in _halve(v, max(1, round(len(rows) / cell_size)), rng):
                pieces.append(rows[local])
                centroids.append(_unit(v[local].mean(axis=0)))
        subs.append(np.asarray(centroids, dtype=np.float32).reshape(len(centroids), x.shape[1]))
    sizes = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    first = np.cumsum([0] + [len(sub) for sub in subs])
    return Cells(np.concatenate(pieces), np.concatenate([[0], np.cumsum(sizes)]),
                 _near_cells(coarse, subs, first, neighbour_cells))


def _unit(v: np.ndarray) -> np.ndarray:
    return v / max(float(np.linalg.norm(v)), 1e-12)


def _halve(v: np.ndarray, pieces: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Row positions of ``v`` cut into ``pieces`` parts of equal size (+-1): a part meant for p
    pieces is split at the (p // 2) / p quantile of its members' projections on their principal
    direction (found by power iteration on the centred rows, without centring a copy)."""
    done, todo = [], [(np.arange(len(v)), pieces)]
    while todo:
        part, p = todo.pop()
        if p <= 1:
            done.append(part)
            continue
        w = v[part]
        mean = w.mean(axis=0)
        direction = rng.standard_normal(v.shape[1]).astype(np.float32)
        for _ in range(POWER_STEPS):
            projected = w @ direction - float(mean @ direction)
            direction = _unit(w.T @ projected - mean * float(projected.sum()))
        left = p // 2
        cut = round(len(part) * left / p)
        split = np.argpartition(w @ direction, cut)
        todo += [(part[split[:cut]], left), (part[split[cut:]], p - left)]
    return done


def _near_cells(coarse: np.ndarray, subs: list, first: np.ndarray, neighbour_cells: int) -> np.ndarray:
    """Each cell's ``neighbour_cells`` nearest cells by centroid, itself included, looked for among
    the cells of the coarse clusters nearest its own (at least ``COARSE_AROUND + 1`` of them, and
    ~``NEAR_CHOICE * neighbour_cells`` cells), not among all cells: that would cost cells^2."""
    faiss = import_faiss()

    count = int(first[-1])
    m = min(neighbour_cells, count)
    near = np.empty((count, m), dtype=np.int64)
    # enough coarse clusters around to offer ~NEAR_CHOICE x m cells to choose from
    reach = min(len(coarse), max(COARSE_AROUND + 1, int(np.ceil(NEAR_CHOICE * m * len(coarse) / count))))
    _, coarse_near = faiss.knn(coarse, coarse, reach, metric=faiss.METRIC_INNER_PRODUCT)
    for i, sub in enumerate(subs):
        if len(sub) == 0:
            continue
        around = [j for j in dict.fromkeys([i, *coarse_near[i].tolist()]) if len(subs[j])]
        ids = np.concatenate([np.arange(first[j], first[j + 1]) for j in around])
        cand = np.concatenate([subs[j] for j in around])
        kk = min(m, len(ids))
        _, found = faiss.knn(sub, cand, kk, metric=faiss.METRIC_INNER_PRODUCT)
        rows = np.full((len(sub), m), -1, dtype=np.int64)
        rows[:, :kk] = ids[found]
        own = np.arange(first[i], first[i + 1])
        missing = ~(rows == own[:, None]).any(axis=1)  # a cell always joins itself (ties can push it out)
        rows[missing, kk - 1] = own[missing]
        near[first[i]:first[i + 1]] = rows
    return near


def join_cells(x: np.ndarray, cells: Cells, first: int, last: int, k: int, threads: int = 0,
               out: Optional[np.ndarray] = None):
    """Rows and top-``k`` ids (nearest first) of cells ``first..last-1`` against their near cells;
    with ``out`` (N, k), written there instead (no second copy of N x k ids). ``x``: the
    normalised vectors (float32 or float16), read where they lie: a cell's rows and its near cells'
    rows are gathered one cell at a time, so the join holds no copy of all N."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    ids_dtype = out.dtype if out is not None else np.int64
    rows, ids = [], []
    with torch.no_grad():
        for c in range(first, last):
            members = cells.members(c)
            if not len(members):
                continue
            reach = np.concatenate([cells.members(j) for j in cells.near[c] if j >= 0])
            u = torch.from_numpy(as_float32(x[reach]))
            kk = min(k, len(reach))
            for s in range(0, len(members), JOIN_ROWS):
                part = members[s:s + JOIN_ROWS]
                q = torch.from_numpy(as_float32(x[part]))
                _, top = torch.topk(q @ u.T, kk, dim=1)  # sorted: greedy groups take the nearest first
                found = np.full((len(part), k), -1, dtype=ids_dtype)
                found[:, :kk] = reach[top.numpy()]
                if out is not None:
                    out[part] = found
                    continue
                rows.append(part)
                ids.append(found)
    if out is not None:
        return None
    if not rows:
        return np.zeros(0, np.int64), np.zeros((0, k), ids_dtype)
    return np.concatenate(rows), np.concatenate(ids)


def cell_join(x: np.ndarray, k: int, cell_size: int, neighbour_cells: int, shards: int = 1, seed: int = 0,
              threads: int = 0) -> np.ndarray:
    """(N, k) ids (:func:`raycse.grouping.vectors.id_dtype`) of each row's top-``k`` rows of normalised
    ``x`` by inner product (itself included, as a flat search would), -1 where fewer were within reach."""
    t0 = time.perf_counter()
    cells = partition(x, cell_size, neighbour_cells, seed)
    t1 = time.perf_counter()
    out = np.full((x.shape[0], k), -1, dtype=id_dtype(x.shape[0]))
    if shards == 1:
        join_cells(x, cells, 0, cells.count, k, threads, out)
    else:
        _join_in_tasks(x, cells, k, shards, threads, out)
    sizes = np.diff(cells.bounds)
    log.info(f"[raycse] cell join: partition {t1 - t0:.1f}s ({cells.count:,} cells, largest {sizes.max():,}), "
             f"join {time.perf_counter() - t1:.1f}s")
    return out


def _join_in_tasks(x: np.ndarray, cells: Cells, k: int, shards: int, threads: int, out: np.ndarray) -> None:
    import ray

    from raycse.grouping.tasks import gather

    bounds = np.linspace(0, cells.count, shards + 1).astype(int)
    task = ray.remote(num_cpus=1, scheduling_strategy="DEFAULT")(join_cells)
    x_ref, cells_ref = ray.put(x), ray.put(cells)
    refs = [task.remote(x_ref, cells_ref, int(bounds[i]), int(bounds[i + 1]), k, threads or 1)
            for i in range(shards)]
    for rows, ids in gather(refs, "the kNN cell join"):
        out[rows] = ids
