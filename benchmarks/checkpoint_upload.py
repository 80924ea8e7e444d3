"""Checkpoints copied to storage in the background (train.checkpoint_upload: async; auto picks it for object storage) vs
training waiting for each copy (sync): one driver process, the same run, modes alternating.

SimCSE on all-MiniLM-L6-v2 (its checkpoint: the exported model, all module tensors and AdamW's
state, ~270 MB), 1 worker, a checkpoint every ``--checkpoint-steps`` steps into ``--storage``:
``s3`` (an S3-compatible server, moto, on 127.0.0.1 in this process: object storage as a cluster
uses it, on loopback) or ``local`` (a directory). Reported per mode (median of the rounds): the
fit's wall seconds, the training thread's seconds in checkpoints (writing them, plus waiting for
the copy under sync or for the previous copy under async), and async / sync as a ratio.

    python benchmarks/checkpoint_upload.py --storage s3 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import WIKI, machine  # noqa: E402


def start_s3() -> str:
    """moto's S3 server on a free loopback port; its endpoint goes to every Ray process started later."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False).start()
    import boto3

    boto3.client("s3").create_bucket(Bucket="bench")
    return "s3://bench"


def one_run(mode: str, storage: str, args, tmp: str, i: int) -> dict:
    from raycse.config import RunConfig
    from raycse.train.driver import train

    run = RunConfig()
    run.data.corpus, run.data.max_sentences = str(WIKI), args.batch_size * args.steps
    run.train.batch_size, run.train.max_steps, run.train.log_steps = args.batch_size, args.steps, args.steps
    run.train.checkpoint_steps, run.train.checkpoint_upload = args.checkpoint_steps, mode  # (not auto: both on each store)
    run.train.keep_checkpoints = 1
    run.eval.stsb_dev, run.eval.before_training = "none", "false"
    run.output_dir = os.path.join(tmp, f"out-{mode}-{i}")
    t0 = time.perf_counter()
    result = train(run, storage_path=f"{storage}/{mode}-{i}", run_name="bench")
    wall = time.perf_counter() - t0
    last = result.metrics["last"]
    return {"fit": result.metrics["fit_seconds"][0], "wall": wall, "ckpt": last["checkpoint_seconds"],
            "train": last["train_seconds"], "checkpoints": len(last["loss_history"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--storage", choices=("s3", "local"), default="s3")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--checkpoint-steps", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="raycse-bench-ckpt-")
    storage = start_s3() if args.storage == "s3" else os.path.join(tmp, "store")
    from raycse.platform.ray_session import ensure_ray

    ensure_ray()  # after the endpoint is in the environment: the workers inherit it
    print(f"# {machine()}")
    print(f"# SimCSE, all-MiniLM-L6-v2, 1 worker, batch {args.batch_size}, {args.steps} steps, a checkpoint every "
          f"{args.checkpoint_steps} steps, storage {args.storage}")
    rows = {"sync": [], "async": []}
    try:
        for i in range(args.rounds):
            for mode in ("sync", "async") if i % 2 == 0 else ("async", "sync"):
                r = one_run(mode, storage, args, tmp, i)
                rows[mode].append(r)
                print(f"round {i} {mode:5s}: fit {r['fit']:.1f} s, training {r['train']:.1f} s, in checkpoints "
                      f"{r['ckpt']:.1f} s (the first {r['checkpoints'] - 1} of {r['checkpoints']})", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the models and local checkpoints of the runs
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("fit", "ckpt", "train")} for m, rs in rows.items()}
    print(f"{'':8s}{'fit s':>8s}{'in checkpoints s':>18s}{'training s':>12s}")
    for m in ("sync", "async"):
        print(f"{m:8s}{med[m]['fit']:8.1f}{med[m]['ckpt']:18.1f}{med[m]['train']:12.1f}")
    print(f"async / sync: fit {med['async']['fit'] / med['sync']['fit']:.2f}x, in checkpoints "
          f"{med['async']['ckpt'] / max(med['sync']['ckpt'], 1e-9):.2f}x (lower is faster)")


if __name__ == "__main__":
    main()
