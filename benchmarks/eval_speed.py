"""STS evaluation speed: raycse's evaluator (unique sentences once, length-sorted batches, BERT layers on
real tokens only, float32 linears on oneDNN) vs a naive loop (every pair embedded in file order, batch 128,
the plain padded Hugging Face forward + mean pooling, PyTorch's default kernels), same model, same data,
same process. A third line per precision runs raycse's evaluator with PyTorch's default (MKL) float32
linears, to show what the evaluator's structure alone gives.

    python benchmarks/eval_speed.py [--repeat 2]

Data: STS-B dev + STS-B train from ../shared (7,249 pairs); the SentEval test sets are not shipped
here, and the work per pair is the same.
"""

from __future__ import annotations

import argparse
import time

import torch

from common import STSB_DEV, STSB_TRAIN, machine
import numpy as np

from raycse.evaluation.sts import cosine_rows, evaluate_datasets, read_stsb, spearman100
from raycse.model.encoder import Encoder


def naive_evaluate(embed, datasets, batch_size: int = 128) -> dict[str, float]:
    """The baseline: every pair embedded in file order, as a hand-written loop would (no sorting, no dedup)."""
    scores = {}
    for d in datasets:
        sims = [cosine_rows(embed(d.sent1[s:s + batch_size]), embed(d.sent2[s:s + batch_size]))
                for s in range(0, len(d), batch_size)]
        scores[d.name] = spearman100(np.concatenate(sims), d.gold)
    return scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    data = [read_stsb(STSB_DEV, "stsb_dev"), read_stsb(STSB_TRAIN, "stsb_train")]
    enc = Encoder.from_pretrained(args.model)
    print(f"# {machine()}; model {args.model}; {sum(len(d) for d in data)} pairs, "
          f"{len({s for d in data for s in d.sent1 + d.sent2})} unique sentences")
    enc.encode(["warm up"] * 8)
    best = {}
    for prec, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        naive = lambda: naive_evaluate(  # noqa: E731
            lambda xs: enc.encode(xs, batch_size=len(xs), autocast_dtype=dtype), data, 128)
        fast = lambda: evaluate_datasets(lambda xs: enc.encode(xs, batch_size=128, autocast_dtype=dtype), data)  # noqa: E731
        # the naive loop calls the padded HF forward with default kernels, as a hand-written loop would
        variants = [(f"naive {prec}", naive, False, False), (f"raycse {prec}", fast, True, True)]
        if dtype is None:  # (bf16 autocast runs its linears on oneDNN anyway)
            variants.append(("raycse fp32 MKL", fast, True, False))
        for name, fn, unpad, onednn in variants:
            enc.unpad, enc.onednn = unpad, onednn
            for _ in range(args.repeat):
                t = time.perf_counter()
                scores = fn()
                best[name] = min(time.perf_counter() - t, best.get(name, float("inf")))
            print(f"{name:16s} {best[name]:7.1f} s   " + "  ".join(f"{k} {v:.3f}" for k, v in scores.items() if k != "avg"))
    for prec in ("fp32", "bf16"):
        print(f"speed-up raycse {prec} vs naive {prec}: {best[f'naive {prec}'] / best[f'raycse {prec}']:.2f}x")
    print(f"speed-up raycse fp32 with MKL linears (structure alone) vs naive fp32: "
          f"{best['naive fp32'] / best['raycse fp32 MKL']:.2f}x")
    print(f"speed-up raycse bf16 vs naive fp32: {best['naive fp32'] / best['raycse bf16']:.2f}x")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
