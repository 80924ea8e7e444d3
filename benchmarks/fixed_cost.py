"""The fixed cost of a `raycse train` command: a 2-step run, launch to exit, on Ray's defaults vs raycse's.

Ray's defaults: Train's controller polls its workers every 2 s, and Ray Data shuffles (the batch
layout's groupby and sort) with SHUFFLE_V2, which starts aggregator actors for each. raycse's
(train.fit, platform.ray_session.setup_ray_data): a 0.5 s poll and the pull-based sort shuffle.

Everything but the two steps is the cost every run pays whatever its size (imports, Ray start-up,
corpus read and layout, controller and worker start, model load, checkpoint, shutdown), and every
test of the suite pays it per fit. Rounds alternate the two settings so that drift in the VM's speed
falls on both; figures are medians.

    python benchmarks/fixed_cost.py --rounds 5 [--num-workers 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import WIKI, cpu

KNOBS = ("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "RAY_DATA_DEFAULT_SHUFFLE_STRATEGY")
SETTINGS = {"Ray's defaults": {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "2.0",
                               "RAY_DATA_DEFAULT_SHUFFLE_STRATEGY": "shuffle_v2"},
            "raycse's defaults": {}}


def one_run(out: Path, settings: dict, args) -> float:
    env = {k: v for k, v in os.environ.items() if k not in KNOBS}
    env.update(settings)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "raycse", "train", "--corpus", str(WIKI), "--max-sentences",
                        str(args.sentences), "--precision", "fp32", "--max-steps", "2", "--stsb-dev", "none",
                        "--num-workers", str(args.num_workers), "--batch-size", str(64 // args.num_workers),
                        "--output", str(out), "--overwrite"], capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"raycse train failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sentences", type=int, default=4096)
    ap.add_argument("--num-workers", type=int, default=1, help="Train workers (global batch stays 64)")
    args = ap.parse_args()
    times = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for name, settings in SETTINGS.items():
                times[name].append(one_run(Path(tmp) / "out", settings, args))
                print(f"round {i}: {name}: {times[name][-1]:.1f} s", flush=True)
    base, ours = (statistics.median(v) for v in times.values())
    print(f"# {cpu()}; raycse train, 2 steps, {args.sentences} sentences, {args.num_workers} worker(s), fp32, "
          f"no dev scoring; medians of {args.rounds} rounds")
    print(f"{'':28s} {'s, launch to exit':>18s}")
    for name, values in times.items():
        print(f"{name:28s} {statistics.median(values):18.1f}   (min {min(values):.1f}, max {max(values):.1f})")
    print(f"{'ratio (Ray / raycse)':28s} {base / ours:17.2f}x   ({base - ours:+.1f} s a run)")


if __name__ == "__main__":
    main()
