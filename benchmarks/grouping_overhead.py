"""Training time with kNN regrouping every epoch vs a random order (the BSC paper reports +8%).

    python benchmarks/grouping_overhead.py --sentences 4096 --epochs 2

SimCSE on all-MiniLM-L6-v2, 1 worker, batch 64, max length 32, precision auto, same seed. The kNN
run regroups before each epoch inside its one Ray Train fit: the training worker embeds the corpus
with its current weights, searches neighbours with faiss and packs groups of 8
(raycse.train.regroup). Reported: wall time of the whole run, its parts, and the ratio.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from common import WIKI, machine, train_run


def run(strategy: str, args, out: str) -> dict:
    t0 = time.perf_counter()
    res = train_run(out, {"data.corpus": str(WIKI), "data.max_sentences": args.sentences, "model.max_length": 32,
                          "train.batch_size": 64, "train.epochs": args.epochs, "train.log_steps": 25,
                          "grouping.strategy": strategy, "grouping.group_size": 8})
    m = res.metrics
    return {"wall": time.perf_counter() - t0, "fits": sum(m["fit_seconds"]), "n_fits": len(m["fit_seconds"]),
            "grouping": sum(g["seconds"] for g in m["grouping"]),
            "train": m["last"]["train_seconds"], "sent_s": m["last"]["train_examples_per_s"],
            "dev": m["best"].get("stsb_dev_spearman")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    print(f"# {machine()}; {args.sentences} sentences of {WIKI.name}, {args.epochs} epochs")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        rows["random"] = run("random", args, f"{tmp}/random")
        rows["knn"] = run("knn", args, f"{tmp}/knn")
    print("| order | wall s | in fits s (fits) | grouping s | last-epoch train sent/s | dev after |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['wall']:.0f} | {r['fits']:.0f} ({r['n_fits']}) | {r['grouping']:.1f} | {r['sent_s']:.1f} | "
              f"{r['dev']:.2f} |")
    print(f"kNN / random wall time: {rows['knn']['wall'] / rows['random']['wall']:.2f}x; grouping alone: "
          f"{100 * rows['knn']['grouping'] / rows['random']['wall']:.1f}% of the random run's wall time")


if __name__ == "__main__":
    main()
