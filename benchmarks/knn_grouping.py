"""kNN grouping throughput on synthetic 384-d embeddings: exact vs the scalable (IVF) path, and scale-out.

    python benchmarks/knn_grouping.py --sizes 100000 1000000 --data clustered noisy
    python benchmarks/knn_grouping.py --sizes 100000 --data clustered --shards 1 2 4 --methods ivf

For each (size, data, method, shards): seconds for search (+ IVF training) and for the greedy
groups, sentences/s over both, and recall@k of the approximate search against exact search on
1,000 sampled queries (exact search is the reference, so its recall is 1 by definition).
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
from raycse.grouping import knn  # noqa: E402


def synthetic(n: int, kind: str, d: int = 384, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
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
    ap.add_argument("--methods", nargs="+", default=["exact", "ivf"])
    ap.add_argument("--shards", nargs="+", type=int, default=[1])
    ap.add_argument("--k", type=int, default=64, help="neighbours per example (grouping.neighbours)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--nprobe", type=int, default=16)
    ap.add_argument("--max-exact", type=int, default=200000, help="skip exact search above this size")
    args = ap.parse_args()
    print(f"# {machine()}")
    if max(args.shards) > 1:
        import ray

        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(num_cpus=max(2, max(args.shards)), include_dashboard=False, log_to_driver=False)
    rows = []
    for n in args.sizes:
        for kind in args.data:
            x = knn.normalize(synthetic(n, kind))
            for method in args.methods:
                if method == "exact" and n > args.max_exact:
                    continue
                for shards in args.shards:
                    res = knn.search(x, args.k, method=method, nprobe=args.nprobe, shards=shards,
                                     recall_sample=1000, assume_normalized=True)
                    t0 = time.perf_counter()
                    groups = knn.greedy_groups(res.neighbours, args.group_size, np.random.default_rng(0))
                    t_group = time.perf_counter() - t0
                    total = res.seconds + t_group
                    row = {"n": n, "data": kind, "method": method, "shards": shards, "search_s": round(res.seconds, 1),
                           "group_s": round(t_group, 1), "total_s": round(total, 1),
                           "sent_per_s": round(n / total), "recall": 1.0 if method == "exact" else round(res.recall, 3),
                           "shard_s": [round(s, 1) for s in res.shard_seconds or []],
                           "mean_group": round(n / len(groups), 2)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            del x
    print("\n| N | data | method | shards | search s | group s | total s | sentences/s | recall@k | s per shard |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']:,} | {r['data']} | {r['method']} | {r['shards']} | {r['search_s']} | {r['group_s']} | "
              f"{r['total_s']} | {r['sent_per_s']:,} | {r['recall']} | {', '.join(map(str, r['shard_s']))} |")


if __name__ == "__main__":
    main()
