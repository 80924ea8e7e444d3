"""SG-OPT vs SimCSE: one epoch on wiki_sample.txt from all-MiniLM-L6-v2, same seed, batch and lr:
STS-B dev before/after, training sentences/s and peak resident memory of the training worker.

    python benchmarks/sgopt.py [--sentences N]
"""

from __future__ import annotations

import argparse
import tempfile

from common import WIKI, machine, train_run


def run(objective: str, params: dict, args, out: str) -> dict:
    return train_run(out, {"data.corpus": str(WIKI), "data.max_sentences": args.sentences, "objective.name": objective,
                           "objective.params": params, "model.max_length": 32, "train.batch_size": args.batch_size,
                           "train.lr": args.lr, "train.log_steps": 25}).metrics["last"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=None, help="default: the whole file (11,914)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-5)
    args = ap.parse_args()
    print(f"# {machine()}; {WIKI.name}, batch {args.batch_size}, lr {args.lr}, max_len 32, 1 epoch, precision auto")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        rows["SimCSE"] = run("simcse", {"tau": 0.05}, args, f"{tmp}/simcse")
        rows["SG-OPT"] = run("sgopt", {"tau": 0.01, "lam": 0.1}, args, f"{tmp}/sgopt")
    print(f"{'objective':10s} {'dev before':>10s} {'dev after':>10s} {'sent/s':>8s} {'peak RSS MB':>12s}")
    for name, m in rows.items():
        print(f"{name:10s} {m['stsb_dev_spearman_initial']:10.2f} {m['stsb_dev_spearman']:10.2f} "
              f"{m['train_examples_per_s']:8.1f} {m['peak_rss_mb']:12.0f}")
    print(f"SG-OPT/SimCSE throughput: {rows['SG-OPT']['train_examples_per_s'] / rows['SimCSE']['train_examples_per_s']:.2f}x, "
          f"peak memory: {rows['SG-OPT']['peak_rss_mb'] / rows['SimCSE']['peak_rss_mb']:.2f}x")


if __name__ == "__main__":
    main()
