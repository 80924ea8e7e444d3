"""`raycse mine` at scale: 100k (query, positive) pairs on this machine (issue 21).

    python benchmarks/mine_speed.py --pairs 100000

Pairs are made from wiki_sample.txt: each line cut into (first part, rest) at several word
positions, until --pairs unique pairs. The candidate pool is their positives. Embedding on the
Ray Data actor pool (--actors), search exact or IVF (auto: IVF above 50,000 candidates). Prints the
seconds per stage (read, embed, search, write) and pairs/s overall.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from common import WIKI, machine


def make_pairs(n: int) -> list[dict]:
    lines = [line.split() for line in WIKI.read_text().splitlines() if len(line.split()) >= 8]
    pairs, seen = [], set()
    for cut in range(3, 40):
        for words in lines:
            if cut >= len(words) - 2:
                continue
            q, a = " ".join(words[:cut]), " ".join(words[cut:])
            if (q, a) not in seen:
                seen.add((q, a))
                pairs.append({"q": q, "a": a})
                if len(pairs) == n:
                    return pairs
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=100_000)
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--search", default="auto")
    args = ap.parse_args()
    from raycse.config import DataConfig
    from raycse.grouping.mine import MineSettings, mine
    from raycse.model.loading import resolve_model
    from raycse.platform.ray_session import ensure_ray, setup_ray_data

    pairs = make_pairs(args.pairs)
    print(f"# {machine()}; {len(pairs)} pairs from {WIKI.name}; all-MiniLM-L6-v2, max length 64, "
          f"{args.actors} embedding actor(s), search {args.search}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "pairs.jsonl"
        src.write_text("\n".join(json.dumps(p) for p in pairs) + "\n")
        ensure_ray()
        setup_ray_data()
        t0 = time.perf_counter()
        result = mine(DataConfig(corpus=str(src), text_column="q", pair_column="a"), resolve_model("default"),
                      Path(tmp) / "triplets.jsonl",
                      MineSettings(num_negatives=1, range_max=50, margin=0.05, search=args.search,
                                   embed_actors=args.actors, max_length=64))
        total = time.perf_counter() - t0
    print(f"{result.triplets} triplets ({result.dropped} dropped) from {len(pairs)} pairs, {result.candidates} "
          f"candidates: {total:.0f} s = {len(pairs) / total:.0f} pairs/s; stages {result.seconds}")


if __name__ == "__main__":
    main()
