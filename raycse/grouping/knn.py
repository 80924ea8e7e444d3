"""Nearest-neighbour search for grouping: faiss, exact, IVF or the cell join, optionally over Ray tasks.

Vectors are L2-normalised and compared by inner product (= cosine), the similarity the
objectives use. (The BSC authors search L2 on unnormalised vectors; for normalised vectors the
two orders are the same.)

- ``exact``: ``IndexFlatIP``; cost N^2 d, fine to ~50k vectors on 2 cores.
- ``cells`` (``auto`` above ``exact_threshold``): :mod:`raycse.grouping.cells`, cells of a fixed
  size each joined with its nearest cells; cost ~N. Its recall@k against exact search is measured
  on a sample and returned.
- ``ivf``: ``IndexIVFFlat`` with ~4 sqrt(N) lists trained once on a sample; ``nprobe`` lists
  searched per query; cost ~N^1.5 (kept for ``raycse mine``, whose queries are not its database).
- ``shards > 1``: for ``cells``, the cells are split over Ray tasks; for ``exact``/``ivf`` the
  database is cut into shards, one Ray task each (the IVF from the same trained, empty index)
  searching all queries, and the per-query top-k lists are merged with
  ``faiss.merge_knn_results``. That is how the search leaves one machine.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from raycse.grouping import vectors as embedding_arrays  # (module: search() names its argument vectors)
from raycse.grouping.vectors import as_float32, float32_chunks, id_dtype, normalize
from raycse.platform.machine import import_faiss

log = logging.getLogger("raycse.grouping")


@dataclass
class KnnResult:
    neighbours: np.ndarray  # (N, k) row ids (int32 below 2^31 rows), self excluded, -1 where fewer were found
    method: str  # exact | ivf
    seconds: float
    recall: Optional[float] = None  # recall@k of the approximate search vs exact, on a sample
    shard_seconds: Optional[list] = None


def default_nlist(n: int) -> int:
    return int(max(1, min(n // 39, round(4 * np.sqrt(n)))))


def _empty_ivf(sample: np.ndarray, nlist: int, seed: int):
    faiss = import_faiss()

    d = sample.shape[1]
    quantizer = faiss.IndexFlatIP(d)
    index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = seed
    index.cp.niter = 10  # k-means iterations for the coarse quantizer (faiss default 25; see BENCHMARKS.md)
    index.train(sample)
    index.own_fields = True
    quantizer.this.disown()  # the IVF index owns its quantizer from here on
    return faiss.serialize_index(index)


def _search_shard(db: np.ndarray, queries: np.ndarray, k: int, offset: int, ivf_bytes, nprobe: int,
                  threads: int):
    """Search one database shard; returns (D, I) with I in global row ids."""
    faiss = import_faiss()

    t0 = time.perf_counter()
    if threads:
        faiss.omp_set_num_threads(threads)
    if ivf_bytes is None:
        index = faiss.IndexFlatIP(db.shape[1])
    else:
        index = faiss.deserialize_index(ivf_bytes)
        index.nprobe = nprobe
    index.add(db)
    k_eff = min(k, db.shape[0])
    dist, idx = index.search(queries, k_eff)
    if k_eff < k:  # pad so shards can be merged
        dist = np.pad(dist, ((0, 0), (0, k - k_eff)), constant_values=-np.inf)
        idx = np.pad(idx, ((0, 0), (0, k - k_eff)), constant_values=-1)
    idx = np.where(idx >= 0, idx + offset, -1)
    return dist, idx, time.perf_counter() - t0


def top_k(db: np.ndarray, queries: np.ndarray, k: int, method: str = "exact", nlist: Optional[int] = None,
          nprobe: int = 16, shards: int = 1, seed: int = 0, threads: Optional[int] = None):
    """(scores, ids, per-shard seconds) of the ``k`` best rows of normalised ``db`` for each normalised
    query, by inner product; IVF trained once on a sample; ``shards > 1``: one Ray task per shard."""
    n = db.shape[0]
    ivf_bytes = None
    if method == "ivf":
        nl = nlist or default_nlist(n)
        rng = np.random.default_rng(seed)
        sample = db[rng.choice(n, size=min(n, max(nl * 39, 10000)), replace=False)]
        ivf_bytes = _empty_ivf(sample, nl, seed)
    if shards == 1:
        dist, idx, secs = _search_shard(db, queries, k, 0, ivf_bytes, nprobe, threads or 0)
        return dist, idx, [secs]
    faiss = import_faiss()
    import ray

    from raycse.grouping.tasks import gather

    bounds = np.linspace(0, n, shards + 1).astype(int)
    task = ray.remote(num_cpus=1, scheduling_strategy="DEFAULT")(_search_shard)
    q_ref, ivf_ref = ray.put(queries), ray.put(ivf_bytes)
    outs = gather([task.remote(db[bounds[i]:bounds[i + 1]], q_ref, k, int(bounds[i]), ivf_ref, nprobe,
                               threads or 1) for i in range(shards)], "the sharded kNN search")
    dist, idx = faiss.merge_knn_results(np.stack([o[0] for o in outs]), np.stack([o[1] for o in outs]),
                                        keep_max=True)
    return dist, idx, [o[2] for o in outs]


def choose(n: int, method: str, exact_threshold: int) -> tuple[str, str]:
    """The search for ``n`` vectors and why (printed at run time)."""
    if method != "auto":
        return method, "as configured (grouping.search)"
    if n <= exact_threshold:
        return "exact", f"{n:,} vectors <= grouping.exact_threshold {exact_threshold:,}"
    return "cells", (f"{n:,} vectors > grouping.exact_threshold {exact_threshold:,}: exact search grows as N^2, "
                     "the cell join as N")


def memory_needed(n: int, dim: int, k: int, method: str, normalized: bool = False, itemsize: int = 4) -> int:
    """Bytes the search allocates beside the ``n`` x ``dim`` vectors it is given (``itemsize`` bytes
    a value): the normalised copy (unless given normalised) and the id arrays. The cell join gathers
    its cells' rows where they lie, one cell at a time, and drops each row's own id from its (N, k+1)
    ids in place; exact and IVF search hold a float32 copy in their faiss index, and their ids are
    copied into an (N, k) array beside the (N, k+1) one."""
    size = n * dim
    need = 0 if normalized else size * itemsize
    ids = n * (k + 1)
    if method != "cells":
        need += size * 4 * (1 + (itemsize != 4))  # the index's float32 copy, and float16 converted first
        ids += n * k
    return need + ids * np.dtype(id_dtype(n)).itemsize


def check_memory(n: int, dim: int, k: int, method: str, available: Optional[int] = None,
                 normalized: bool = False, itemsize: int = 4) -> None:
    """One line (exit 2) when the search would not fit in the memory this machine has free."""
    import psutil

    from raycse.errors import ResourceError

    need = memory_needed(n, dim, k, method, normalized, itemsize)
    free = psutil.virtual_memory().available if available is None else available
    if need > free:
        raise ResourceError(f"kNN grouping of {n:,} examples ({dim}-d, {k} neighbours) needs ~{need / 2**30:.1f} GiB "
                            f"more memory on this node and {free / 2**30:.1f} GiB is free: use --grouping cluster or "
                            "shingle (no neighbour lists), fewer examples (data.max_sentences), fewer neighbours "
                            "(grouping.neighbours) or a node with more memory")


def search(vectors: np.ndarray, k: int, method: str = "auto", exact_threshold: int = 50000,
           nlist: Optional[int] = None, nprobe: int = 16, shards: int = 1, recall_sample: int = 1000,
           seed: int = 0, threads: Optional[int] = None, assume_normalized: bool = False,
           cell_size: int = 64, neighbour_cells: int = 16) -> KnnResult:
    """Top-``k`` neighbours (self excluded) of every row of ``vectors`` among all rows."""
    t0 = time.perf_counter()
    method, why = choose(vectors.shape[0], method, exact_threshold)
    itemsize = 2 if vectors.dtype == np.float16 else 4
    check_memory(vectors.shape[0], vectors.shape[1], k, method, normalized=assume_normalized, itemsize=itemsize)
    x = vectors if assume_normalized else normalize(vectors)
    n = x.shape[0]
    kk = min(k + 1, n)  # +1: each row finds itself
    log.info(f"[raycse] kNN: {_describe(method, n, cell_size, neighbour_cells, nlist, nprobe)} ({why})")
    shard_seconds = None
    if method == "cells":
        from raycse.grouping.cells import cell_join

        idx = cell_join(x, kk, cell_size, neighbour_cells, shards, seed, threads or 0)
    else:
        x32 = as_float32(x)  # faiss reads float32 (a copy only of float16)
        _, idx, shard_seconds = top_k(x32, x32, kk, method, nlist, nprobe, shards, seed, threads)
        del x32
    neighbours = _drop_self(idx, k)
    recall = None
    if method != "exact" and recall_sample > 0:
        recall = measure_recall(x, neighbours, recall_sample, seed)
    res = KnnResult(neighbours, method, time.perf_counter() - t0, recall, shard_seconds)
    log.info(f"[raycse] kNN {method} over {n} vectors, k={k}, {shards} shard(s): {res.seconds:.1f}s"
             + (f", recall@{k} vs exact on {min(recall_sample, n)} queries: {recall:.3f}" if recall is not None else ""))
    return res


def _describe(method: str, n: int, cell_size: int, neighbour_cells: int, nlist: Optional[int], nprobe: int) -> str:
    if method == "cells":
        return (f"cell join, ~{max(1, round(n / cell_size)):,} cells of ~{cell_size} vectors, each joined with its "
                f"{neighbour_cells} nearest cells")
    if method == "ivf":
        return f"IVF, {nlist or default_nlist(n):,} lists, {nprobe} probed per query"
    return "exact flat search"


def _drop_self(idx: np.ndarray, k: int) -> np.ndarray:
    """Remove each row's own id from its list and keep k columns (-1 pads), a chunk of rows at a time.
    Where ``idx`` has k + 1 columns of the final id type (the cell join's), the lists are shifted in
    place and a view of their first k columns is returned: at 10M rows a second id array is 2.6 GB,
    and the vectorised shift's temporaries as much again."""
    n, m = idx.shape
    in_place = m == k + 1 and idx.dtype == id_dtype(n) and idx.flags.writeable
    out = idx if in_place else np.full((n, k), -1, dtype=id_dtype(n))
    for start in range(0, n, embedding_arrays.CHUNK):
        block = idx[start:start + embedding_arrays.CHUNK]
        out[start:start + len(block), :k] = _without_self(block, start, k)
    return out[:, :k] if in_place else out


def _without_self(block: np.ndarray, first: int, k: int) -> np.ndarray:
    """Rows ``first``.. of an id list without their own id, k columns (-1 pads)."""
    rows, m = block.shape
    own = block == np.arange(first, first + rows)[:, None]
    out = np.full((rows, k), -1, dtype=block.dtype)
    if (own.sum(axis=1) == 1).all():  # the common case, vectorised
        kept = block[~own].reshape(rows, m - 1)[:, :k]
        out[:, :kept.shape[1]] = kept
        return out
    # rare: a row missing from its own list (exact duplicates tie, or IVF probed other lists)
    for i in range(rows):
        line = block[i][~own[i]][:k]
        out[i, :len(line)] = line
    return out


def measure_recall(x: np.ndarray, approx: np.ndarray, sample: int, seed: int) -> float:
    """Mean recall@k of ``approx`` against an exact search, on ``sample`` random queries."""
    faiss = import_faiss()

    n, k = approx.shape
    rng = np.random.default_rng(seed + 1)
    q = rng.choice(n, size=min(sample, n), replace=False)
    queries, kk = as_float32(x[q]), min(k + 1, n)
    scores, ids = [], []
    for start, chunk in float32_chunks(x):  # no float32 copy of all N vectors (an index would hold one)
        d, i = faiss.knn(queries, chunk, min(kk, len(chunk)), metric=faiss.METRIC_INNER_PRODUCT)
        scores.append(d)
        ids.append(i + start)
    scores, ids = np.concatenate(scores, axis=1), np.concatenate(ids, axis=1)
    best = np.argsort(-scores, axis=1, kind="stable")[:, :kk]
    exact = _drop_self_rows(np.take_along_axis(ids, best, axis=1), q, k)
    hits = [len(set(a[a >= 0]) & set(e[e >= 0])) / max(1, (e >= 0).sum()) for a, e in zip(approx[q], exact)]
    return float(np.mean(hits))


def _drop_self_rows(idx: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    out = np.full((len(rows), k), -1, dtype=np.int64)
    for j, (r, line) in enumerate(zip(rows, idx)):
        line = line[line != r][:k]
        out[j, :len(line)] = line
    return out


def greedy_groups(neighbours: np.ndarray, group_size: int, rng: np.random.Generator,
                  identical: Optional[np.ndarray] = None) -> list[np.ndarray]:
    """Example-based shuffling (BSC): visit examples in random order; each unused one takes its
    nearest ``group_size - 1`` still-unused neighbours as a group. The order is reversed at the end
    so the leftovers (small groups whose neighbours were taken) come first. ``identical``: the
    L2-normalised vectors (float32 or float16); a neighbour whose vector equals the example's (a
    duplicate, which would be a false negative) is left out of its group and stays free for another."""
    n = neighbours.shape[0]
    used = bytearray(n)
    groups = []
    for i in rng.permutation(n).tolist():
        if used[i]:
            continue
        used[i] = 1
        group = [i]
        for j in neighbours[i].tolist():  # one row at a time: all rows as Python ints cost ~2 KB a row
            if identical is not None and j >= 0 and _same_direction(identical[i], identical[j]):
                continue
            if j >= 0 and not used[j]:
                used[j] = 1
                group.append(j)
                if len(group) == group_size:
                    break
        groups.append(np.asarray(group, dtype=np.int64))
    groups.reverse()
    return groups


def _same_direction(a: np.ndarray, b: np.ndarray) -> bool:
    """Unit vectors a duplicate's: cosine > 1 - 1e-6, tested as |a - b|^2 < 2e-6 in float32 (a
    float16 vector's own norm is 1 only to ~1e-5, so its cosine with itself can miss 1 - 1e-6)."""
    d = a.astype(np.float32) - b.astype(np.float32)
    return float(d @ d) < 2e-6
