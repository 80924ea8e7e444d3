"""What a private Ray on free ports costs: raycse's (``ray start --head --block`` under a keeper,
raycse.platform.private_ray) against Ray's ``ray.init(address="local")`` (what raycse used before, which
holds Ray's default agent port 52365), in one process, rounds alternating.

Each round: start (to the first task's result), then stop (every process of that Ray gone). Figures
are medians; the script also says which of Ray's default ports each one held while up. ``--data``: a
Ray Data execution before the stop, as every command's corpus read makes, and a third way, raycse's
private Ray with Ray 2.60's drain on SIGTERM left on (how it stopped before: the keeper's SIGKILL after
its 5 s grace).

    python benchmarks/private_ray_start.py --rounds 5
    python benchmarks/private_ray_start.py --rounds 5 --data
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import time

from common import cpu

DEFAULT_PORTS = (6379, 8265, 52365, 44217, 44227, 10001)


def _held_defaults() -> list[int]:
    out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
    held = {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if line.split()}
    return sorted(held & set(DEFAULT_PORTS))


def _round(start, stop, data: bool) -> tuple:
    """(seconds to the first task's result, seconds until every process it started is gone, Ray's
    default ports held while up) of one start and stop; ``data``: a Ray Data map runs before the stop."""
    import ray

    from raycse.platform.processes import descendants

    before = {p for p, _ in descendants(os.getpid())}
    t = time.perf_counter()
    start()
    ray.get(ray.remote(lambda: 1).remote())
    up = time.perf_counter() - t
    held = _held_defaults()
    if data:
        ray.data.range(100).map_batches(lambda b: b).count()
    t = time.perf_counter()
    stop()
    deadline = time.monotonic() + 30
    while {p for p, _ in descendants(os.getpid())} - before and time.monotonic() < deadline:
        time.sleep(0.05)
    return up, time.perf_counter() - t, held


def ray_local(num_cpus: int, data: bool) -> tuple:
    import ray

    return _round(lambda: ray.init(address="local", num_cpus=num_cpus, object_store_memory=1 << 30,
                                   logging_level=logging.WARNING, include_dashboard=True,
                                   dashboard_host="127.0.0.1"), ray.shutdown, data)


def raycse_private(num_cpus: int, data: bool, drain: bool = False) -> tuple:
    from raycse.platform import compat, private_ray
    from raycse.platform.ray_session import start_local_ray

    kept = dict(compat.PRIVATE_RAY_NODE_ENV)
    if drain:  # (Ray's own default: the node drains on SIGTERM)
        compat.PRIVATE_RAY_NODE_ENV.clear()
    try:
        return _round(lambda: start_local_ray(num_cpus, object_store_memory=1 << 30, logging_level=logging.WARNING),
                      private_ray.stop, data)
    finally:
        compat.PRIVATE_RAY_NODE_ENV.update(kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--data", action="store_true", help="a Ray Data map before each stop; and the drain's way")
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ways = {"Ray's ray.init(local)": ray_local, "raycse's ray start on free ports": raycse_private}
    if args.data:
        ways["raycse's, the node draining on SIGTERM"] = lambda n, d: raycse_private(n, d, drain=True)
    runs: dict = {name: [] for name in ways}
    for r in range(args.rounds):
        for name, way in (ways.items() if r % 2 == 0 else reversed(ways.items())):
            runs[name].append(way(args.num_cpus, args.data))
    print(f"machine: {cpu()}")
    base = None
    for name, rows in runs.items():
        up, down = statistics.median(x[0] for x in rows), statistics.median(x[1] for x in rows)
        held = sorted({p for x in rows for p in x[2]})
        base = base or (up, down)
        print(f"{name:40s} start {up:5.2f} s  stop {down:5.2f} s  (x{up / base[0]:.2f}, x{down / base[1]:.2f} "
              f"of Ray's)  Ray default ports held: {held or 'none'}")


if __name__ == "__main__":
    main()
