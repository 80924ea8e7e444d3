"""The cell join over float16 vectors (how grouping keeps a large corpus's embeddings): float16 rows
cast to float32 by torch (raycse's ``vectors.as_float32``) against numpy's own cast (the baseline,
what the join used before), in one process, on the same vectors and the same cells.

    python benchmarks/float16_join.py --size 1000000
    python benchmarks/float16_join.py --size 200000 --repeats 3 --json benchmarks/results/X.json

Each repeat times the partition and the join with each cast, alternating, and the last line gives
the best times' ratio. The neighbours found must be identical (the two casts are both exact), and
the script exits 1 if they are not. The float32 join on a float32 copy of the same vectors is
printed for reference.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine, refuse  # noqa: E402
from benchmarks.knn_grouping import synthetic  # noqa: E402
from raycse.grouping import cells, vectors  # noqa: E402


def numpy_cast(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows, dtype=np.float32)


def timed_join(x: np.ndarray, cast, k: int, cell_size: int, neighbour_cells: int) -> tuple[float, float, np.ndarray]:
    """(partition seconds, join seconds, ids) with ``cast`` as the grouping floor's float32 cast."""
    saved = cells.as_float32, vectors.as_float32
    cells.as_float32 = vectors.as_float32 = cast
    try:
        t0 = time.perf_counter()
        part = cells.partition(x, cell_size, neighbour_cells, seed=0)
        t1 = time.perf_counter()
        out = np.full((len(x), k), -1, dtype=np.int32)
        cells.join_cells(x, part, 0, part.count, k, 0, out)
        return t1 - t0, time.perf_counter() - t1, out
    finally:
        cells.as_float32, vectors.as_float32 = saved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=200000, help="vectors (384-d, clustered as knn_grouping.py's)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--cell-size", type=int, default=64)
    ap.add_argument("--neighbour-cells", type=int, default=16)
    ap.add_argument("--json", default=None, help="append the result to this JSON file")
    args = ap.parse_args(argv)
    if args.size < 1000 or args.repeats < 1:
        refuse("--size must be at least 1000 and --repeats at least 1")
    print(machine(), flush=True)
    x = synthetic(args.size, "clustered", dtype="float16")
    knobs = (args.k, args.cell_size, args.neighbour_cells)
    runs = {"torch cast": [], "numpy cast (baseline)": []}
    reference = None
    for r in range(args.repeats):
        for name, cast in (("torch cast", vectors.as_float32), ("numpy cast (baseline)", numpy_cast)):
            p, j, ids = timed_join(x, cast, *knobs)
            runs[name].append((p, j))
            print(f"repeat {r + 1} {name:>22}: partition {p:6.1f} s, join {j:6.1f} s", flush=True)
            if reference is None:
                reference = ids
            elif not np.array_equal(ids, reference):
                print("the two casts found different neighbours", file=sys.stderr)
                return 1
    x32 = x.astype(np.float32)
    p32, j32, _ = timed_join(x32, vectors.as_float32, *knobs)
    print(f"float32 copy of the same vectors: partition {p32:6.1f} s, join {j32:6.1f} s (reference)")
    best = {name: min(sum(t) for t in times) for name, times in runs.items()}
    ratio = best["torch cast"] / best["numpy cast (baseline)"]
    print(f"{args.size:,} float16 vectors, partition + join, best of {args.repeats}: "
          f"torch cast {best['torch cast']:.1f} s vs numpy cast {best['numpy cast (baseline)']:.1f} s: "
          f"{ratio:.2f}x the baseline's time")
    if args.json:
        rows = json.load(open(args.json)) if os.path.exists(args.json) else []
        rows.append({"benchmark": "float16_join", "machine": machine(), "size": args.size, "runs": runs,
                     "float32_reference": [p32, j32], "best_seconds": best, "ratio": ratio,
                     "date": time.strftime("%Y-%m-%d")})
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
