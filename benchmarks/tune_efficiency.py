"""Search efficiency: Optuna (TPE) + ASHA vs random search, same budget of trial-seconds.

    python benchmarks/tune_efficiency.py --budget 900 --sentences 1024 --repeats 2

SimCSE on all-MiniLM-L6-v2, 1,024 wiki sentences per trial, 2 seeds per configuration, knobs
tau in [0.005, 0.5] and lr in [1e-6, 1e-3] (log scales; wide on purpose: much of the box is bad).
Optuna+ASHA: 3 rungs, grace 1, reduction 2 (the CLI's defaults), TPE after 4 random trials.
Both score dev under the training autocast (``eval.precision: train``, as the shipped spaces do). Random: Optuna's random
sampler, 1 rung, no early stopping. Each search runs until ``--budget`` seconds have been spent.
Trial-seconds are Tune's ``time_total_s`` of every trial (cut short or not), summed in the order
trials ran; a score counts once a configuration has finished all its rungs (mean over seeds). Each
repetition gives both searches their own sampler seeds; the median over repetitions is printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import STSB_DEV, WIKI, machine  # noqa: E402


def curve(exp: Path) -> list[tuple[float, float]]:
    """(cumulative trial-seconds, best complete mean so far) after each trial, in run order."""
    from raycse.analysis import load_trials

    spent, best, out = 0.0, float("-inf"), []
    for t in load_trials(exp):
        if not t.results:
            continue
        spent += float(t.last.get("time_total_s", 0.0))
        if t.complete:
            best = max(best, t.last["mean"])
        out.append((spent, best))
    return out


def reach_ratio(curves: dict) -> tuple[float, float, float]:
    """(random's final best, its trial-seconds, share of those Optuna+ASHA needed to reach it or inf)."""
    final, spent = curves["random"][-1][1], curves["random"][-1][0]
    reach = next((s for s, b in curves["optuna+asha"] if b >= final), None)
    return final, spent, (reach / spent if reach is not None else float("inf"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=float, default=900, help="seconds per search")
    ap.add_argument("--sentences", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2, help="repetitions, each with its own sampler seeds")
    ap.add_argument("--first-repetition", type=int, default=0,
                    help="index of the first repetition (sampler seeds 100*i+1 / 100*i+2), to add repetitions later")
    args = ap.parse_args()
    print(f"# {machine()}")
    import ray

    from raycse.tune import TuneSettings, tune_search

    tmp = Path(tempfile.mkdtemp())
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump({
        "run": {"model": {"name_or_path": "default", "pooling": "mean", "max_length": 32},
                "data": {"corpus": str(WIKI), "max_sentences": args.sentences},
                "objective": {"name": "simcse"}, "train": {"batch_size": 64, "epochs": 1, "log_steps": 100},
                "eval": {"stsb_dev": str(STSB_DEV), "eval_steps": 100000, "before_training": False,
                         "precision": "train"}},
        "search": {"tau": {"loguniform": [0.005, 0.5]}, "lr": {"loguniform": [1e-6, 1e-3]}}}, sort_keys=False))
    ratios = []
    for rep in range(args.first_repetition, args.first_repetition + args.repeats):
        # each search and repetition draws its own configurations (the same seed would make TPE's
        # random start-up and the random sampler try the same first configurations)
        runs = {
            "optuna+asha": TuneSettings(space=str(space), num_samples=1000, seeds=[0, 1], rungs=3, scheduler="asha",
                                        searcher="optuna", grace_period=1, reduction_factor=2, tpe_startup_trials=4,
                                        concurrent=1, time_budget_s=args.budget, search_seed=100 * rep + 1),
            "random": TuneSettings(space=str(space), num_samples=1000, seeds=[0, 1], rungs=1, scheduler="none",
                                   searcher="random", concurrent=1, time_budget_s=args.budget,
                                   search_seed=100 * rep + 2),
        }
        curves = {}
        for name, settings in runs.items():
            exp, _ = tune_search(settings, str(tmp / "tune"), f"{name.replace('+', '_')}-{rep}")
            curves[name] = curve(exp)
            ray.shutdown()
        print(f"\n## repetition {rep + 1} (sampler seeds {runs['optuna+asha'].search_seed} / "
              f"{runs['random'].search_seed})")
        for name, c in curves.items():
            trials = f"{len(c)} trials: " + ", ".join(f"{s:.0f}s {b:.2f}" for s, b in c)
            print(f"{name}: {trials}")
        final, spent, ratio = reach_ratio(curves)
        ratios.append(ratio)
        print(f"random search: final best {final:.2f} after {spent:.0f} trial-seconds; optuna+asha "
              + (f"reached it after {ratio * spent:.0f} = {100 * ratio:.0f}% of that" if ratio != float("inf")
                 else f"did not reach it (its best {curves['optuna+asha'][-1][1]:.2f})"), flush=True)
    shown = ", ".join("never" if r == float("inf") else f"{100 * r:.0f}%" for r in ratios)
    print(f"\nOptuna+ASHA trial-seconds to reach random search's final best, per repetition: {shown}; "
          f"median {100 * sorted(ratios)[len(ratios) // 2]:.0f}% (target <= 50%)")


if __name__ == "__main__":
    main()
