"""kNN grouping throughput on synthetic 384-d embeddings: exact, the cell join (``auto`` above
50,000 vectors) and IVF (the previous default, the baseline), and scale-out.

    python benchmarks/knn_grouping.py --sizes 100000 1000000 --data clustered
    python benchmarks/knn_grouping.py --sizes 4000000 --data clustered --methods cells
    python benchmarks/knn_grouping.py --sizes 100000 --data clustered --shards 1 2 --methods cells

For each (size, data, method, shards): seconds for search (+ partition / IVF training) and for
the greedy groups, sentences/s over both, recall@k of the approximate search against exact search
on 1,000 sampled queries (exact search is the reference, so its recall is 1 by definition), and
the hardness of the batches that come out (as ``grouping_hardness.py``: batches of 64 packed from
the greedy groups; the mean over anchors of the cosine of the hardest in-batch negative). The last
lines give each method's time as a ratio of IVF's and the growth exponent between sizes.
``clustered``: 2,000 Gaussian clusters (spread 0.3 around unit-scale centres); ``noisy``: i.i.d.
Gaussian vectors (no structure: the worst case for IVF).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine  # noqa: E402
from benchmarks.grouping_hardness import hardness  # noqa: E402
from raycse.grouping import knn  # noqa: E402
from raycse.grouping.batches import pack  # noqa: E402
from raycse.grouping.strategies import GroupOrder  # noqa: E402


def synthetic(n: int, kind: str, d: int = 384, seed: int = 0, dtype: str = "float32") -> np.ndarray:
    """``n`` vectors; ``float16``: normalised, drawn 2**20 rows at a time around the same centres
    (10M x 384 in float32 is 15.4 GB, more than this box holds beside the search), so the same
    kind of set as float32's but not its numbers."""
    rng = np.random.default_rng(seed)
    if dtype == "float16":
        centers = rng.standard_normal((2000, d), dtype=np.float32)
        out = np.empty((n, d), dtype=np.float16)
        for i, s in enumerate(range(0, n, 1 << 20)):
            part = np.random.default_rng([seed, i])
            m = min(1 << 20, n - s)
            v = part.standard_normal((m, d), dtype=np.float32)
            if kind != "noisy":
                v = centers[part.integers(0, len(centers), m)] + 0.3 * v
            out[s:s + m] = knn.normalize(v)
        return out
    if kind == "noisy":
        return rng.standard_normal((n, d), dtype=np.float32)
    centers = rng.standard_normal((2000, d), dtype=np.float32)
    x = centers[rng.integers(0, len(centers), n)]
    x += 0.3 * rng.standard_normal((n, d), dtype=np.float32)
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", type=int, default=[100000])
    ap.add_argument("--data", nargs="+", default=["clustered", "noisy"])
    ap.add_argument("--methods", nargs="+", default=["exact", "cells", "ivf"])
    ap.add_argument("--shards", nargs="+", type=int, default=[1])
    ap.add_argument("--k", type=int, default=64, help="neighbours per example (grouping.neighbours)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--nprobe", type=int, default=16)
    ap.add_argument("--cell-size", type=int, default=64)
    ap.add_argument("--neighbour-cells", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=64, help="batches the hardness is measured on")
    ap.add_argument("--json", default=None, help="append the rows to this JSON file")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"],
                    help="the vectors' type (grouping keeps a large corpus's embeddings in float16)")
    ap.add_argument("--max-exact", type=int, default=200000, help="skip exact search above this size")
    args = ap.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING, format="# %(message)s")
    logging.getLogger("raycse.grouping").setLevel(logging.INFO)  # the search chosen, its partition and join times
    print(f"# {machine()}")
    if max(args.shards) > 1:
        import ray

        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(num_cpus=max(2, max(args.shards)), include_dashboard=False, log_to_driver=False)
    rows = []
    for n in args.sizes:
        for kind in args.data:
            x = knn.normalize(synthetic(n, kind, dtype=args.dtype))
            for method in args.methods:
                if method == "exact" and n > args.max_exact:
                    continue
                for shards in args.shards:
                    res = knn.search(x, args.k, method=method, nprobe=args.nprobe, shards=shards,
                                     recall_sample=1000, assume_normalized=True, cell_size=args.cell_size,
                                     neighbour_cells=args.neighbour_cells)
                    t0 = time.perf_counter()
                    groups = knn.greedy_groups(res.neighbours, args.group_size, np.random.default_rng(0))
                    t_group = time.perf_counter() - t0
                    total = res.seconds + t_group
                    order = GroupOrder(np.concatenate(groups), np.array([len(g) for g in groups]))
                    hard, _ = hardness(x, pack(order, args.batch_size, 1).batches)
                    row = {"n": n, "data": kind, "dtype": args.dtype, "method": method, "shards": shards,
                           "search_s": round(res.seconds, 1),
                           "group_s": round(t_group, 1), "total_s": round(total, 1),
                           "sent_per_s": round(n / total), "recall": 1.0 if method == "exact" else round(res.recall, 3),
                           "shard_s": [round(s, 1) for s in res.shard_seconds or []],
                           "mean_group": round(n / len(groups), 2), "hardest_negative": round(hard, 4)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            del x
    print("\n| N | data | method | shards | search s | group s | total s | sentences/s | recall@k | hardest negative |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']:,} | {r['data']} | {r['method']} | {r['shards']} | {r['search_s']} | {r['group_s']} | "
              f"{r['total_s']} | {r['sent_per_s']:,} | {r['recall']} | {r['hardest_negative']} |")
    summarise(rows)
    if args.json:
        write_rows(args.json, rows)


def summarise(rows: list[dict]) -> None:
    """Each method's search time over IVF's (same size, data, shards), and its growth exponent."""
    by = {(r["n"], r["data"], r["method"], r["shards"]): r for r in rows}
    for (n, data, method, shards), r in sorted(by.items()):
        base = by.get((n, data, "ivf", shards))
        if base and method != "ivf":
            print(f"# {method} vs ivf, {n:,} {data}: {r['search_s']} s vs {base['search_s']} s = "
                  f"{r['search_s'] / max(base['search_s'], 1e-9):.2f}x the time")
    for method in {r["method"] for r in rows}:
        for data in {r["data"] for r in rows}:
            pts = sorted((r["n"], r["search_s"]) for r in rows if r["method"] == method and r["data"] == data
                         and r["shards"] == 1)
            for (n0, t0), (n1, t1) in zip(pts, pts[1:]):
                print(f"# {method} {data}: {n0:,} -> {n1:,}: time grows as N^{np.log(t1 / t0) / np.log(n1 / n0):.2f}")


def write_rows(path: str, rows: list[dict]) -> None:
    import datetime

    old = json.load(open(path)) if os.path.exists(path) else []
    stamp = {"date": datetime.date.today().isoformat(), "machine": machine()}
    json.dump(old + [{**stamp, **r} for r in rows], open(path, "w"), indent=1)


if __name__ == "__main__":
    main()
