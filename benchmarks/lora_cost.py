"""LoRA adapters against full fine-tuning: peak memory and step time (issue 68, item 4).

    python benchmarks/lora_cost.py [--steps 8] [--batch 32] [--r 8] [--json FILE]

A BERT-base-sized encoder built here with random weights (12 layers, 768 wide, 3072 inner, 30,522
tokens: 109M parameters), SimCSE with cls pooling (its MLP head trains in both), CPU, fp32, max
length 32, wiki_sample.txt sentences, one worker in this process (raycse's module, optimizer and step
as a worker runs them: unpadded BERT layers, oneDNN linears where they are faster).

- Step time: both modules in this one process, timed in alternating blocks after a warm-up step
  each (forward + backward + AdamW); the figure is LoRA's mean step time against full fine-tuning's.
- Peak memory: each way in a fresh process, its peak resident set (ru_maxrss) minus its resident
  set once the model is built, so what training adds: gradients, AdamW's two moments, activations.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import first_sentences, machine

BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)


def build_model(path: Path) -> Path:
    """A random BERT-base with the embedded model's tokenizer (any WordPiece vocabulary of this size works)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from raycse.model.loading import embedded_model_path

    torch.manual_seed(0)
    BertModel(BertConfig(**BASE)).save_pretrained(path)
    AutoTokenizer.from_pretrained(embedded_model_path()).save_pretrained(path)
    return path


def module_and_optimizer(model: Path, lora: dict, batch: int):
    from raycse.config import RunConfig
    from raycse.platform.process_state import seed_everything
    from raycse.train.module import build_module, build_optimizer

    run = RunConfig()
    run.model.name_or_path, run.model.pooling, run.model.max_length, run.model.lora = str(model), "cls", 32, lora
    run.train.batch_size = batch
    run.validate()
    seed_everything(0)
    module = build_module(run).train()
    opt, _ = build_optimizer(module, run, total_steps=1000)
    return module, opt


def step(module, opt, batch) -> None:
    loss = module(batch).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def batches(module, size: int, count: int) -> list:
    texts = first_sentences(size * count)
    return [module.objective.collate(texts[i * size:(i + 1) * size], module.encoder.tokenizer, 32)
            for i in range(count)]


def peak_memory(model: str, lora: dict, batch: int, steps: int) -> None:
    """In its own process: what training adds to the built model's resident set, in MB."""
    import resource

    module, opt = module_and_optimizer(Path(model), lora, batch)
    data = batches(module, batch, steps)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for b in data:
        step(module, opt, b)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("RESULT", json.dumps({"built_mb": before / 1024, "training_mb": (peak - before) / 1024}), flush=True)


def in_fresh_process(model: Path, lora: dict, batch: int, steps: int) -> dict:
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import lora_cost; "
            f"lora_cost.peak_memory({str(model)!r}, {lora!r}, {batch}, {steps})")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"lora_cost.py: error: the memory run failed: {done.stderr[-2000:]}")
    return json.loads(lines[0][len("RESULT "):])


def step_times(model: Path, lora: dict, batch: int, steps: int) -> dict:
    """Mean seconds a step, full and LoRA, in alternating blocks of this one process."""
    ways = {"full": module_and_optimizer(model, {}, batch), "lora": module_and_optimizer(model, lora, batch)}
    data = batches(ways["full"][0], batch, steps)
    times = {name: [] for name in ways}
    for name, (module, opt) in ways.items():
        step(module, opt, data[0])  # warm-up: first shapes, kernel choice, allocator
    for block in range(2):
        for name, (module, opt) in ways.items():
            for b in data[block::2]:
                start = time.perf_counter()
                step(module, opt, b)
                times[name].append(time.perf_counter() - start)
    counts = {name: (sum(p.numel() for p in m.parameters() if p.requires_grad), sum(p.numel() for p in m.parameters()))
              for name, (m, _) in ways.items()}
    return {name: {"step_s": sum(t) / len(t), "steps": len(t), "trainable": counts[name][0], "total": counts[name][1]}
            for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8, help="timed steps per way (default 8)")
    ap.add_argument("--batch", type=int, default=32, help="sentences per step (default 32)")
    ap.add_argument("--r", type=int, default=8, help="LoRA rank, on peft's targets for BERT (query, value)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    lora = {"r": args.r, "alpha": 2 * args.r}
    with tempfile.TemporaryDirectory(prefix="lora-cost-") as tmp:
        model = build_model(Path(tmp) / "bert-base-random")
        memory = {"full": in_fresh_process(model, {}, args.batch, 3), "lora": in_fresh_process(model, lora, args.batch, 3)}
        speed = step_times(model, lora, args.batch, args.steps)
    print(f"machine: {machine()}")
    print(f"BERT-base sized, random weights; SimCSE, batch {args.batch}, max length 32, fp32, LoRA r={args.r} "
          f"alpha={2 * args.r} on query, value")
    print(f"{'':6} {'trainable':>12} {'of':>12} {'step (s)':>9} {'training adds (MB)':>19}")
    for name in ("full", "lora"):
        s = speed[name]
        print(f"{name:6} {s['trainable']:>12,} {s['total']:>12,} {s['step_s']:9.3f} {memory[name]['training_mb']:19.0f}")
    print(f"LoRA / full: step time {speed['lora']['step_s'] / speed['full']['step_s']:.2f}x, memory training adds "
          f"{memory['lora']['training_mb'] / memory['full']['training_mb']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "batch": args.batch, "r": args.r,
                                               "speed": speed, "memory": memory}, indent=1))


if __name__ == "__main__":
    main()
