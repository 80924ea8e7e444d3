"""A teacher and a guide (issue 89, item 5), under objectives_quality.py's protocol (issue 44).

    python benchmarks/teacher_guide.py --teacher DIR --seeds 0 1 2 --json benchmarks/results/teacher-guide.json

DIR: all-mpnet-base-v2 as README's "Distillation from a teacher" unpacks it. Rows, each trained from
all-MiniLM-L6-v2 for one epoch on wiki_sample.txt at max length 64 (fp32), selecting its checkpoint on
STS-B dev's selection half and reported on the other half:

- ``SimCSE kNN`` and ``SimCSE kNN + guide``: SimCSE's recipe on kNN batches, without and with
  ``--guide initial`` (``--guide-margin``, 0.01 by default); the share of negatives masked is kept;
- ``SimCSE kNN + teacher``: the same with ``--teacher DIR`` (distill kl, weight 1) instead of the guide;
- ``combined_best`` and ``combined_best + teacher``: issue 44's searched best, without and with the teacher.

Beside them: the teacher's own score on the reporting half, the teacher's one-time embedding of the corpus
(seconds, from the first run that computes it; later runs read it back from the cache) and each row's
training speed (examples/s of the fit, this process, one row after another). The verdicts follow
verdicts.py's rule (A beats B when the mean difference exceeds the two rows' seed spreads added).
``--weights W ...`` adds a row ``combined_best + teacher (weight W)`` for each W (the teacher's weight
screened against combined_best, the issue's target; ``--only-weights`` runs just those rows); ``W:S:T``
also sets kl's temperatures, the student's S and the teacher's T (0.05 and 0.05 otherwise). ``--staged``
adds ``SimCSE kNN + teacher, then combined_best``: the teacher's distillation first (the SimCSE kNN + teacher
row's run), then combined_best trained from that run's model, as a second fit of the same seed.
``--teacher-guides M ...`` adds ``combined_best + the teacher as guide (margin M)`` for each M: GISTEmbed's
own setting, a bigger model as the guide (its vectors are the teacher's, read back from the same cache).
Seeds go round the rows (every row's seed 0 first), and ``--json`` keeps every run as it ends: a later
call with the same file and protocol runs only what is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import machine, refuse, train_run
from objectives_quality import Store, dev_halves, protocol, settings_from
from verdicts import verdict

from raycse.evaluation.sts import evaluate_datasets, read_stsb
from raycse.model.encoder import Encoder

ROWS = [("SimCSE kNN", "simcse", {"grouping.strategy": "knn"}),
        ("SimCSE kNN + guide", "simcse", {"grouping.strategy": "knn", "model.guide": "initial"}),
        ("SimCSE kNN + teacher", "simcse", {"grouping.strategy": "knn", "model.teacher": None}),
        ("combined_best", "combined_best", {}),
        ("combined_best + teacher", "combined_best", {"model.teacher": None})]
# (A, B, claim): the issue's comparisons, judged by verdicts.py's rule
CLAIMS = [("SimCSE kNN + guide", "SimCSE kNN", "the guide helps SimCSE on kNN batches"),
          ("SimCSE kNN + teacher", "SimCSE kNN", "a teacher helps SimCSE"),
          ("combined_best + teacher", "combined_best", "a teacher helps the combined best (the issue's target)")]


class Tee(io.StringIO):
    """This process's stdout, kept as well: raycse says there what the teacher's and the guide's embedding of
    the corpus cost where it computed them (and nothing where it read them back from the cache)."""

    def write(self, text: str) -> int:
        sys.__stdout__.write(text)
        return super().write(text)

    def embedded(self) -> dict:
        found = re.findall(r"\] (teacher|guide): (\w+): ([\d,]+) embeddings \((\d+)-d\) computed in ([\d.]+) s",
                           self.getvalue())
        return {f"{role}: {col}": {"rows": int(n.replace(",", "")), "dims": int(d), "seconds": float(s)}
                for role, col, n, d, s in found}


SCREENED = "combined_best + teacher"  # (a screened row's name: this, then its weight and taus)
STAGED = "SimCSE kNN + teacher, then combined_best"
FIRST_STAGE = next(row for row in ROWS if row[0] == "SimCSE kNN + teacher")
GUIDED = "combined_best + the teacher as guide"


def guided_rows(margins: list[float]) -> list[tuple[str, str, dict]]:
    return [(f"{GUIDED} (margin {m:g})", "combined_best", {"model.guide": None, "objective.guide_margin": m})
            for m in margins]


def weighted_rows(screens: list[list[float]]) -> list[tuple[str, str, dict]]:
    """combined_best with the teacher at each screened ``[W]`` or ``[W, S, T]`` (the fixed rows: weight 1, taus
    0.05); one name per value, so "0.10" and "0.1" are one row."""
    rows = []
    for weight, *taus in screens:
        sets = {"model.teacher": None, "objective.distill_weight": weight}
        if taus:
            sets.update({"objective.distill_tau": taus[0], "objective.teacher_tau": taus[1]})
        name = f"weight {weight:g}" + (f", taus {taus[0]:g}/{taus[1]:g}" if taus else "")
        rows.append((f"{SCREENED} ({name})", "combined_best", sets))
    return rows


def report_score(model: str, report) -> float:
    enc = Encoder.from_pretrained(model)
    return evaluate_datasets(lambda xs: enc.encode(xs, batch_size=64, max_length=256), [report])[report.name]


def row_settings(config: str, overrides: dict, args, seed: int, select: Path) -> dict:
    # (None: the teacher's folder, as the teacher or as the guide; a guide's margin: the row's, else --guide-margin)
    filled = {k: (args.teacher if v is None and k in ("model.teacher", "model.guide") else v)
              for k, v in overrides.items()}
    if "model.guide" in filled:
        filled.setdefault("objective.guide_margin", args.guide_margin)
    return settings_from(config, filled, args, seed, select)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", required=True, help="the teacher's folder (all-mpnet-base-v2)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sentences", type=int, default=None, help="the first N sentences of the corpus (default: all)")
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--eval-steps", type=int, default=125)
    ap.add_argument("--guide-margin", type=float, default=0.01)
    ap.add_argument("--weights", nargs="*", default=[], metavar="W[:S:T]",
                    help="also combined_best + teacher at these distillation weights (and kl temperatures)")
    ap.add_argument("--staged", action="store_true", help="also the teacher first, then combined_best from its model")
    ap.add_argument("--teacher-guides", type=float, nargs="*", default=[], metavar="M",
                    help="also combined_best with the teacher as its guide, at these guide margins")
    ap.add_argument("--only-weights", action="store_true",
                    help="run only the --weights, --staged and --teacher-guides rows")
    ap.add_argument("--json", default=None, help="keep every run here; runs already in it are not run again")
    ap.add_argument("--table-only", action="store_true", help="print the table from --json, run nothing")
    args = ap.parse_args()
    if not (Path(args.teacher) / "config.json").is_file():
        refuse(f"--teacher {args.teacher} holds no config.json: unpack all-mpnet-base-v2 as README's "
               f"'Distillation from a teacher' says")
    args.teacher, args.precision = str(Path(args.teacher).resolve()), "fp32"
    try:
        screens = [[float(x) for x in w.split(":")] for w in args.weights]
    except ValueError:
        screens = []
    if len(screens) != len(args.weights) or any(len(w) not in (1, 3) or w[0] < 0 or min(w[1:], default=1) <= 0
                                                for w in screens):
        refuse(f"--weights {' '.join(args.weights)}: each is a weight W >= 0, or W:S:T with temperatures S, T > 0, e.g. "
               f"0.1 or 0.1:0.1:0.1")
    if any(not m >= 0 for m in args.teacher_guides):
        refuse(f"--teacher-guides {' '.join(map(str, args.teacher_guides))}: each is a guide margin M >= 0, e.g. 0.1")
    store = Store(Path(args.json) if args.json else None,
                  {**protocol(args), "teacher": Path(args.teacher).name, "guide_margin": args.guide_margin})
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["RAYCSE_CACHE"] = os.environ.get("RAYCSE_CACHE") or f"{tmp}/cache"  # (a warm cache: said below)
        select, report_file = dev_halves(Path(tmp))
        report = read_stsb(report_file, "stsb_dev_report_half")
        print(f"# {machine()}; wiki_sample.txt ({args.sentences or 'all'} sentences), 1 epoch, max length "
              f"{args.max_length}, seeds {args.seeds}; teacher {Path(args.teacher).name}", flush=True)
        if not args.table_only and store.before("teacher") is None:
            store.add_before("teacher", {"1": report_score(args.teacher, report)})
        rows = (([] if args.only_weights else ROWS) + weighted_rows(screens) + guided_rows(args.teacher_guides)
                + ([(STAGED, "combined_best", {})] if args.staged else []))
        for seed in [] if args.table_only else args.seeds:
            for name, config, overrides in rows:
                if store.run(name, seed):
                    continue
                start, out, first = time.perf_counter(), f"{tmp}/{seed}", None
                log = Tee()
                with contextlib.redirect_stdout(log):
                    if name == STAGED:  # (its first stage: the teacher's row, trained again at this seed)
                        first = train_run(f"{out}-first", row_settings(*FIRST_STAGE[1:], args, seed, select))
                        overrides = {"model.name_or_path": str(first.model_dir)}
                    result = train_run(out, row_settings(config, overrides, args, seed, select))
                last = result.metrics.get("last") or {}
                score = report_score(str(result.model_dir), report)
                store.add_run(name, seed, "mean", "", {1: score}, result, start,
                              examples_per_s=last.get("train_examples_per_s"), train_seconds=last.get("train_seconds"),
                              guide_masked=last.get("last_guide_masked"), distill=last.get("last_distill"),
                              embedded=log.embedded(),
                              first_stage_seconds=(first.metrics.get("last") or {}).get("train_seconds") if first else None)
                print(f"  {name} seed {seed}: report half {score:.2f}, {last.get('train_examples_per_s', 0):.1f} "
                      f"examples/s", flush=True)
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(f"{out}-first", ignore_errors=True)
    asked = weighted_rows(screens) + guided_rows(args.teacher_guides)
    print_table(store, args.seeds, [name for name, _, _ in asked] + ([STAGED] if args.staged else []))


def print_table(store: Store, seeds: list[int], asked: list[str]) -> None:
    """The fixed rows, then every screened row the JSON holds or ``asked`` names, with the verdicts."""
    fixed = [name for name, _, _ in ROWS]
    screened = sorted(({r["row"] for r in store.data["runs"]} | set(asked)) - set(fixed))
    runs = {name: [r for r in store.data["runs"] if r["row"] == name and r["seed"] in seeds] for name in fixed + screened}
    teacher = (store.before("teacher") or {}).get("1", float("nan"))
    print(f"\nteacher (its own embeddings) on the reporting half: {teacher:.2f}")
    for run in store.data["runs"]:
        for what, cost in (run.get("embedded") or {}).items():
            print(f"one-time embedding, {what}: {cost['rows']:,} rows ({cost['dims']}-d) in {cost['seconds']:.1f} s "
                  f"({cost['rows'] / cost['seconds']:.1f} rows/s; {run['row']}, seed {run['seed']})")
    base = np.mean([r["examples_per_s"] for r in runs["SimCSE kNN"]]) if runs["SimCSE kNN"] else float("nan")
    wide = max(len(name) for name in runs)
    print(f"{'row':{wide}s} {'report half':>16s} {'examples/s':>11s} {'vs SimCSE kNN':>14s} {'masked':>7s} seeds")
    for name, done in runs.items():
        if not done:
            print(f"{name:{wide}s} (not run)")
            continue
        v, speed = np.array([r["scores"]["1"] for r in done]), np.mean([r["examples_per_s"] for r in done])
        masked = [r["guide_masked"] for r in done if r.get("guide_masked") is not None]
        print(f"{name:{wide}s} {v.mean():7.2f} +- {v.std():5.2f} {speed:11.1f} {speed / base:13.2f}x "
              f"{(f'{np.mean(masked):.1%}' if masked else ''):>7s} {len(done)}/{len(seeds)}")
    screens = [(name, "combined_best", f"a teacher at {name[len(SCREENED) + 1:]} helps the combined best"
                if name.startswith(SCREENED) else f"{name} beats the combined best") for name in screened]
    for a, b, claim in CLAIMS + screens:
        said, diff, spread = verdict([r["scores"]["1"] for r in runs[a]], [r["scores"]["1"] for r in runs[b]],
                                     "beats", len(seeds))
        print(f"{claim}: {a} vs {b}: {said} (difference {diff:+.2f}, spread {spread:.2f})")


if __name__ == "__main__":
    main()
