"""Operators dispatched per optimizer step: raycse's step engine against the plain loop (issue 91, item 1).

A step of a small encoder on a GPU waits on the host's kernel launches (benchmarks/results/gpu.md), so
every operator raycse's step adds shows up whole there. This counts, on the CPU, the ATen operators
each step dispatches (a ``TorchDispatchMode``: forward, backward and optimizer, below autograd) for
  - plain: ``scripts/gpu_check.sh --part 1``'s loop (objective forward in bf16 autocast, backward,
    AdamW as PyTorch picks it on a GPU (foreach), zero_grad);
  - engine: raycse's StepEngine with the settings a GPU run resolves (1 length bucket, padded forward,
    PyTorch's dropout, bf16 autocast, clipping at 1.0, fused AdamW, the schedule),
on the same batches (the third step, after the optimizer's state exists), and says where they differ,
operator by operator. ``--model tiny`` (default) is a 2-layer BERT; ``default`` is all-MiniLM-L6-v2.

    python benchmarks/step_ops.py
    python benchmarks/step_ops.py --model default --objective compcse
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BATCH, LENGTH = 32, 32
HOST_READ = "_local_scalar_dense"  # a tensor's value read by the host (.item()): a device sync on a GPU


class OpCounter(TorchDispatchMode):
    """Counts every ATen operator dispatched while it is entered, by name."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def tiny_model(directory: Path) -> str:
    from transformers import BertConfig, BertModel, BertTokenizerFast

    words = ("the city river music film game team school church war king queen party state north south east west "
             "year time world people book song album").split()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
    BertTokenizerFast(vocab=str(directory / "vocab.txt"), do_lower_case=True).save_pretrained(directory)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(words) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(directory)
    return str(directory)


def batches(n: int) -> list[list[str]]:
    g = torch.Generator().manual_seed(1)
    words = "the city river music film game team school church war king queen party state".split()
    out = []
    for _ in range(n):
        counts = torch.randint(4, 24, (BATCH,), generator=g).tolist()
        out.append([" ".join(words[i] for i in torch.randint(len(words), (c,), generator=g).tolist()) for c in counts])
    return out


def gpu_like_run(model: str, objective: str):
    from raycse.config import RunConfig

    run = RunConfig()
    run.model.name_or_path, run.model.max_length, run.objective.name = model, LENGTH, objective
    # what a GPU run resolves (module.length_buckets / pad_multiple; the padded path, PyTorch's dropout)
    run.train.length_buckets, run.train.pad_to_multiple_of, run.train.unpad, run.train.fast_dropout = 1, 8, False, False
    run.train.precision = "bf16"
    run.validate()
    return run


def engine_ops(model: str, objective: str, steps: list) -> collections.Counter:
    from raycse.platform.process_state import seed_everything
    from raycse.train.module import build_module
    from raycse.train.steps import StepEngine

    run = gpu_like_run(model, objective)
    seed_everything(0)
    engine = StepEngine(run, build_module(run), torch.device("cpu"), len(steps))
    engine.module.train()
    collate, tok = engine.core.objective.collate, engine.core.encoder.tokenizer
    counter = OpCounter()
    for s, texts in enumerate(steps):
        batch = collate(texts, tok, LENGTH)
        if s == len(steps) - 1:
            with counter:
                engine.step(batch, s)
        else:
            engine.step(batch, s)
    engine.read_losses(len(steps))
    return counter.ops


def plain_ops(model: str, objective: str, steps: list) -> tuple[collections.Counter, int]:
    """The plain step's operators, and how many host reads its optimizer made (AdamW's step counts)."""
    from raycse.platform.process_state import seed_everything
    from raycse.train.module import build_module

    run = gpu_like_run(model, objective)
    seed_everything(0)
    module = build_module(run).train()
    enc, obj = module.encoder, module.objective
    opt = torch.optim.AdamW(module.parameters(), lr=1e-5, foreach=True)  # (what AdamW picks on a GPU)
    counter, optimizer = OpCounter(), OpCounter()

    for s, texts in enumerate(steps):
        b = obj.collate(texts, enc.tokenizer, LENGTH)  # (outside the count, as the engine's is)
        last = s == len(steps) - 1
        with counter if last else contextlib.nullcontext():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = obj(enc, b).loss
            loss.backward()
            with optimizer if last else contextlib.nullcontext():
                opt.step()
            opt.zero_grad(set_to_none=True)
    return counter.ops, optimizer.ops[HOST_READ]


def compare(model: str, objective: str, n_steps: int = 3) -> dict:
    steps = batches(n_steps)
    (plain, optimizer_reads), engine = plain_ops(model, objective, steps), engine_ops(model, objective, steps)
    diff = {op: engine[op] - plain[op] for op in set(plain) | set(engine) if engine[op] != plain[op]}
    # foreach AdamW reads each parameter's step count back (a host scalar a parameter) where the counts
    # live with CPU parameters; on a GPU they stay on the host and nothing is read: left out of gpu_ratio
    plain_gpu = sum(plain.values()) - optimizer_reads
    return {"objective": objective, "plain": sum(plain.values()), "engine": sum(engine.values()),
            "ratio": sum(engine.values()) / sum(plain.values()), "plain_without_host_reads": plain_gpu,
            "gpu_ratio": sum(engine.values()) / plain_gpu, "engine_host_reads": engine[HOST_READ],
            "plain_host_reads_outside_adamw": plain[HOST_READ] - optimizer_reads,
            "differences": dict(sorted(diff.items(), key=lambda kv: -abs(kv[1])))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="'tiny' (2-layer BERT, default), 'default' (MiniLM) or a path")
    ap.add_argument("--objective", nargs="+", default=["simcse"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="raycse-step-ops-") as tmp:
        if args.model == "tiny":
            model = tiny_model(Path(tmp) / "tiny")
        elif args.model == "default":
            from raycse.model.loading import embedded_model_path

            model = str(embedded_model_path())
        else:
            model = args.model
        rows = [compare(model, o) for o in args.objective]
    for row in rows:
        print(f"[step-ops] {row['objective']}: engine {row['engine']} operators a step, plain {row['plain']}: "
              f"{row['ratio']:.3f}x; without the plain AdamW's host reads of its step counts (none on a GPU) "
              f"{row['plain_without_host_reads']}: {row['gpu_ratio']:.3f}x; host reads a step: engine "
              f"{row['engine_host_reads']}, plain outside AdamW {row['plain_host_reads_outside_adamw']} "
              f"(transformers' own mask check)", flush=True)
        for op, n in list(row["differences"].items())[:15]:
            print(f"    {op:40s} {n:+d}")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "torch": torch.__version__, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
