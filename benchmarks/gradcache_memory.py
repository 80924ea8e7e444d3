"""GradCache vs the plain step: peak memory and sentences/s per batch size (issue 21).

    python benchmarks/gradcache_memory.py --batches 64 256 1024 --chunk 32

SimCSE on all-MiniLM-L6-v2 (the embedded default), CPU, fp32, max length 32, wiki_sample.txt
sentences. Each (batch, way) runs in a fresh process: warm-up step, then ``--steps`` timed steps
(forward + backward + AdamW); peak memory = the process's peak resident set (ru_maxrss) minus its
resident set before the first step. The largest batch that fits in ``--budget-gb`` is projected
from the measured peaks: a straight line in the batch (activations plain; the B x d vectors cached)
plus the loss's B x B logits (3 fp32 copies), which dominate a cached step at tens of thousands.
Both ways side by side, as a ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np

from common import machine

LOGITS_GB = 12 / 1e9  # GB per B^2: SimCSE's B x B fp32 logits, their softmax and their gradient


def one(batch: int, chunk: int, steps: int) -> dict:
    """Runs in its own process: one configuration, its peak memory and speed."""
    import resource
    import time

    import torch

    from common import first_sentences
    from raycse.config import RunConfig
    from raycse.model.precision import autocast
    from raycse.train.gradcache import cached_step
    from raycse.train.module import build_module, build_optimizer

    torch.set_num_threads(max(1, torch.get_num_threads()))
    run = RunConfig()
    run.train.precision = "fp32"
    module = build_module(run).train()
    opt, sched = build_optimizer(module, run, 1000)
    texts = first_sentences(batch * (steps + 1))
    batches = [module.objective.collate(texts[i * batch:(i + 1) * batch], module.encoder.tokenizer, 32)
               for i in range(steps + 1)]
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux

    def step(b):
        if chunk:
            cached_step(module, b, chunk, lambda: autocast(torch.device("cpu"), None))
        else:
            module(b).loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)

    step(batches[0])
    t0 = time.perf_counter()
    for b in batches[1:]:
        step(b)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"batch": batch, "chunk": chunk, "peak_gb": (peak - rss0) / 2**20, "sent_per_s": batch * steps / seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--budget-gb", type=float, default=8.0)
    ap.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one(*args.child)))
        return
    print(f"# {machine()}; SimCSE, all-MiniLM-L6-v2, fp32, max length 32, {args.steps} timed steps after 1 warm-up")
    rows = {}
    for batch in args.batches:
        for chunk in (0, args.chunk):
            out = subprocess.run([sys.executable, __file__, "--child", str(batch), str(chunk), str(args.steps)],
                                 capture_output=True, text=True, check=True)
            rows[batch, chunk] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{'batch':>6s} {'plain GB':>9s} {'cached GB':>10s} {'GB ratio':>9s} {'plain sent/s':>13s} "
          f"{'cached sent/s':>14s} {'speed ratio':>12s}")
    for batch in args.batches:
        p, c = rows[batch, 0], rows[batch, args.chunk]
        print(f"{batch:6d} {p['peak_gb']:9.2f} {c['peak_gb']:10.2f} {c['peak_gb'] / p['peak_gb']:9.2f} "
              f"{p['sent_per_s']:13.1f} {c['sent_per_s']:14.1f} {c['sent_per_s'] / p['sent_per_s']:12.2f}")
    for chunk, name in ((0, "plain"), (args.chunk, f"cached (chunk {args.chunk})")):
        xs = np.array(args.batches, dtype=float)
        ys = np.array([rows[b, chunk]["peak_gb"] for b in args.batches]) - LOGITS_GB * xs ** 2
        slope, icept = np.polyfit(xs, ys, 1)
        # a + b B + c B^2 = budget (c: the B x B logits, their softmax and gradient in fp32)
        fits = int((-slope + np.sqrt(slope ** 2 + 4 * LOGITS_GB * (args.budget_gb - icept))) / (2 * LOGITS_GB))
        print(f"largest batch in {args.budget_gb:g} GB, {name}: ~{fits} (projected: {icept:.2f} GB + "
              f"{slope * 1024:.3f} GB per 1,024 sentences + 3 x 4 bytes x B^2 for the logits)")


if __name__ == "__main__":
    main()
