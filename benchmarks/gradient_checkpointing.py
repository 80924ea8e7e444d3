"""Activation checkpointing (``--gradient-checkpointing``) against the plain step: peak memory and sentences/s
(issue 107 item 3), and raycse's memory estimate (raycse.train.memory, issue 107 item 6) beside the measured peak.

    python benchmarks/gradient_checkpointing.py --batch 64 --length 128 --steps 3
    python benchmarks/gradient_checkpointing.py --decoder --batch 32 --length 64 --unpad false

SimCSE on all-MiniLM-L6-v2 (the embedded default), CPU, fp32, wiki_sample.txt sentences repeated to reach
``--length`` tokens, so activations (which grow with the tokens) weigh against the weights. Each way runs in a
fresh process: a warm-up step, then ``--steps`` timed steps (forward + backward + AdamW); peak memory = the
process's peak resident set (ru_maxrss) minus its resident set before the first step; "saved" = the bytes
autograd keeps between one forward and its backward (counted by saved-tensor hooks). Both ways side by side,
as ratios. ``--unpad false`` measures HF's padded layers (the model's own checkpointing) instead of raycse's.
``--decoder``: a ~150M-parameter Qwen3 built from its config with random weights (20 layers, 768 wide, MiniLM's
tokenizer), last-token pooling. "estimate" is raycse's pre-flight estimate of a worker's memory less the weights
(the measured peak starts after they are loaded).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from common import machine


def decoder(root) -> str:
    """A ~150M-parameter Qwen3 from its config (random weights) with the embedded MiniLM's tokenizer, saved."""
    import shutil
    from pathlib import Path

    import torch
    from transformers import AutoModel, Qwen3Config

    from raycse.model.loading import embedded_model_path

    path = Path(root) / "qwen3-150m"
    if not (path / "config.json").is_file():
        torch.manual_seed(0)
        config = Qwen3Config(vocab_size=30522, hidden_size=768, intermediate_size=2048, num_hidden_layers=20,
                             num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=512,
                             pad_token_id=0)
        AutoModel.from_config(config).save_pretrained(path)
        for f in Path(embedded_model_path()).iterdir():
            if "token" in f.name or f.name == "vocab.txt":
                shutil.copy(f, path / f.name)
    return str(path)


def one(checkpointing: bool, batch: int, length: int, steps: int, unpad: bool, model: str = "") -> dict:
    """Runs in its own process: one way, its peak memory, saved activations and speed."""
    import resource
    import time

    import torch

    from common import first_sentences
    from raycse.config import RunConfig
    from raycse.train.memory import estimate
    from raycse.train.module import build_module, build_optimizer

    run = RunConfig()
    run.train.precision, run.train.gradient_checkpointing, run.train.unpad = "fp32", checkpointing, unpad
    run.train.batch_size, run.model.max_length = batch, length
    if model:
        run.model.name_or_path, run.model.pooling = model, "lasttoken"
    run = run.resolved()
    guess = estimate(run, run.model.name_or_path if model else __import__("raycse.model.encoder", fromlist=["x"])
                     .resolve_model("default"))
    module = build_module(run).train()
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
            "sent_per_s": batch * steps / seconds, "tokens": int(batches[0]["input_ids"].shape[1]),
            "estimate_mb": (guess.total - guess.weights) / 2**20, "params": guess.params}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--unpad", choices=["true", "false"], default="true")
    ap.add_argument("--decoder", action="store_true", help="a ~150M Qwen3 from its config instead of MiniLM")
    ap.add_argument("--json", help="write the two rows here")
    ap.add_argument("--child", nargs=5, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-model", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one(bool(args.child[0]), *args.child[1:4], bool(args.child[4]), args.child_model)))
        return
    import tempfile

    unpad = int(args.unpad == "true")
    model = decoder(tempfile.gettempdir()) if args.decoder else ""
    print(f"# {machine()}; SimCSE, {'Qwen3 ~150M (random)' if model else 'all-MiniLM-L6-v2'}, fp32, batch "
          f"{args.batch}, length {args.length}, {'unpadded' if unpad else 'padded'} layers, {args.steps} timed steps "
          f"after 1 warm-up")
    rows = []
    for ckpt in (0, 1):
        out = subprocess.run([sys.executable, __file__, "--child", str(ckpt), str(args.batch), str(args.length),
                              str(args.steps), str(unpad), "--child-model", model], capture_output=True, text=True,
                             check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    plain, ckpt = rows
    print(f"{'way':<14} {'peak MB':>9} {'estimate MB':>12} {'saved MB':>9} {'sent/s':>8}")
    for row in rows:
        print(f"{'checkpointed' if row['checkpointing'] else 'plain':<14} {row['peak_mb']:>9.0f} "
              f"{row['estimate_mb']:>12.0f} {row['saved_mb']:>9.1f} {row['sent_per_s']:>8.1f}")
    print("estimate / measured peak: " + ", ".join(
        f"{'checkpointed' if r['checkpointing'] else 'plain'} {r['estimate_mb'] / r['peak_mb']:.2f}x" for r in rows))
    print(f"checkpointed / plain: peak {ckpt['peak_mb'] / plain['peak_mb']:.2f}x, saved activations "
          f"{ckpt['saved_mb'] / plain['saved_mb']:.2f}x, speed {ckpt['sent_per_s'] / plain['sent_per_s']:.2f}x "
          f"({plain['tokens']} tokens a sentence)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": machine(), "settings": vars(args), "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
