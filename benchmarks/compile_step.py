"""The compiled step (train.compile) against the eager one, in one process, on the CPU (issue 91, item 2).

For each objective (SimCSE, and CompCSE, whose views make a batch of its own shape), raycse's StepEngine
with the run's resolved settings, eager and then with ``train.compile`` (inductor's default mode), on the
same wiki batches (batch --batch, max length 32): the first step's seconds (the compile), the median
step after --warmup steps, the ratio, the losses' largest difference with dropout off (the two must
agree within the precision's rounding) and the graphs built. The eager step is raycse's default: unpadded
BERT layers, drawn dropout masks, 2 length buckets; the compiled one runs padded with PyTorch's dropout.

    python benchmarks/compile_step.py --steps 20
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python benchmarks/compile_step.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import WIKI, first_sentences, machine  # noqa: E402


def engine(model: str, objective: str, compiled: bool, precision: str, total: int):
    import torch

    from raycse.config import RunConfig
    from raycse.platform.process_state import seed_everything
    from raycse.train.module import build_module, compile_module
    from raycse.train.steps import StepEngine

    run = RunConfig()
    run.model.name_or_path, run.model.max_length, run.objective.name = model, 32, objective
    run.train.precision, run.train.compile = precision, "true" if compiled else "false"
    run.validate()
    seed_everything(0)
    module = compile_module(build_module(run), run.train.compile_mode)
    return StepEngine(run, module, torch.device("cpu"), total)


def timed_steps(eng, batches: list, dropout: bool = True) -> tuple[list, list]:
    """Each step's seconds and the losses; ``dropout`` False: the module in eval mode (no dropout, the
    same gradient maths), so eager and compiled see the same views."""
    eng.module.train(dropout)
    collate, tok = eng.core.objective.collate, eng.core.encoder.tokenizer
    times = []
    for s, texts in enumerate(batches):
        t0 = time.perf_counter()
        eng.step(collate(texts, tok, 32), s)
        times.append(time.perf_counter() - t0)
    return times, eng.read_losses(len(batches))


def one_objective(model: str, objective: str, batches: list, warmup: int, precision: str) -> dict:
    import torch._dynamo

    from raycse.platform.compat import compiled_graph_count as compiled_graphs

    row = {}
    for compiled in (False, True):
        torch._dynamo.reset()
        before = compiled_graphs() or 0
        times, _ = timed_steps(engine(model, objective, compiled, precision, len(batches)), batches)
        key = "compiled" if compiled else "eager"
        row[key] = {"first_step_s": times[0], "median_step_s": statistics.median(times[warmup:]),
                    "sent_per_s": len(batches[0]) / statistics.median(times[warmup:])}
        if compiled:
            row[key]["graphs"] = (compiled_graphs() or 0) - before
        print(f"  {objective:8s} {key:9s} first step {times[0]:6.2f} s, then {row[key]['median_step_s'] * 1000:7.1f} ms "
              f"a step ({row[key]['sent_per_s']:.0f} sent/s)", flush=True)
    row["speedup"] = row["compiled"]["sent_per_s"] / row["eager"]["sent_per_s"]
    # equality: a few steps without dropout (the two draw their masks differently), same batches
    short = batches[:4]
    losses = {c: timed_steps(engine(model, objective, c, precision, len(short)), short, dropout=False)[1]
              for c in (False, True)}
    row["largest_loss_difference"] = max(abs(a - b) for a, b in zip(losses[False], losses[True]))
    print(f"  {objective:8s} compiled / eager: {row['speedup']:.2f}x; losses without dropout differ by at most "
          f"{row['largest_loss_difference']:.2e}", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="'default' (the embedded all-MiniLM-L6-v2) or a path")
    ap.add_argument("--objectives", nargs="+", default=["simcse", "compcse"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20, help="timed steps after the first")
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the median (the first shapes)")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from raycse.model.loading import embedded_model_path

    model = str(embedded_model_path()) if args.model == "default" else args.model
    texts = first_sentences(args.batch * (args.steps + args.warmup + 1), WIKI)
    batches = [texts[i * args.batch:(i + 1) * args.batch] for i in range(args.steps + args.warmup + 1)]
    import torch

    print(f"[compile-step] {machine()}, torch {torch.__version__}, precision {args.precision}, batch {args.batch}",
          flush=True)
    report = {"machine": machine(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "model": args.model,
              "batch": args.batch, "precision": args.precision,
              "rows": {o: one_objective(model, o, batches, args.warmup, args.precision) for o in args.objectives}}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
