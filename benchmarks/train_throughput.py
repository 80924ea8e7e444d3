"""Training throughput and quality: raycse SimCSE (1 Ray Train worker) vs sentence-transformers'
MultipleNegativesRankingLoss on (s, s) pairs (the SimCSE recipe), side by side in one process.

Same model (all-MiniLM-L6-v2, embedded), batch 64, max length 32, lr 3e-5, tau 0.05 (MNRL scale 20),
the same first N sentences of wiki_sample.txt, one epoch, no warm-up. Throughput counts training
steps only (sentences / seconds of training), not start-up; STS-B dev Spearman x100 before and after.

    python benchmarks/train_throughput.py --sentences 4096 --precision fp32 bf16
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from common import STSB_DEV, WIKI, add_recipe_args, first_sentences, machine, train_run
from raycse.evaluation.sts import evaluate_datasets, read_stsb


def run_raycse(n: int, args, precision: str, out: str) -> dict:
    m = train_run(out, {"data.corpus": str(WIKI), "data.max_sentences": n, "model.max_length": args.max_length,
                        "objective.params": {"tau": 0.05}, "train.batch_size": args.batch_size,
                        "train.lr": args.lr, "train.precision": precision, "train.log_steps": 16}).metrics["last"]
    return {"sent_per_s": m["train_examples_per_s"], "before": m["stsb_dev_spearman_initial"],
            "after": m["stsb_dev_spearman"], "train_s": m["train_seconds"]}


def run_peer(texts: list[str], args, precision: str, dev) -> dict:
    import torch
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    from raycse.model.loading import embedded_model_path

    torch.manual_seed(42)
    model = SentenceTransformer(str(embedded_model_path()), device="cpu")
    eval_length = model.max_seq_length  # evaluate at the model's own length (256), as raycse does
    score = lambda: evaluate_datasets(lambda xs: model.encode(xs, batch_size=128), [dev])[dev.name]  # noqa: E731
    before = score()
    model.max_seq_length = args.max_length
    data = Dataset.from_dict({"anchor": texts, "positive": texts})
    with tempfile.TemporaryDirectory() as tmp:
        targs = SentenceTransformerTrainingArguments(
            output_dir=tmp, per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
            num_train_epochs=1, warmup_ratio=0.0, max_grad_norm=1.0, weight_decay=0.0, seed=42,
            bf16=(precision == "bf16"), use_cpu=True, report_to=[], save_strategy="no", logging_steps=16,
            dataloader_drop_last=True, disable_tqdm=True)
        trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=data,
                                             loss=MultipleNegativesRankingLoss(model, scale=1 / 0.05))
        t = time.perf_counter()
        trainer.train()
        dt = time.perf_counter() - t
    steps = len(texts) // args.batch_size
    model.max_seq_length = eval_length
    return {"sent_per_s": steps * args.batch_size / dt, "before": before, "after": score(), "train_s": dt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recipe_args(ap)
    ap.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--json", default=None, help="write the rows to this file")
    args = ap.parse_args()
    texts = first_sentences(args.sentences)
    dev = read_stsb(STSB_DEV, "stsb_dev")
    print(f"# {machine()}; {len(texts)} sentences of {WIKI.name}, batch {args.batch_size}, max_len {args.max_length}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for precision in args.precision:
            ours = run_raycse(args.sentences, args, precision, f"{tmp}/raycse-{precision}")
            peer = run_peer(texts, args, precision, dev)
            rows.append({"precision": precision, "raycse": ours, "peer": peer,
                         "ratio": ours["sent_per_s"] / peer["sent_per_s"]})
    print(f"{'precision':9s} {'system':22s} {'sent/s':>8s} {'train s':>8s} {'dev before':>10s} {'dev after':>10s}")
    for r in rows:
        for name, m in (("raycse SimCSE (Ray)", r["raycse"]), ("sentence-transformers", r["peer"])):
            print(f"{r['precision']:9s} {name:22s} {m['sent_per_s']:8.1f} {m['train_s']:8.1f} "
                  f"{m['before']:10.2f} {m['after']:10.2f}")
        print(f"{r['precision']:9s} ratio raycse/peer: {r['ratio']:.2f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
