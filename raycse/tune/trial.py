"""One Tune trial: a configuration trained with k seeds that advance together, rung by rung.

The trial function is the Tune "driver" of ray-notes: it calls :func:`raycse.train.driver.train`
(a ``TorchTrainer.fit``) per seed and reports to Tune only aggregates. Rung ``r`` trains every
seed up to step ``total * r / rungs`` (each seed's Train run resumes from its own checkpoint,
keeping the full run's learning-rate schedule), then reports mean, std and worst STS-B dev
Spearman over the seeds plus the optimisation target. ASHA decides between rungs, so seeds
are never compared at different steps. Progress is saved with every report (a small JSON
checkpoint), so a resumed experiment neither loses nor reruns a finished rung.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from raycse.train.loop import SCORE_METRIC

TARGET = "target"


@dataclass
class TrialSetup:
    space: "object"  # raycse.tune.space.SearchSpace
    seeds: list[int]
    rungs: int
    target: str  # "mean" or "mean-Kstd"
    num_examples: int
    storage_path: str
    experiment: str
    cpus_per_worker: Optional[float] = None


def target_value(scores: list[float], target: str) -> float:
    mean = float(np.mean(scores))
    if target == "mean":
        return mean
    k = float(target.split("-", 1)[1].replace("std", "") or 1.0)
    return mean - k * float(np.std(scores))


def parse_target(text: str) -> str:
    """'mean' or 'mean-Kstd' (e.g. 'mean-1std', 'mean-0.5std')."""
    from raycse.errors import ConfigError

    t = text.replace(" ", "").replace("*", "")
    if t == "mean":
        return t
    if t.startswith("mean-") and t.endswith("std"):
        k = t[5:-3] or "1"
        try:
            if float(k) >= 0:
                return f"mean-{float(k):g}std"
        except ValueError:
            pass
    raise ConfigError(f"--target must be 'mean' or 'mean-Kstd' (e.g. mean-1std), got {text!r}")


def rung_ends(total: int, rungs: int) -> list[int]:
    return sorted({max(1, math.ceil(total * (r + 1) / rungs)) for r in range(rungs)})


def total_steps(run, num_examples: int) -> int:
    t = run.train
    spe = (num_examples // t.batch_size) // t.num_workers
    return min(spe * t.epochs, t.max_steps or spe * t.epochs)


def _train_outside_trial(run_dict: dict, storage: str, stop: int) -> dict:
    """One seed's Train run up to ``stop``; runs as its own task (see :func:`run_trial`)."""
    from raycse.config import RunConfig
    from raycse.train.driver import train

    return train(RunConfig.from_dict(run_dict), overwrite=True, storage_path=storage, run_name="train",
                 stop_at=stop).metrics


def run_trial(params: dict, setup: TrialSetup) -> None:
    import ray
    from ray import tune

    # Tune pins every task a trial starts to the trial's placement group (a 0.01-CPU bundle here),
    # where Ray Data's shuffle tasks cannot fit; the seed's run is driven from a task outside it.
    train_task = ray.remote(_train_outside_trial).options(num_cpus=0, scheduling_strategy="DEFAULT")

    ctx = tune.get_context()
    trial_dir = Path(ctx.get_trial_dir())
    progress = {"scores": {str(s): [] for s in setup.seeds}, "steps": []}
    previous = tune.get_checkpoint()
    if previous is not None:
        with previous.as_directory() as d:
            progress = json.loads((Path(d) / "progress.json").read_text())
    runs = {s: setup.space.run_config(params, seed=s) for s in setup.seeds}
    for run in runs.values():
        if setup.cpus_per_worker:
            run.train.cpus_per_worker = setup.cpus_per_worker
    ends = rung_ends(total_steps(runs[setup.seeds[0]], setup.num_examples), setup.rungs)
    for r, stop in enumerate(ends):
        if r < len(progress["steps"]):
            continue  # reported before the experiment was interrupted
        for seed, run in runs.items():
            scores = progress["scores"][str(seed)]
            if len(scores) > r:
                continue
            run.output_dir = str(trial_dir / f"seed{seed}" / "model_out")
            # beside model_out, inside the trial's own directory (a URI when storage_path is one)
            storage = os.path.join(setup.storage_path, setup.experiment, trial_dir.name, f"seed{seed}")
            metrics = ray.get(train_task.remote(run.to_dict(), storage, stop))
            scores.append(float(metrics["last"].get(SCORE_METRIC, float("nan"))))
        progress["steps"].append(stop)
        values = [progress["scores"][str(s)][r] for s in setup.seeds]
        metrics = {TARGET: target_value(values, setup.target), "mean": float(np.mean(values)),
                   "std": float(np.std(values)), "worst": float(np.min(values)), "best_seed": float(np.max(values)),
                   "seed_scores": values, "seeds": list(setup.seeds), "step": stop, "rung": r + 1,
                   "final_rung": len(ends)}
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "progress.json").write_text(json.dumps(progress))
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))
