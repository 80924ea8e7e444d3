"""BSC (combo, mu 0.5) vs sentence-transformers' CoSENTLoss: fine-tune all-MiniLM-L6-v2 on STS-B train,
STS-B dev Spearman x100 before/after, same data, epochs, batch, lr and max length, side by side.

    python benchmarks/bsc_quality.py --epochs 1
"""

from __future__ import annotations

import argparse
import tempfile
import time

from common import STSB_DEV, STSB_TRAIN, machine, train_run
from raycse.data.corpus import ExampleColumns, read_examples
from raycse.evaluation.sts import evaluate_datasets, read_stsb


def run_bsc(args, out: str) -> dict:
    m = train_run(out, {"data.corpus": str(STSB_TRAIN), "data.format": "stsb", "objective.name": "bsc",
                        "objective.params": {"mu": args.mu, "tau": args.tau, "normalization": "l2",
                                             "threshold": 0.5},
                        "model.max_length": args.max_length, "train.batch_size": args.batch_size, "train.lr": args.lr,
                        "train.epochs": args.epochs, "train.warmup_ratio": 0.1, "train.log_steps": 20}).metrics["last"]
    return {"before": m["stsb_dev_spearman_initial"], "after": m["stsb_dev_spearman"], "train_s": m["train_seconds"]}


def run_cosent(args, dev) -> dict:
    import torch
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.losses import CoSENTLoss

    from raycse.model.loading import embedded_model_path

    torch.manual_seed(42)
    model = SentenceTransformer(str(embedded_model_path()), device="cpu")
    eval_length = model.max_seq_length
    score = lambda: evaluate_datasets(lambda xs: model.encode(xs, batch_size=128), [dev])[dev.name]  # noqa: E731
    before = score()
    pairs, _ = read_examples(str(STSB_TRAIN), "stsb", ExampleColumns(stsb=True))
    data = Dataset.from_dict({"s1": [p[0] for p in pairs], "s2": [p[1] for p in pairs],
                              "score": [p[2] for p in pairs]})
    model.max_seq_length = args.max_length
    with tempfile.TemporaryDirectory() as tmp:
        targs = SentenceTransformerTrainingArguments(
            output_dir=tmp, per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
            num_train_epochs=args.epochs, warmup_steps=0.1, seed=42, bf16=True, use_cpu=True, report_to=[],
            save_strategy="no", logging_steps=50, disable_tqdm=True)
        t = time.perf_counter()
        SentenceTransformerTrainer(model=model, args=targs, train_dataset=data, loss=CoSENTLoss(model)).train()
        dt = time.perf_counter() - t
    model.max_seq_length = eval_length
    return {"before": before, "after": score(), "train_s": dt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--mu", type=float, default=0.5)
    ap.add_argument("--tau", type=float, default=0.05)
    args = ap.parse_args()
    dev = read_stsb(STSB_DEV, "stsb_dev")
    print(f"# {machine()}; STS-B train 5,749 pairs, {args.epochs} epoch(s), batch {args.batch_size}, lr {args.lr}, "
          f"max_len {args.max_length}, bf16 autocast for both")
    with tempfile.TemporaryDirectory() as tmp:
        rows = {"raycse BSC (mu %.1f)" % args.mu: run_bsc(args, f"{tmp}/bsc"), "ST CoSENTLoss": run_cosent(args, dev)}
    print(f"{'system':22s} {'dev before':>10s} {'dev after':>10s} {'train s':>8s}")
    for name, m in rows.items():
        print(f"{name:22s} {m['before']:10.2f} {m['after']:10.2f} {m['train_s']:8.1f}")


if __name__ == "__main__":
    main()
