"""HiCL vs SimCSE training throughput on long inputs at max length 512, same model and batch,
with the peak resident memory of the training worker.

Documents: consecutive wiki_sample.txt sentences concatenated until each holds 300-500 tokens.

    python benchmarks/hicl_speed.py --docs 64 --batch-size 8 --steps 6
"""

from __future__ import annotations

import argparse
import json
import tempfile

from common import WIKI, machine, train_run
from raycse.model.encoder import Encoder


def make_documents(n: int, low: int = 300, high: int = 500) -> list[str]:
    tok = Encoder.from_pretrained("default").tokenizer
    docs, cur, cur_len = [], [], 0
    for line in WIKI.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        k = len(tok(line)["input_ids"]) - 2
        if cur_len + k > high and cur_len >= low:
            docs.append(" ".join(cur))
            cur, cur_len = [], 0
            if len(docs) == n:
                break
        cur.append(line.strip())
        cur_len += k
    return docs


def run(objective: str, params: dict, corpus: str, args, out: str) -> dict:
    return train_run(out, {"data.corpus": corpus, "objective.name": objective, "objective.params": params,
                           "model.max_length": 512, "train.batch_size": args.batch_size, "train.max_steps": args.steps,
                           "train.log_steps": 1, "eval.stsb_dev": "none"}).metrics["last"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    docs = make_documents(args.docs)
    tok = Encoder.from_pretrained("default").tokenizer
    lengths = [len(tok(d)["input_ids"]) for d in docs]
    print(f"# {machine()}; {len(docs)} documents of {min(lengths)}-{max(lengths)} tokens (mean "
          f"{sum(lengths) / len(lengths):.0f}), max length 512, batch {args.batch_size}, {args.steps} steps, precision auto")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = f"{tmp}/docs.txt"
        with open(corpus, "w") as fh:
            fh.write("\n".join(docs) + "\n")
        rows = {"SimCSE": run("simcse", {}, corpus, args, f"{tmp}/s"),
                "HiCL (alpha 0.05, L 32)": run("hicl", {"alpha": 0.05, "slice_length": 32}, corpus, args, f"{tmp}/h")}
    print(f"{'objective':24s} {'docs/s':>8s} {'s/step':>8s} {'peak RSS MB':>12s}")
    for name, m in rows.items():
        print(f"{name:24s} {m['train_examples_per_s']:8.2f} {m['train_seconds'] / m['step']:8.2f} {m['peak_rss_mb']:12.0f}")
    s, h = rows["SimCSE"], rows["HiCL (alpha 0.05, L 32)"]
    print(f"HiCL speed-up: {h['train_examples_per_s'] / s['train_examples_per_s']:.2f}x, "
          f"peak memory HiCL/SimCSE: {h['peak_rss_mb'] / s['peak_rss_mb']:.2f}x")
    print(json.dumps({k: {kk: v[kk] for kk in ('train_examples_per_s', 'peak_rss_mb')} for k, v in rows.items()}))


if __name__ == "__main__":
    main()
