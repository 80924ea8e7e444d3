"""The autoscaler's cost to a job: from `ray job submit` to the first training step with 0, 1 and 2 GPU worker
nodes already up, and from the job's end to the cluster back at its head alone.

On cluster/local.yaml (Ray's fake multi-node provider: a "node" is a local raylet, up in seconds; a cloud GPU
node takes minutes more to boot and run its setup commands). Each job: `raycse train --use-gpu --num-workers 2`
(one GPU worker node per worker) on the embedded all-MiniLM-L6-v2, its GPUs stood in for by the CPU. Nodes
are put up beforehand with ray.autoscaler.sdk.request_resources and held by that request through the job.
The baseline is 2 nodes up (no launch in the job's path); the ratio says what waiting for the autoscaler adds.
Times are read off the job's log as the driver polls it (every 0.25 s; Ray's log monitor forwards lines in
batches, the same for every case).

    .venv/bin/python benchmarks/autoscaling.py [--json benchmarks/results/DATE-autoscaling.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' fake-cluster helper

from common import STSB_DEV, WIKI, machine  # noqa: E402
from fake_cluster import JOB_ENV, FakeCluster  # noqa: E402

FIRST_STEP = "[raycse] step 1/"


def hold_nodes(cluster: FakeCluster, n: int, bound_s: float = 120) -> None:
    """n GPU worker nodes up, and kept up by the request until it is replaced."""
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=[{"GPU": 1}] * n)
    deadline = time.time() + bound_s
    while len(cluster.worker_nodes()) != n:
        if time.time() > deadline:
            raise SystemExit(f"autoscaling.py: error: {n} node(s) not up within {bound_s:g} s")
        time.sleep(0.5)


def one_job(cluster: FakeCluster, out: Path, max_sentences: int) -> dict:
    """Submit one training job; seconds to its first step and to its end, from the submission."""
    start = time.time()
    job = cluster.submit(
        f"{sys.executable} -m raycse train --use-gpu --num-workers 2 --corpus {WIKI} --stsb-dev {STSB_DEV} "
        f"--set data.max_sentences={max_sentences} --batch-size 32 --max-steps 3 --log-steps 1 "
        f"--eval-steps 1000 --output {out}", JOB_ENV)
    first = None
    while True:
        if first is None and FIRST_STEP in cluster.client.get_job_logs(job):
            first = time.time() - start
        status = cluster.client.get_job_status(job)
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        if time.time() - start > 900:
            cluster.client.stop_job(job)
            raise SystemExit("autoscaling.py: error: a job ran past 900 s")
        time.sleep(0.25)
    if status != "SUCCEEDED":
        raise SystemExit(f"autoscaling.py: error: the job {status}: {cluster.client.get_job_logs(job)[-2000:]}")
    return {"first_step_s": round(first, 1), "job_s": round(time.time() - start, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--max-sentences", type=int, default=2000)
    args = ap.parse_args()
    import ray
    from ray.autoscaler.sdk import request_resources

    work = Path(tempfile.mkdtemp(prefix="raycse-autoscaling-"))
    cluster = FakeCluster({k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, work)
    rows = {}
    try:
        ray.init(address=f"127.0.0.1:{cluster.port}", logging_level="ERROR")
        for up in (2, 1, 0):
            hold_nodes(cluster, up)
            rows[up] = one_job(cluster, work / f"out{up}", args.max_sentences)
            request_resources(bundles=[])  # the job ended: nothing holds the nodes now
            rows[up]["scale_down_s"] = round(cluster.wait_head_alone(cluster.idle_s + 120), 1)
            print(f"{up} node(s) up: first step {rows[up]['first_step_s']} s after submit, job {rows[up]['job_s']} s, "
                  f"head alone {rows[up]['scale_down_s']} s after the job", flush=True)
    finally:
        ray.shutdown()
        cluster.stop()
    base = rows[2]["first_step_s"]
    print(f"\nmachine: {machine()}; idle_timeout {cluster.idle_s:g} s (cluster/local.yaml)")
    print(f"{'GPU nodes up at submit':>24} {'submit -> first step':>22} {'vs 2 up':>8} {'job end -> head alone':>22}")
    for up, row in rows.items():
        print(f"{up:>24} {row['first_step_s']:>20.1f} s {row['first_step_s'] / base:>7.2f}x "
              f"{row['scale_down_s']:>20.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"benchmark": "autoscaling", "machine": machine(),
                                               "date": time.strftime("%Y-%m-%d"), "idle_timeout_s": cluster.idle_s,
                                               "rows": {str(k): v for k, v in rows.items()}}, indent=2) + "\n")


if __name__ == "__main__":
    main()
