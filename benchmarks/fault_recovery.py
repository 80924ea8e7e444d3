"""Time lost to a worker failure: kill one Ray Train worker mid-run and measure the recovery.

    python benchmarks/fault_recovery.py --sentences 2048 --checkpoint-steps 8

SimCSE on all-MiniLM-L6-v2, 2 workers x batch 32, precision auto, checkpoints every N steps,
``train.max_failures=1``. When rank 1 has trained ``--kill-after`` steps its process gets SIGKILL.
Reported: seconds from the kill to the first step trained after the restart, the step it resumed
from (the last checkpoint), the steps trained twice, and the final step count vs the plan.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import STSB_DEV, WIKI, machine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=2048)
    ap.add_argument("--checkpoint-steps", type=int, default=8)
    ap.add_argument("--kill-after", type=int, default=13)
    args = ap.parse_args()
    print(f"# {machine()}")
    from raycse.config import RunConfig
    from raycse.platform.ray_session import ensure_ray
    from raycse.train.driver import train

    ensure_ray()
    tmp = Path(tempfile.mkdtemp())
    rec = tmp / "rec"
    run = RunConfig()
    run.data.corpus, run.data.max_sentences = str(WIKI), args.sentences
    run.train.num_workers, run.train.batch_size, run.train.log_steps = 2, 32, 8
    run.train.checkpoint_steps, run.train.max_failures, run.train.record_batches = args.checkpoint_steps, 1, str(rec)
    run.eval.stsb_dev, run.eval.eval_steps, run.eval.before_training = str(STSB_DEV), 10**6, False
    run.output_dir = str(tmp / "out")
    planned = (args.sentences // 32) // 2
    box = {}
    thread = threading.Thread(target=lambda: box.update(r=train(run, storage_path=str(tmp / "store"))))
    t_start = time.time()
    thread.start()
    kill_time = killed_step = None
    while thread.is_alive():
        path = rec / "rank1.jsonl"
        lines = path.read_text().splitlines() if path.is_file() else []
        if killed_step is None and len(lines) >= args.kill_after:
            last = json.loads(lines[-1])
            os.kill(last["pid"], signal.SIGKILL)
            kill_time, killed_step = time.time(), last["step"]
            print(f"killed rank 1 (pid {last['pid']}) after step {killed_step}", flush=True)
        time.sleep(0.05)
    thread.join()
    total = time.time() - t_start
    rows = [json.loads(line) for line in (rec / "rank0.jsonl").read_text().splitlines()]
    restart = next(i for i in range(1, len(rows)) if rows[i]["step"] <= rows[i - 1]["step"])
    resumed = rows[restart]["step"]
    lost = rows[restart]["time"] - kill_time
    final = box["r"].metrics["last"]["step"]
    print("\n| planned steps | final steps | killed after step | resumed from step | steps redone | "
          "kill -> training again (s) | whole run (s) |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {planned} | {final} | {killed_step} | {resumed} | {killed_step + 1 - resumed} | {lost:.1f} | {total:.0f} |")


if __name__ == "__main__":
    main()
