"""The shipped ``matryoshka_pareto`` search (issue 90, item 6): its Pareto front against SimCSE cut to 64
dimensions after training and against issue 68's Matryoshka run, under objectives_quality.py's protocol.

    python benchmarks/pareto_search.py --seeds 3 --num-samples 8 --time-budget 2700 --json out.json
    python benchmarks/pareto_search.py --experiment outputs/tune/pareto-...   # score a search already run

The search: ``raycse tune --space matryoshka_pareto`` on all of wiki_sample.txt (the space's sentence cap
lifted), k seeds a trial, its goals (STS-B dev at 384 and 64 dimensions and on binary embeddings)
scored on the selection half of STS-B dev; no new trial starts once ``--time-budget`` seconds have
passed. Then every seed model of every trial on the front is scored on the reporting half at 384 and
64 dimensions and on binary embeddings, and the front's means are printed beside the baselines of
``results/matryoshka-quality-all.json`` (SimCSE cut to 64 after training; SimCSE + Matryoshka, weights
1), the same halves, as differences and ratios, with the machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from common import WIKI, machine
from objectives_quality import commit, dev_halves

from raycse.evaluation.sts import evaluate_precisions, read_stsb
from raycse.model.encoder import Encoder

RESULTS = Path(__file__).resolve().parent / "results"
BASELINES = RESULTS / "matryoshka-quality-all.json"
COLUMNS = ("384", "64", "binary")


def search(args, select: Path) -> Path:
    from raycse.config import recipe
    from raycse.tune import TuneSettings, tune_search

    settings = TuneSettings(space=recipe("search_spaces", "matryoshka_pareto"), corpus=str(WIKI),
                            num_samples=args.num_samples, seeds=list(range(args.seeds)), rungs=args.rungs,
                            time_budget_s=args.time_budget,
                            run_overrides=[("data.max_sentences", "null"), ("eval.stsb_dev", str(select))])
    exp, _ = tune_search(settings, args.storage, f"pareto-{time.strftime('%Y%m%d-%H%M%S')}")
    return Path(exp)


def report_scores(model: str, report) -> dict:
    """The reporting half's Spearman at 384 and 64 dimensions (cosine of the renormalised prefix) and on
    binary embeddings, every sentence embedded once."""
    from raycse.evaluation.sts import embedded_once

    enc = Encoder.from_pretrained(model)
    embed = embedded_once(lambda xs: enc.encode(xs, batch_size=128, max_length=256))
    full = evaluate_precisions(embed, [report], ["float32", "binary"])
    cut = evaluate_precisions(lambda xs: embed(xs)[:, :64], [report], ["float32"])
    return {"384": full["float32"][report.name], "64": cut["float32"][report.name], "binary": full["binary"][report.name]}


def baselines() -> dict:
    """Row -> column -> mean over seeds, from issue 68's Matryoshka benchmark (binary: not measured there)."""
    runs = json.loads(BASELINES.read_text())["runs"]
    out = {}
    for row in ("SimCSE", "SimCSE + Matryoshka"):
        got = [r["scores"] for r in runs if r["row"] == row]
        out[row] = {c: float(np.mean([g[c] for g in got])) for c in ("384", "64")}
    return out


def main() -> None:
    from raycse.analysis import analyze

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3, help="seeds a trial (0..k-1)")
    ap.add_argument("--num-samples", type=int, default=8)
    ap.add_argument("--rungs", type=int, default=1)
    ap.add_argument("--time-budget", type=float, default=2700.0, help="seconds after which no trial starts")
    ap.add_argument("--storage", default="outputs/tune")
    ap.add_argument("--experiment", default=None, help="score this experiment instead of running a search")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        select, report_file = dev_halves(Path(tmp))
        report = read_stsb(report_file, "stsb_dev_report_half")
        exp = Path(args.experiment) if args.experiment else search(args, select)
        searched = time.perf_counter() - started
        result = analyze(str(exp), plots=True)
        rows = []
        for trial in result.front:
            per_seed = [report_scores(str(trial.path / f"seed{s}" / "model_out" / "model"), report)
                        for s in trial.last["seeds"]]
            rows.append({"trial": trial.trial_id, "knobs": trial.params,
                         "goals_on_selection_half": {g: trial.last[g] for g in trial.last if g.startswith("t_")},
                         "report_half": {c: float(np.mean([p[c] for p in per_seed])) for c in COLUMNS},
                         "report_half_std": {c: float(np.std([p[c] for p in per_seed])) for c in COLUMNS},
                         "per_seed": per_seed})
    base = baselines()
    print(f"# {machine()}; {exp}: {len(result.trials)} trials, {len(result.front)} on the front, "
          f"{searched:.0f} s; STS-B dev's reporting half")
    print(f"{'trial':10s} " + " ".join(f"{c:>14s}" for c in COLUMNS) + "   vs SimCSE cut / Matryoshka at 64")
    for row in rows:
        r, sd = row["report_half"], row["report_half_std"]
        vs = [r["64"] - base[name]["64"] for name in base]
        print(f"{row['trial']:10s} " + " ".join(f"{r[c]:7.2f} +- {sd[c]:4.2f}" for c in COLUMNS)
              + f"   {vs[0]:+.2f} ({r['64'] / base['SimCSE']['64']:.3f}x) / {vs[1]:+.2f}")
    for name, b in base.items():
        print(f"{name:24s} 384: {b['384']:.2f}  64: {b['64']:.2f}  ({BASELINES.name})")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": machine(), "commit": commit(), "date": time.strftime("%Y-%m-%d"), "experiment": str(exp),
            "seeds": args.seeds, "time_budget_s": args.time_budget, "search_seconds": searched,
            "trials": len(result.trials), "front": rows, "baselines": base,
            "all_trials": [{"trial": t.trial_id, "knobs": t.params, "status": t.status(True),
                            "goals": {g: t.last.get(g) for g in t.last if g.startswith("t_")}} for t in result.trials],
        }, indent=1) + "\n")


if __name__ == "__main__":
    main()
