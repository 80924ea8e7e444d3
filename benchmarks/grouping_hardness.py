"""How hard are in-batch negatives under each grouping? wiki_sample.txt with all-MiniLM-L6-v2.

    python benchmarks/grouping_hardness.py --batch-size 64 --group-size 8

Embeds the corpus once with the embedded model, builds one epoch's batch order with each
strategy (the same functions the trainer uses: group order -> packing), and reports over all
batches: the mean over anchors of the *max* cosine similarity to another example of the batch
(the hardest negative), and the mean cosine over all negative pairs. ``knn, cell join`` forces the
search used above ``grouping.exact_threshold`` (raycse.grouping.cells), to check that the faster
index does not make batches easier.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import WIKI, first_sentences, machine  # noqa: E402
from raycse.config import GroupingConfig  # noqa: E402
from raycse.grouping import knn  # noqa: E402
from raycse.grouping.batches import pack  # noqa: E402
from raycse.grouping.strategies import (cluster_keys, epoch_rng, keyed_order, knn_order, random_order,  # noqa: E402
                                        shingle_key)


def hardness(x: np.ndarray, batches: np.ndarray) -> tuple[float, float]:
    maxes, means = [], []
    for b in batches:
        e = x[b].astype(np.float32)  # (float16 vectors: numpy's float16 products are slow)
        s = e @ e.T
        np.fill_diagonal(s, -np.inf)
        maxes.append(s.max(axis=1).mean())
        np.fill_diagonal(s, np.nan)
        means.append(np.nanmean(s))
    return float(np.mean(maxes)), float(np.mean(means))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--neighbours", type=int, default=64)
    ap.add_argument("--sentences", type=int, default=None)
    args = ap.parse_args()
    print(f"# {machine()}")
    from raycse.model.encoder import Encoder
    from raycse.model.precision import resolve_precision

    texts = first_sentences(args.sentences or 10**9, WIKI)
    enc = Encoder.from_pretrained("default")
    t0 = time.perf_counter()
    x = knn.normalize(enc.encode(texts, batch_size=128, max_length=32,
                                 autocast_dtype=resolve_precision("auto", enc.device)))
    print(f"# embedded {len(texts)} sentences in {time.perf_counter() - t0:.1f}s")
    cfg = GroupingConfig(strategy="knn", group_size=args.group_size, neighbours=args.neighbours)
    n, seed = len(texts), 0
    orders = {
        "random": random_order(n, seed, 0),
        "shingle": keyed_order(np.array([shingle_key(t, seed, 0, i) for i, t in enumerate(texts)]), args.group_size,
                               epoch_rng(seed, 0, 3)),
        "cluster": keyed_order(cluster_keys(x, None, args.group_size, seed), args.group_size, epoch_rng(seed, 0, 2)),
        "knn": knn_order(x, cfg, seed, 0),  # exact search (the corpus is under exact_threshold)
        "knn, cell join": knn_order(x, dataclasses.replace(cfg, search="cells"), seed, 0),  # the large-N search
    }
    print(f"\n{n} sentences, batch {args.batch_size}, group size {args.group_size}\n")
    print("| grouping | mean max negative cosine | mean negative cosine | groups split |")
    print("|---|---|---|---|")
    for name, order in orders.items():
        p = pack(order, args.batch_size, 1)
        hard, mean = hardness(x, p.batches)
        print(f"| {name} | {hard:.3f} | {mean:.3f} | {p.split_groups} |")


if __name__ == "__main__":
    main()
