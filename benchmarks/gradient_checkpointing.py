"""Activation checkpointing (``--gradient-checkpointing``) against the plain step: peak memory and sentences/s
(issue 107 item 3).

    python benchmarks/gradient_checkpointing.py --batch 64 --length 128 --steps 3

SimCSE on all-MiniLM-L6-v2 (the embedded default), CPU, fp32, wiki_sample.txt sentences repeated to reach
``--length`` tokens, so activations (which grow with the tokens) weigh against the weights. Each way runs in a
fresh process: a warm-up step, then ``--steps`` timed steps (forward + backward + AdamW); peak memory = the
process's peak resident set (ru_maxrss) minus its resident set before the first step; "saved" = the bytes
autograd keeps between one forward and its backward (counted by saved-tensor hooks). Both ways side by side,
as ratios. ``--unpad false`` measures HF's padded layers (the model's own checkpointing) instead of raycse's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from common import machine


def one(checkpointing: bool, batch: int, length: int, steps: int, unpad: bool) -> dict:
    """Runs in its own process: one way, its peak memory, saved activations and speed."""
    import resource
    import time

    import torch

    from common import first_sentences
    from raycse.config import RunConfig
    from raycse.train.module import build_module, build_optimizer

    run = RunConfig()
    run.train.precision, run.train.gradient_checkpointing, run.train.unpad = "fp32", checkpointing, unpad
    run.model.max_length = length
    module = build_module(run.resolved()).train()
    opt, sched = build_optimizer(module, run, 1000)
    texts = first_sentences(batch * (steps + 1))
    texts = [" ".join([t] * 6) for t in texts]  # (long enough for --length tokens)
    batches = [module.objective.collate(texts[i * batch:(i + 1) * batch], module.encoder.tokenizer, length)
               for i in range(steps + 1)]
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    def step(b):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = module(b).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)

    step(batches[0])
    kept = sum(saved)
    t0 = time.perf_counter()
    for b in batches[1:]:
        step(b)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"checkpointing": checkpointing, "peak_mb": (peak - rss0) / 1024, "saved_mb": kept / 2**20,
            "sent_per_s": batch * steps / seconds, "tokens": int(batches[0]["input_ids"].shape[1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--unpad", choices=["true", "false"], default="true")
    ap.add_argument("--json", help="write the two rows here")
    ap.add_argument("--child", nargs=5, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one(bool(args.child[0]), *args.child[1:4], bool(args.child[4]))))
        return
    unpad = int(args.unpad == "true")
    print(f"# {machine()}; SimCSE, all-MiniLM-L6-v2, fp32, batch {args.batch}, length {args.length}, "
          f"{'unpadded' if unpad else 'padded'} layers, {args.steps} timed steps after 1 warm-up")
    rows = []
    for ckpt in (0, 1):
        out = subprocess.run([sys.executable, __file__, "--child", str(ckpt), str(args.batch), str(args.length),
                              str(args.steps), str(unpad)], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    plain, ckpt = rows
    print(f"{'way':<14} {'peak MB':>9} {'saved MB':>9} {'sent/s':>8}")
    for row in rows:
        print(f"{'checkpointed' if row['checkpointing'] else 'plain':<14} {row['peak_mb']:>9.0f} "
              f"{row['saved_mb']:>9.1f} {row['sent_per_s']:>8.1f}")
    print(f"checkpointed / plain: peak {ckpt['peak_mb'] / plain['peak_mb']:.2f}x, saved activations "
          f"{ckpt['saved_mb'] / plain['saved_mb']:.2f}x, speed {ckpt['sent_per_s'] / plain['sent_per_s']:.2f}x "
          f"({plain['tokens']} tokens a sentence)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": machine(), "settings": vars(args), "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
