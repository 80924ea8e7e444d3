"""The largest decoder that trains on one device, and its speed: fp32 weights, bf16 weights (``--model-dtype bf16``),
bf16 with activation checkpointing, and bf16 with checkpointing and FSDP2's CPU offload of the weights and AdamW
(``--sharding fsdp --set train.fsdp_offload=cpu`` on one worker) (issue 107 item 8, the GPU part).

    python benchmarks/big_decoder.py --batch 64 --length 128 --hidden 1536 --layers 28   # ~1.5B, on a GPU
    python benchmarks/big_decoder.py --device cpu --batch 4 --length 16 --hidden 128 --layers 2 --ladder 4

A Qwen3 built from its config with random weights (``--hidden`` wide, heads 128 wide, MLP 3.5x, vocabulary 151,936
as Qwen3's), SimCSE with last-token pooling, bf16 autocast, raycse's own module, optimizer and step. Each way: the
``--layers`` model trains ``--steps`` timed steps after a warm-up (sentences/s, peak device memory), or runs out of
memory; then the deepest model of that width, of the depths in ``--ladder``, that takes one step (each depth's
weights written once, in bf16, and tried by every way that fit the depth before; the device's cache emptied between
tries). Every try runs in this process.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from common import machine

WAYS = (("fp32 weights", "fp32", False, False), ("bf16 weights", "bf16", False, False),
        ("bf16 + checkpointing", "bf16", True, False), ("bf16 + checkpointing + offload", "bf16", True, True))


def model_dir(root: Path, hidden: int, layers: int) -> str:
    """A Qwen3 config (no weights: the run's workers load them; here random ones are saved) with MiniLM's tokenizer."""
    from transformers import AutoModel, Qwen3Config

    from raycse.model.loading import embedded_model_path

    path = root / f"qwen3-{hidden}x{layers}"
    if not (path / "config.json").is_file():
        heads = max(1, hidden // 128)
        config = Qwen3Config(vocab_size=151936, hidden_size=hidden, intermediate_size=int(3.5 * hidden),
                             num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 4),
                             head_dim=128 if hidden >= 128 else hidden, max_position_embeddings=4096, pad_token_id=0)
        with torch.device("meta"):
            meta = AutoModel.from_config(config, dtype=torch.bfloat16)
        model = meta.to_empty(device="cpu")  # (random-enough weights, written once, without an fp32 init pass)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.02)
        model.save_pretrained(path)
        for f in Path(embedded_model_path()).iterdir():
            if "token" in f.name or f.name == "vocab.txt":
                (path / f.name).write_bytes(f.read_bytes())
    return str(path)


def attempt(model: str, dtype: str, checkpointing: bool, offload: bool, batch: int, length: int, steps: int,
            device: torch.device) -> dict:
    """One way on one model: sentences/s and peak memory, or {"oom": True}."""
    from raycse.config import RunConfig
    from raycse.train.module import build_module
    from raycse.train.sharding import shard
    from raycse.train.steps import StepEngine

    run = RunConfig()
    run.model.name_or_path, run.model.pooling, run.model.max_length, run.model.dtype = model, "lasttoken", length, dtype
    run.train.precision, run.train.batch_size, run.train.gradient_checkpointing = "bf16", batch, checkpointing
    run.train.use_gpu, run.train.unpad = device.type == "cuda", False
    if offload:
        run.train.sharding, run.train.fsdp_offload = "fsdp", "cpu"
    run = run.resolved()
    texts = [f"sentence {i} " + "word " * (2 * length) for i in range(batch * (steps + 1))]
    engine = None
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        module = build_module(run).train()
        module = shard(module, device, 1, torch.bfloat16, "cpu") if offload else module.to(device)
        engine = StepEngine(run, module, device, 100)
        batches = [engine.core.objective.collate(texts[i * batch:(i + 1) * batch], engine.core.encoder.tokenizer,
                                                 length) for i in range(steps + 1)]
        move = (lambda b: {k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()})
        engine.step(move(batches[0]), 0)
        t0 = engine.synchronize()
        for i, b in enumerate(batches[1:], 1):
            engine.step(move(b), i)
        engine.read_losses(steps + 1)
        seconds = engine.synchronize() - t0
        peak = (torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda"
                else __import__("resource").getrusage(__import__("resource").RUSAGE_SELF).ru_maxrss / 2**20)
        return {"oom": False, "sent_per_s": batch * steps / seconds, "peak_gb": peak,
                "params": sum(p.numel() for p in engine.core.encoder.backbone.parameters())}
    except torch.OutOfMemoryError:
        return {"oom": True}
    finally:
        del engine
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--ladder", type=int, nargs="+", default=[42, 56, 84, 112],
                    help="deeper models tried, in turn, by the ways that fit the one before")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json")
    args = ap.parse_args()
    device = torch.device(args.device)
    import torch.distributed as dist

    if not dist.is_initialized():  # (FSDP2's offload runs in a process group: one process here)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else machine()
    print(f"# {name}; torch {torch.__version__}; Qwen3 {args.hidden} wide, batch {args.batch}, length {args.length}, "
          f"bf16 autocast, {args.steps} timed steps", flush=True)
    root = Path(tempfile.gettempdir()) / "raycse-big-decoder"
    root.mkdir(exist_ok=True)
    rows = []
    ways = [w for w in WAYS if device.type == "cuda" or not w[3]]  # (offload moves a GPU's shards: none on a CPU)
    for label, dtype, ckpt, offload in ways:
        at = attempt(model_dir(root, args.hidden, args.layers), dtype, ckpt, offload, args.batch, args.length,
                     args.steps, device)
        rows.append({"way": label, **at, "largest_layers": args.layers if not at["oom"] else 0})
        print(json.dumps(rows[-1]), flush=True)
    previous = args.layers
    for depth in sorted(d for d in args.ladder if d > args.layers):
        path = model_dir(root, args.hidden, depth)
        for row, (label, dtype, ckpt, offload) in zip(rows, ways):
            if row["largest_layers"] == previous:
                if not attempt(path, dtype, ckpt, offload, args.batch, args.length, 0, device)["oom"]:
                    row["largest_layers"] = depth
        shutil.rmtree(path, ignore_errors=True)  # (one ladder model on the disk at a time)
        previous = depth
        print(f"# depth {depth}: " + ", ".join(f"{r['way']} {'fits' if r['largest_layers'] == depth else '-'}"
                                               for r in rows), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "settings": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
