"""Fits one after another in one driver process: Ray's worker-pool defaults and a RunRegistry per
``train()`` (raycse before) vs raycse's local cluster now (room in Ray's worker pool for a fit's
CPU-less helper actors, so idle workers survive to the next fit; one RunRegistry per driver).

Every ``train()`` of a Python API user, and every fit of the test suite, pays this. Each setting
gets its own local Ray (the worker-pool limit is fixed when Ray starts), in the same process,
settings alternating round by round; the first fit of each cluster (the driver's imports, Ray's
prestarted workers) is reported apart. Wall and CPU seconds (all processes, /proc/stat) per fit.

    python benchmarks/consecutive_fits.py --rounds 2 --fits 4
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import statistics
import tempfile
import time

from common import WIKI, cpu


def machine_cpu_seconds() -> float:
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    return (fields[0] + fields[1] + fields[2]) / os.sysconf("SC_CLK_TCK")  # user + nice + system


def start_cluster(before: bool) -> None:
    from raycse.platform.ray_session import start_local_ray

    # before: Ray's own system config, whose worker-pool limit is the number of CPUs (actors included)
    start_local_ray(log_to_driver=False, logging_level=logging.WARNING, **({"_system_config": {}} if before else {}))


def one_fit(out: str, before: bool, args) -> tuple[float, float]:
    import ray

    from raycse.config import RunConfig
    from raycse.platform import release
    from raycse.train.driver import train
    from raycse.train.plan import TuneHooks

    run = RunConfig()
    run.data.corpus, run.data.max_sentences = str(WIKI), args.sentences
    run.train.max_steps, run.train.batch_size, run.train.precision = 2, 32, "fp32"
    run.eval.stsb_dev = "none"  # (scoring is the same work in both; it would only add noise)
    run.output_dir = out
    wall, cpu_s = time.perf_counter(), machine_cpu_seconds()
    registry = release.start_registry() if before else None  # before: a registry of this call's own
    with contextlib.redirect_stdout(io.StringIO()):
        train(run, overwrite=True, hooks=TuneHooks(registry=registry))
    if registry is not None:
        ray.kill(registry)
    return time.perf_counter() - wall, machine_cpu_seconds() - cpu_s


def main() -> None:
    import ray

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fits", type=int, default=4, help="fits per cluster (the first is reported apart)")
    ap.add_argument("--sentences", type=int, default=1024)
    args = ap.parse_args()
    names = {True: "before (Ray's pool limit, a registry per train())", False: "now (raycse's local cluster)"}
    later = {b: [] for b in names}
    first = {b: [] for b in names}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for before in (True, False):
                start_cluster(before)
                try:
                    for k in range(args.fits):
                        wall, cpu_s = one_fit(os.path.join(tmp, "out"), before, args)
                        (first if k == 0 else later)[before].append((wall, cpu_s))
                        print(f"round {i}: {names[before]}: fit {k}: {wall:.1f} s wall, {cpu_s:.1f} CPU-s",
                              flush=True)
                finally:
                    ray.shutdown()
    print(f"# {cpu()}; all-MiniLM-L6-v2, 2 steps of batch 32, {args.sentences} sentences, no scoring, "
          f"{args.rounds} round(s) x {args.fits} fits per setting; medians")

    def med(rows, i):
        return statistics.median(r[i] for r in rows)

    print("| | before | now | ratio |\n|---|---|---|---|")
    for label, rows in (("first fit of a cluster", first), ("each later fit", later)):
        for i, unit in ((0, "s wall"), (1, "CPU-s")):
            b, n = med(rows[True], i), med(rows[False], i)
            print(f"| {label}, {unit} | {b:.1f} | {n:.1f} | **{b / n:.2f}x** |")


if __name__ == "__main__":
    main()
