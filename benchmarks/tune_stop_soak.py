"""Does a Tune search always end? `raycse tune` repeated with CPU load beside it (issue 18).

    python benchmarks/tune_stop_soak.py --repeats 5

Each repetition runs the CLI as a user would (SimCSE space over tau and lr, 3 configurations x 2
seeds x 2 rungs, the first 512 sentences of wiki_sample.txt, batch 32, the embedded model, Optuna +
ASHA) against one local Ray cluster started here, while two processes keep the cores busy 5 s out
of every 15 (a head node with other work on it). Reported per repetition: exit code, seconds,
trials stopped by ASHA, and the placement groups still held after the CLI exited (must be 0). A
repetition that runs past --timeout counts as hung and is killed.

    python benchmarks/tune_stop_soak.py --repeats 1 --without-raycse-release

runs the same search with raycse's own release of a stopped trial's runs switched off in the CLI's
process (raycse.platform.release.release made a no-op there, for this measurement only): whether Ray's own
PlacementGroupCleaner ends them (issue 92, item 3). The most groups held at once during the search is
sampled every second beside it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import ROOT, STSB_DEV, WIKI, machine  # noqa: E402

BUSY = ("import time\nend = time.time() + {limit}\nwhile time.time() < end:\n"
        "    t = time.time() + 5\n    while time.time() < t: pass\n    time.sleep(10)\n")


WITHOUT_RELEASE = ("import sys\nimport raycse.platform.release as r\nr.release = lambda *a, **k: None\n"
                   "from raycse.cli import main\nsys.exit(main(sys.argv[1:]))\n")


def held_groups() -> list[str]:
    import ray

    return [pid for pid, info in ray.util.placement_group_table().items()
            if info.get("state") in ("CREATED", "PENDING", "RESCHEDULING")]


def one_repetition(args, space: Path, storage: Path, name: str, address: str) -> dict:
    from raycse.analysis import load_trials

    load = [subprocess.Popen([sys.executable, "-c", BUSY.format(limit=args.timeout)]) for _ in range(2)]
    entry = ([sys.executable, "-c", WITHOUT_RELEASE] if args.without_raycse_release
             else [sys.executable, "-m", "raycse"])
    cmd = [*entry, "tune", "--space", str(space), "--num-samples", str(args.samples),
           "--seeds", "2", "--rungs", "2", "--storage-path", str(storage), "--name", name,
           "--search-seed", str(args.search_seed)]
    start = time.monotonic()
    with open(storage / f"{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, env={**os.environ, "RAY_ADDRESS": address}, stdout=log,
                                stderr=subprocess.STDOUT, cwd=ROOT)
        most, rc = 0, None
        while rc is None:  # the groups held at once, sampled each second, until the CLI ends or hangs
            most = max(most, len(held_groups()))
            try:
                rc = proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                if time.monotonic() - start > args.timeout:
                    proc.kill()
                    proc.wait()
                    rc = "hung"
    took = time.monotonic() - start
    for p in load:
        p.kill()
        p.wait()
    time.sleep(2)  # the driver's job ends: whatever it held and Ray removes by itself is gone
    trials = load_trials(storage / name) if (storage / name).is_dir() else []
    stopped = sum(1 for t in trials if t.results and not t.complete)
    return {"rc": rc, "seconds": took, "trials": len(trials), "stopped": stopped, "held": held_groups(), "most": most}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--sentences", type=int, default=512)
    ap.add_argument("--timeout", type=int, default=900, help="seconds after which a repetition counts as hung")
    ap.add_argument("--search-seed", type=int, default=0)
    ap.add_argument("--without-raycse-release", action="store_true",
                    help="switch raycse's release of stopped trials' runs off in the CLI (Ray's cleaner alone)")
    args = ap.parse_args()
    print(f"# {machine()}", flush=True)
    import ray
    import yaml

    from raycse.platform.ray_session import ensure_ray

    ensure_ray()
    address = ray.get_runtime_context().gcs_address
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump({
        "run": {"model": {"name_or_path": "default", "pooling": "mean", "max_length": 32},
                "data": {"corpus": str(WIKI), "max_sentences": args.sentences}, "objective": {"name": "simcse"},
                "train": {"batch_size": 32, "epochs": 1}, "eval": {"stsb_dev": str(STSB_DEV), "precision": "train"}},
        "search": {"tau": {"loguniform": [0.01, 0.1]}, "lr": {"loguniform": [1e-5, 1e-4]}}}))
    print(f"# {args.samples} configurations x 2 seeds x 2 rungs, {args.sentences} sentences, batch 32, "
          f"CPU load 5 s of every 15 on 2 processes; raycse's release "
          f"{'OFF (Ray alone)' if args.without_raycse_release else 'on'}; experiments under {tmp}", flush=True)
    print("rep  rc    seconds  trials  stopped-by-ASHA  most-groups-at-once  groups-held-after", flush=True)
    results = []
    for i in range(args.repeats):
        r = one_repetition(args, space, tmp, f"rep{i}", address)
        results.append(r)
        print(f"{i:<4} {r['rc']!s:<5} {r['seconds']:7.0f}  {r['trials']:6}  {r['stopped']:15}  {r['most']:19}  {len(r['held'])}",
              flush=True)
    ended = sum(r["rc"] == 0 for r in results)
    print(f"{ended}/{len(results)} repetitions ended; {sum(r['stopped'] for r in results)} ASHA stops in all; "
          f"placement groups held after a repetition: {sum(len(r['held']) for r in results)}")


if __name__ == "__main__":
    main()
