"""Collating the next batch on a helper thread (train.collate_ahead) vs in the training thread.

Two measurements, one process:
1. ``raycse train`` (SimCSE, 1 worker, batch 128, max length 32, fp32, no dev scoring), the same
   run with ``train.collate_ahead`` false and true, ``--rounds`` times in alternating order after an
   uncounted warm-up fit: the loop's
   sentences/s (median) and whether the loss histories are equal (they must be).
2. The same step in a plain process (no Ray): tokenize + step one after the other vs the next
   batch tokenized on a helper thread during the step: what the helper gives where a core is free.

``--model cheap`` (default) is a 1-layer, 32-wide BERT with all-MiniLM-L6-v2's tokenizer: a step
whose model work is small beside the tokenizing, as a GPU's is; ``--model default`` is MiniLM.

    python benchmarks/collate_ahead.py --rounds 2
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import WIKI, first_sentences, machine, train_run  # noqa: E402


def cheap_model(directory: Path) -> str:
    from transformers import AutoTokenizer, BertConfig, BertModel

    from raycse.model.loading import embedded_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_path()))
    tokenizer.save_pretrained(directory)
    BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(directory)
    return str(directory)


def in_ray(model: str, rounds: int, epochs: int, tmp: str) -> dict:
    settings = {"model.name_or_path": model, "model.max_length": 32, "data.corpus": str(WIKI), "train.batch_size": 128,
                "train.num_workers": 1, "train.precision": "fp32", "train.log_steps": 50, "eval.stsb_dev": "none"}
    # the process's first fit runs slower (measured: 2,295 vs ~3,200 sentences/s); it is not counted
    train_run(f"{tmp}/warm-up", {**settings, "train.max_steps": 30})
    speeds, losses = {"false": [], "true": []}, {}
    for r in range(rounds):
        for mode in (("false", "true") if r % 2 == 0 else ("true", "false")):
            m = train_run(f"{tmp}/run-{mode}-{r}", {**settings, "train.epochs": epochs,
                                                    "train.collate_ahead": mode}).metrics["last"]
            speeds[mode].append(m["train_examples_per_s"])
            losses.setdefault(mode, m["loss_history"])
            print(f"  round {r + 1}, collate_ahead {mode}: {m['train_examples_per_s']:.0f} sentences/s "
                  f"({m['step']} steps)", flush=True)
    return {mode: statistics.median(v) for mode, v in speeds.items()} | {"equal": losses["false"] == losses["true"]}


def plain(model: str, steps: int = 30) -> dict:
    import torch

    from raycse.model.encoder import Encoder
    from raycse.objectives import registry

    enc = Encoder.from_pretrained(model).train()
    obj = registry.build("simcse", {})
    opt = torch.optim.AdamW(enc.parameters(), lr=1e-5, fused=True)
    texts = first_sentences(128 * (steps + 1))
    rows = [texts[i * 128:(i + 1) * 128] for i in range(steps + 1)]
    helper_tokenizer, pool = copy.deepcopy(enc.tokenizer), ThreadPoolExecutor(1)

    def step(batch):
        obj(enc, batch).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step(obj.collate(rows[0], enc.tokenizer, 32))  # warm-up
    t0 = time.perf_counter()
    for i in range(steps):
        step(obj.collate(rows[i], enc.tokenizer, 32))
    serial = (time.perf_counter() - t0) / steps
    t0, batch = time.perf_counter(), obj.collate(rows[0], enc.tokenizer, 32)
    for i in range(steps):
        following = pool.submit(obj.collate, rows[i + 1], helper_tokenizer, 32)
        step(batch)
        batch = following.result()
    ahead = (time.perf_counter() - t0) / steps
    return {"false": 128 / serial, "true": 128 / ahead}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="cheap", help="cheap (default), default (MiniLM) or a path")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3, help="epochs of wiki_sample (93 steps of 128 each)")
    args = ap.parse_args()
    print(f"machine: {machine()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="raycse-bench-") as tmp:
        if args.model == "cheap":
            model = cheap_model(Path(tmp) / "cheap")
        else:
            from raycse.model.loading import resolve_model

            model = resolve_model(args.model)
        rows = {"raycse train (Ray worker)": in_ray(model, args.rounds, args.epochs, tmp)}
        rows["plain process, no Ray"] = plain(model)
    print(f"\nSimCSE, batch 128, max length 32, fp32, model {args.model}; sentences/s")
    print(f"{'where':28s} {'inline':>9s} {'ahead':>9s} {'ratio':>7s}")
    for where, r in rows.items():
        print(f"{where:28s} {r['false']:9.0f} {r['true']:9.0f} {r['true'] / r['false']:6.2f}x"
              + (f"   loss histories equal: {r['equal']}" if "equal" in r else ""))


if __name__ == "__main__":
    main()
