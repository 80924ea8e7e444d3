"""Search efficiency: Optuna (TPE) + ASHA vs random search, same budget of trial-seconds.

    python benchmarks/tune_efficiency.py --budget 1200 --sentences 1024

SimCSE on all-MiniLM-L6-v2, 1,024 wiki sentences per trial, 2 seeds per configuration, knobs
tau in [0.005, 0.5] and lr in [1e-6, 1e-3] (log scales; wide on purpose: much of the box is bad).
Optuna+ASHA: 2 rungs, grace 1, reduction 2, TPE after 4 random trials. Random: Optuna's random
sampler, 1 rung, no early stopping. Each search runs until ``--budget`` seconds have been spent.
Trial-seconds are Tune's ``time_total_s`` of every trial (cut short or not), summed in the order
trials ran; a score counts once a configuration has finished all its rungs (mean over seeds).
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=float, default=1200, help="seconds per search")
    ap.add_argument("--sentences", type=int, default=1024)
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
                "eval": {"stsb_dev": str(STSB_DEV), "eval_steps": 100000, "before_training": False}},
        "search": {"tau": {"loguniform": [0.005, 0.5]}, "lr": {"loguniform": [1e-6, 1e-3]}}}, sort_keys=False))
    runs = {
        "optuna+asha": TuneSettings(space=str(space), num_samples=1000, seeds=[0, 1], rungs=2, scheduler="asha",
                                    searcher="optuna", grace_period=1, reduction_factor=2, tpe_startup_trials=4,
                                    concurrent=1, time_budget_s=args.budget),
        "random": TuneSettings(space=str(space), num_samples=1000, seeds=[0, 1], rungs=1, scheduler="none",
                               searcher="random", concurrent=1, time_budget_s=args.budget),
    }
    curves = {}
    for name, settings in runs.items():
        exp, _ = tune_search(settings, str(tmp / "tune"), name.replace("+", "_"))
        curves[name] = curve(exp)
        ray.shutdown()
    for name, c in curves.items():
        print(f"\n{name}: {len(c)} trials")
        print("| trial-seconds | best complete mean dev |")
        print("|---|---|")
        for spent, best in c:
            print(f"| {spent:.0f} | {best:.2f} |")
    final_random = curves["random"][-1][1]
    spent_random = curves["random"][-1][0]
    reach = next((s for s, b in curves["optuna+asha"] if b >= final_random), None)
    print(f"\nrandom search: final best {final_random:.2f} after {spent_random:.0f} trial-seconds")
    if reach is None:
        print(f"optuna+asha did not reach {final_random:.2f} (its best: {curves['optuna+asha'][-1][1]:.2f})")
    else:
        print(f"optuna+asha reached it after {reach:.0f} trial-seconds = {100 * reach / spent_random:.0f}% "
              f"of random's")


if __name__ == "__main__":
    main()
