"""Matryoshka against truncation after the fact (issue 68, item 2), under objectives_quality.py's protocol.

    python benchmarks/matryoshka_quality.py --seeds 0 1 2 [--sentences N] [--json FILE]

Two rows, each trained from all-MiniLM-L6-v2 with SimCSE's recipe (``configs/simcse.yaml``) for one
epoch on wiki_sample.txt at max length 64, selecting its checkpoint on the selection half of STS-B
dev and reported on the other half (``objectives_quality.py``'s halves and settings):

- ``SimCSE``: trained as usual, then cut to 256 / 128 / 64 coordinates;
- ``SimCSE + Matryoshka``: ``objective.matryoshka_dims: [384, 256, 128, 64]``, weights 1.

Each model is scored at every size on the reporting half (Spearman x100 of the cosine of the
re-normalised prefixes), and the untrained model beside them. Printed per size: mean +- std over the
seeds and the difference Matryoshka - plain, with the machine. ``--json`` keeps each run as it ends; a
later call with the same file and protocol runs only what is missing.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from common import machine, refuse, train_run
from objectives_quality import Store, dev_halves, protocol, settings_from

from raycse.evaluation.sts import embedded_once, evaluate_datasets, read_stsb
from raycse.model.encoder import Encoder

DIMS = [384, 256, 128, 64]
ROWS = [("SimCSE", {}), ("SimCSE + Matryoshka", {"objective.matryoshka_dims": DIMS})]


def scores_by_size(model: str, report) -> dict:
    """The reporting half's Spearman at each prefix size, every sentence embedded once."""
    enc = Encoder.from_pretrained(model)
    embed = embedded_once(lambda xs: enc.encode(xs, batch_size=128, max_length=256))
    return {d: evaluate_datasets(lambda xs, d=d: embed(xs)[:, :d], [report])[report.name] for d in DIMS}


def describe(values: list) -> str:
    v = np.array(values)
    return f"{v.mean():6.2f} +- {v.std():4.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sentences", type=int, default=None, help="the first N sentences of the corpus (default: all)")
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--eval-steps", type=int, default=125)
    ap.add_argument("--json", default=None, help="keep every run here; runs already in it are not run again")
    args = ap.parse_args()
    if args.sentences is not None and args.sentences < 64:
        refuse(f"--sentences must be at least one batch (64), got {args.sentences}")
    args.precision = "fp32"
    store = Store(Path(args.json) if args.json else None, {**protocol(args), "matryoshka_dims": DIMS})
    with tempfile.TemporaryDirectory() as tmp:
        select, report_file = dev_halves(Path(tmp))
        report = read_stsb(report_file, "stsb_dev_report_half")
        print(f"# {machine()}; wiki_sample.txt ({args.sentences or 'all'} sentences), SimCSE's recipe, 1 epoch, "
              f"max length {args.max_length}, seeds {args.seeds}; scored on STS-B dev's reporting half at {DIMS}",
              flush=True)
        if store.before("mean") is None:
            store.add_before("mean", {str(d): s for d, s in scores_by_size("default", report).items()})
        for name, overrides in ROWS:
            for seed in args.seeds:
                if store.run(name, seed):
                    continue
                start = time.perf_counter()
                out = f"{tmp}/{seed}-{len(overrides)}"
                result = train_run(out, settings_from("simcse", overrides, args, seed, select))
                figures = scores_by_size(str(result.model_dir), report)
                store.add_run(name, seed, "mean", "none", figures, result, start)
                print(f"  {name} seed {seed}: " + ", ".join(f"{d}: {s:.2f}" for d, s in figures.items()), flush=True)
                shutil.rmtree(out, ignore_errors=True)
    print_table(store, args.seeds)


def print_table(store: Store, seeds: list[int]) -> None:
    before = store.before("mean") or {}
    print(f"\n{'size':>5s} {'untrained':>10s} " + " ".join(f"{name:>22s}" for name, _ in ROWS) + f" {'difference':>11s}")
    for d in DIMS:
        per_row = [[r["scores"][str(d)] for r in store.data["runs"] if r["row"] == name and r["seed"] in seeds]
                   for name, _ in ROWS]
        diff = (f"{np.mean(per_row[1]) - np.mean(per_row[0]):+11.2f}" if all(per_row) else f"{'':>11s}")
        print(f"{d:5d} {before.get(str(d), float('nan')):10.2f} "
              + " ".join(f"{describe(v) if v else '(not run)':>22s}" for v in per_row) + f" {diff}")


if __name__ == "__main__":
    main()
