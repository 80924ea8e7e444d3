"""Training on a mixture (issue 108, item 7): SimCSE on wiki sentences beside BSC on STS-B train's scored pairs,
one source a batch, against each source alone and against the two trained one after the other.

    python benchmarks/mixture_quality.py --seeds 0 1 2 [--json FILE] [--table-only] [--quick]

The protocol of issue 44 (objectives_quality.py): all-MiniLM-L6-v2, STS-B dev split once into the selection half
(every run picks its checkpoint on it, scored every ``--eval-steps`` steps and at the end) and the reporting half
(the figure reported: Spearman x100, plain, m = 1); each row over the seeds, and each claim judged by
``verdicts.py``'s rule (a difference counts when it exceeds the two rows' seed spreads added). Rows:

- SimCSE on wiki_sample.txt alone; BSC on STS-B train alone (its default knobs);
- the two mixed at the default shares (proportional: each source's share of the steps is its share of the rows);
- the two mixed at the share a short search finds: a grid of the wiki share (``--grid``), one run each with a seed
  apart from the reported ones (``--search-seed``), scored on the selection half only;
- the same sentences and pairs trained one after the other: SimCSE on wiki, then BSC on STS-B from its model.

Also the cost of mixing: the mixture's optimizer steps per second of training against its sources' alone (the
step-weighted mean), from each run's own timing. ``--json FILE`` keeps each run's figures as it ends; a later
call with the same file and protocol runs only what is missing.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from common import STSB_TRAIN, WIKI, machine, refuse, train_run
from objectives_quality import commit, dev_halves, scores
from verdicts import verdict

ALONE_WIKI, ALONE_STS = "SimCSE on wiki alone", "BSC on STS-B train alone"
MIXED, SEARCHED, SEQUENTIAL = "mixed, proportional", "mixed, searched share", "wiki then STS-B (two runs)"
ROWS = [ALONE_WIKI, ALONE_STS, MIXED, SEARCHED, SEQUENTIAL]
CLAIMS = [  # (claim, row A, row B, kind)
    ("mixing beats the sentences alone", MIXED, ALONE_WIKI, "beats"),
    ("mixing is no worse than the scored pairs alone", MIXED, ALONE_STS, "no worse"),
    ("the searched share beats the default share", SEARCHED, MIXED, "beats"),
    ("mixing is no worse than training one after the other", MIXED, SEQUENTIAL, "no worse"),
]


def base(args, seed: int, select: Path) -> dict:
    return {"model.max_length": args.max_length, "train.batch_size": args.batch_size, "train.epochs": 1,
            "train.seed": seed, "train.precision": args.precision, "train.log_steps": 1000,
            "eval.stsb_dev": str(select), "eval.eval_steps": args.eval_steps, "eval.before_training": False}


def wiki_source(args) -> dict:
    return {"corpus": str(WIKI), "max_sentences": args.sentences}


def sts_source(args) -> dict:
    return {"corpus": str(STSB_TRAIN), "format": "stsb", "max_sentences": args.pairs, "objective": {"name": "bsc"}}


def settings(args, row: str, seed: int, select: Path, share=None, start=None) -> dict:
    out = base(args, seed, select)
    if row == ALONE_WIKI:
        out.update({"data.corpus": str(WIKI), "data.max_sentences": args.sentences, "objective.name": "simcse"})
    elif row in (ALONE_STS, SEQUENTIAL):  # (the second of the two runs: from the wiki run's model, with ``start``)
        out.update({"data.corpus": str(STSB_TRAIN), "data.format": "stsb", "data.max_sentences": args.pairs,
                    "objective.name": "bsc"})
    else:
        wiki = {**wiki_source(args), **({"share": share} if share is not None else {})}
        out.update({"objective.name": "simcse", "data.sources": {"wiki": wiki, "sts": sts_source(args)}})
    if start is not None:
        out["model.name_or_path"] = start
    return out


class Table:
    """Each run's figures, written after each run (an interrupted table goes on where it stopped)."""

    def __init__(self, path, proto: dict):
        self.path, self.data = path, {"protocol": proto, "runs": [], "search": []}
        if path and path.is_file():
            saved = json.loads(path.read_text())
            if saved.get("protocol") != proto:
                refuse(f"{path} holds runs of another protocol ({saved.get('protocol')}): name another --json file")
            self.data = saved

    def find(self, key: str, row: str, seed: int):
        return next((r for r in self.data[key] if r["row"] == row and r["seed"] == seed), None)

    def add(self, key: str, record: dict) -> None:
        self.data[key].append({**record, "machine": machine(), "commit": commit(), "date": time.strftime("%Y-%m-%d")})
        if self.path:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
            tmp.replace(self.path)


def timing(result) -> dict:
    last = result.metrics["last"] or {}
    steps, seconds = int(last.get("step", 0)), float(last.get("train_seconds", 0.0))
    return {"steps": steps, "train_seconds": round(seconds, 2), "steps_per_s": steps / seconds if seconds else None,
            "source_steps": last.get("source_steps")}


def one(args, table: Table, key: str, row: str, seed: int, select: Path, report: Path, tmp: Path, **kw) -> dict:
    """One row's run for ``seed`` (the table's, or run now), scored on ``report`` (None: the selection score)."""
    tag = seed if kw.get("share") is None else f"{seed}@{kw['share']}"
    done = table.find(key, row, tag)
    if done:
        return done
    started = time.perf_counter()
    out = tmp / f"{row.replace(' ', '_').replace(',', '')}-{seed}"
    result = train_run(str(out), settings(args, row, seed, select, **kw))
    record = {"row": row, "seed": tag, **timing(result),
              "selection": (result.metrics.get("best") or {}).get("stsb_dev_spearman"),
              "selected_step": (result.metrics.get("best") or {}).get("step"),
              "seconds": round(time.perf_counter() - started, 1), "share": kw.get("share")}
    if report is not None:
        from raycse.evaluation.sts import read_stsb

        record["report"] = scores(str(out / "model"), read_stsb(report, "report"), [], None)[1]
    table.add(key, record)
    return record


def run_all(args, table: Table, tmp: Path) -> None:
    select, report = dev_halves(tmp)
    for share in args.grid:  # the short search: the selection half only, a seed apart from the reported ones
        got = one(args, table, "search", "share", args.search_seed, select, None, tmp, share=share)
        print(f"[mixture] search: wiki share {share}: selection {got['selection']:.2f}", flush=True)
    tried = [r for r in table.data["search"] if r["share"] in args.grid]
    best_share = max(tried, key=lambda r: r["selection"])["share"] if tried else None
    print(f"[mixture] the searched share: wiki {best_share}", flush=True)
    for seed in args.seeds:
        for row in ROWS:
            kw = {}
            if row == SEARCHED:
                kw["share"] = best_share
            if row == SEQUENTIAL and not table.find("runs", row, seed):
                model = tmp / f"{ALONE_WIKI.replace(' ', '_')}-{seed}" / "model"  # (the wiki row's, run above)
                if not model.is_dir():  # (that row came from the table: train it again as the start)
                    train_run(str(tmp / f"again-{seed}"), settings(args, ALONE_WIKI, seed, select))
                    model = tmp / f"again-{seed}" / "model"
                kw["start"] = str(model)
            got = one(args, table, "runs", row, seed, select, report, tmp, **kw)
            print(f"[mixture] seed {seed}: {row}: report {got['report']:.2f} (selection {got['selection']:.2f}, "
                  f"{got['steps']} steps, {got['steps_per_s']:.2f} steps/s)", flush=True)


def print_table(table: Table, seeds: list) -> None:
    runs = table.data["runs"]

    def rows_of(row):
        return [r for r in runs if r["row"] == row and str(r["seed"]).split("@")[0] in {str(s) for s in seeds}]

    print(f"\n# {machine()}")
    print(f"{'row':32s} {'report half':>16s} {'selection':>16s} {'steps/s':>8s} seeds")
    for row in ROWS:
        done = rows_of(row)
        if not done:
            print(f"{row:32s} (not run)")
            continue
        rep, sel = np.array([r["report"] for r in done]), np.array([r["selection"] for r in done])
        speed = np.mean([r["steps_per_s"] for r in done])
        print(f"{row:32s} {rep.mean():8.2f} +- {rep.std():4.2f} {sel.mean():8.2f} +- {sel.std():4.2f} {speed:8.2f} "
              f"{len(done)}/{len(seeds)}")
    for claim, a, b, kind in CLAIMS:
        va, vb = [r["report"] for r in rows_of(a)], [r["report"] for r in rows_of(b)]
        said, diff, spread = verdict(va, vb, kind, len(seeds))
        print(f"- {claim}: {said} (A - B {diff:+.2f}, spreads {spread:.2f})")
    mixed, wiki, sts = rows_of(MIXED), rows_of(ALONE_WIKI), rows_of(ALONE_STS)
    if mixed and wiki and sts:
        steps = mixed[0]["source_steps"] or {}
        n_w, n_s = steps.get("wiki", 0), steps.get("sts", 0)
        alone = (n_w + n_s) / (n_w / np.mean([r["steps_per_s"] for r in wiki])
                               + n_s / np.mean([r["steps_per_s"] for r in sts]))
        ratio = np.mean([r["steps_per_s"] for r in mixed]) / alone
        print(f"- the cost of mixing: {np.mean([r['steps_per_s'] for r in mixed]):.2f} steps/s mixed against "
              f"{alone:.2f} for the same steps of its sources alone: {ratio:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--grid", type=float, nargs="+", default=[0.3, 0.5, 0.8], help="wiki shares the search tries")
    ap.add_argument("--search-seed", type=int, default=100)
    ap.add_argument("--sentences", type=int, default=11915)
    ap.add_argument("--pairs", type=int, default=5749)
    ap.add_argument("--max-length", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--eval-steps", type=int, default=50)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--quick", action="store_true", help="a check of the script itself: 512 rows a source, 1 seed")
    args = ap.parse_args()
    if args.quick:
        args.sentences, args.pairs, args.seeds, args.grid, args.eval_steps = 512, 512, [0], [0.5], 4
    proto = {k: getattr(args, k) for k in ("sentences", "pairs", "max_length", "batch_size", "eval_steps",
                                           "precision", "grid", "search_seed")}
    table = Table(args.json, proto)
    if not args.table_only:
        with tempfile.TemporaryDirectory() as tmp:
            run_all(args, table, Path(tmp))
    print_table(table, args.seeds)


if __name__ == "__main__":
    main()
