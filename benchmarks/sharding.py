"""Sharded training (``--sharding fsdp``, FSDP2) against data-parallel (DDP) on 2 gloo workers: each worker's peak
resident memory and step time, with and without activation checkpointing, and raycse's memory estimate beside the
measured peak (issue 107 item 8).

    python benchmarks/sharding.py --batch 32 --length 64 --steps 2

The workers are 2 processes of one gloo group on this machine (as Ray Train's CPU workers are), one torch thread
each, training SimCSE on a ~150M-parameter Qwen3 built from its config with random weights (20 layers, 768 wide,
MiniLM's tokenizer; benchmarks/gradient_checkpointing.py builds it), last-token pooling, fp32, wiki_sample.txt
sentences repeated to reach ``--length`` tokens. Each way starts fresh processes: the model built as raycse's
workers build it (DDP wraps it, FSDP2 shards it), one warm-up step, then ``--steps`` timed steps (forward, backward,
AdamW). "peak" is the worker's peak resident set (ru_maxrss: everything it held, the weights loaded included);
"held" is its parameter and AdamW bytes (DTensor shards counted locally); "estimate" is raycse.train.memory's
pre-flight figure for that worker. "largest in 8 GiB" is the deepest model of this width whose estimate fits 8 GiB
a worker (the estimate's ratio to the measured peak says how far to trust it).
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
from pathlib import Path

from common import first_sentences, machine

WAYS = (("ddp", False), ("fsdp", False), ("fsdp", True))


def _run(model: str, sharding: str, checkpointing: bool, batch: int, length: int, layers=None):
    from raycse.config import RunConfig

    run = RunConfig()
    run.model.name_or_path, run.model.pooling, run.model.max_length = model, "lasttoken", length
    run.train.precision, run.train.batch_size, run.train.num_workers = "fp32", batch, 2
    run.train.sharding, run.train.gradient_checkpointing, run.train.unpad = sharding, checkpointing, False
    return run.resolved()


def _worker(rank: int, port: int, model: str, sharding: str, checkpointing: bool, batch: int, length: int,
            steps: int, out: str) -> None:
    import os
    import resource
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from raycse.platform.process_state import seed_everything
    from raycse.train.memory import estimate
    from raycse.train.module import build_module
    from raycse.train.sharding import local_bytes, shard_from_rank0
    from raycse.train.steps import StepEngine

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    run, cpu = _run(model, sharding, checkpointing, batch, length), torch.device("cpu")
    seed_everything(0)
    # as the workers do (in training mode: HF's checkpointing and dropout act only then); sharded, rank 0 reads the
    # weights and rank 1 builds on the meta device and receives its shards
    if sharding == "fsdp":
        module = shard_from_rank0(lambda weights: build_module(run, weights).train(), cpu, rank, 2, torch.float32)
    else:
        module = DistributedDataParallel(build_module(run).train())
    engine = StepEngine(run, module, cpu, 100)
    texts = [" ".join([t] * 6) for t in first_sentences(2 * batch * (steps + 1))]  # (long enough for --length)
    mine = [texts[(2 * s + rank) * batch:(2 * s + rank + 1) * batch] for s in range(steps + 1)]
    batches = [engine.core.objective.collate(t, engine.core.encoder.tokenizer, length) for t in mine]
    engine.step(batches[0], 0)
    dist.barrier()
    t0 = time.perf_counter()
    for s, b in enumerate(batches[1:], 1):
        engine.step(b, s)
    engine.read_losses(steps + 1)
    dist.barrier()
    seconds = (time.perf_counter() - t0) / steps
    guess = estimate(run, model)
    row = {"sharding": sharding, "checkpointing": checkpointing, "rank": rank,
           "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "held_mb": local_bytes(engine.core, engine.opt) / 2**20, "step_s": seconds,
           "estimate_mb": guess.total / 2**20 if guess else None, "params": guess.params if guess else None,
           "tokens": int(batches[0]["input_ids"].shape[1])}
    Path(f"{out}.{rank}").write_text(json.dumps(row))
    dist.destroy_process_group()


def largest_in(limit_gb: float, model: str, sharding: str, checkpointing: bool, batch: int, length: int) -> int:
    """The most layers (of the benchmark model's width) whose estimate fits ``limit_gb`` a worker."""
    from raycse.train import memory

    run = _run(model, sharding, checkpointing, batch, length)
    config = json.loads((Path(model) / "config.json").read_text())
    lo, hi = 0, 400
    while lo < hi:  # (the estimate grows with the layers: bisect on a config of that depth)
        mid = (lo + hi + 1) // 2
        deeper = Path(tempfile.mkdtemp()) / "m"
        deeper.mkdir()
        deep = {**config, "num_hidden_layers": mid}
        if config.get("layer_types"):  # (one entry a layer)
            deep["layer_types"] = [config["layer_types"][0]] * mid
        (deeper / "config.json").write_text(json.dumps(deep))
        for f in Path(model).iterdir():
            if "token" in f.name or f.name == "vocab.txt":
                (deeper / f.name).write_bytes(f.read_bytes())
        guess = memory.estimate(run, str(deeper))
        lo, hi = (mid, hi) if guess is not None and guess.total <= limit_gb * memory.GB else (lo, mid - 1)
    return lo


def main() -> None:
    import torch.multiprocessing as mp

    from gradient_checkpointing import decoder

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--limit-gb", type=float, default=8.0)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    model = decoder(tempfile.gettempdir())
    print(f"# {machine()}; 2 gloo workers x 1 thread; SimCSE, Qwen3 ~150M (random), fp32, batch {args.batch} a worker,"
          f" length {args.length}, {args.steps} timed steps after 1 warm-up", flush=True)
    rows = []
    for sharding, checkpointing in WAYS:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = Path(tempfile.mkdtemp()) / "row"
        mp.start_processes(_worker, args=(port, model, sharding, checkpointing, args.batch, args.length, args.steps,
                                          str(out)), nprocs=2, join=True, start_method="spawn")
        per_rank = [json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)]
        row = {**per_rank[0], "peak_mb": max(r["peak_mb"] for r in per_rank),
               "held_mb": max(r["held_mb"] for r in per_rank), "step_s": max(r["step_s"] for r in per_rank)}
        row["largest_layers_in_limit"] = largest_in(args.limit_gb, model, sharding, checkpointing, args.batch,
                                                    args.length)
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]
    print(f"{'way':<22} {'peak MB':>8} {'held MB':>8} {'estimate MB':>12} {'est/peak':>9} {'step s':>7} "
          f"{'layers in ' + format(args.limit_gb, 'g') + ' GiB':>16}")
    for r in rows:
        name = r["sharding"] + (" + checkpointing" if r["checkpointing"] else "")
        print(f"{name:<22} {r['peak_mb']:>8.0f} {r['held_mb']:>8.0f} {r['estimate_mb']:>12.0f} "
              f"{r['estimate_mb'] / r['peak_mb']:>9.2f} {r['step_s']:>7.1f} {r['largest_layers_in_limit']:>16}")
    for r in rows[1:]:
        name = r["sharding"] + (" + checkpointing" if r["checkpointing"] else "")
        print(f"{name} / ddp: peak {r['peak_mb'] / base['peak_mb']:.2f}x, held {r['held_mb'] / base['held_mb']:.2f}x,"
              f" step time {r['step_s'] / base['step_s']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "settings": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
