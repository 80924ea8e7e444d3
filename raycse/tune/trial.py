"""One Tune trial: a configuration trained with k seeds that advance together, rung by rung.

The trial function is the Tune "driver" of ray-notes: it calls :func:`raycse.train.driver.train`
(a ``TorchTrainer.fit``) per seed and reports to Tune only aggregates. Rung ``r`` ends at step
``total * r / rungs``; every seed's run is scored on STS-B dev there, and the trial reports mean,
std and worst Spearman over the seeds plus the optimisation target once all seeds have that
score. ASHA decides between rungs, so seeds are never compared at different steps.

By default the seeds run side by side, one fit each for the whole trial, posting their rung
scores through a queue as they go (a rung costs one evaluation, not a new fit). Where the
cluster cannot hold k runs at once (GPUs), they run one after another and each rung continues
every seed's run from its checkpoint with the full run's learning-rate schedule. Each rung's
scores are saved before its report, in the trial's directory on the experiment's storage and in
a small Tune checkpoint, so a resumed experiment neither loses nor reruns a finished rung, even
when the driver died before Tune's own record of the trial reached storage.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from raycse.platform import object_store
from raycse.platform.staging import temporary_dir

TARGET = "target"
SEED_RUN = "train"  # Ray Train run name of each seed, under TRIAL/seed<s>/ (its checkpoints)
SEED_MODEL = "model_out"  # each seed's final model and metrics, TRIAL/seed<s>/model_out
RUNGS = "rungs.json"  # the rungs a trial reported, its seeds' scores at each: TRIAL/rungs.json and its Tune checkpoint


def is_final(result: dict) -> bool:
    """A trial's report is final when it comes from its last rung (not cut short by ASHA)."""
    return result.get("rung") == result.get("final_rung")


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
    parallel_seeds: bool = True  # the k seeds' Train runs at once (one fit each) or one after another
    # seed -> ObjectRef of a raycse.train.prepare.PreparedData: each seed's corpus and batches, read and
    # laid out once by the experiment's driver; a trial whose knobs change the batches lays out its own
    prepared: dict = field(default_factory=dict)
    # ActorHandle of the experiment's raycse.platform.release.RunRegistry: each seed's Train runs are
    # recorded under "TRIAL_ID/seedS", and the experiment's driver ends them when Tune ends the trial
    registry: object = None
    # a search for several goals (raycse.evaluation.targets.Target): each seed's run scores them all
    targets: tuple = ()


def target_value(scores: list[float], target: str, mode: str = "max") -> float:
    """The seeds' ``scores`` aggregated: their mean, or mean-Kstd (for a goal minimised: mean+Kstd, the
    pessimistic side either way)."""
    mean = float(np.mean(scores))
    if target == "mean":
        return mean
    k = float(target.split("-", 1)[1].replace("std", "") or 1.0)
    return mean - k * float(np.std(scores)) * (1 if mode == "max" else -1)


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


class QueueSink:
    """Where a seed's Train run posts its dev scores: ``(seed, step, score, goals)`` into the trial's queue."""

    def __init__(self, queue, seed: int):
        self.queue, self.seed = queue, seed

    def post(self, step: int, score: float, goals: Optional[dict] = None) -> None:
        self.queue.put((self.seed, step, score, goals or {}))


# What a seed's task returns when its run ended because its trial did (see _ended_with_its_trial)
ENDED_WITH_TRIAL = "ended_with_its_trial"


def _train_outside_trial(run_dict: dict, seed_dir: str, stop: int, eval_at: list[int], sink: QueueSink,
                         prepared=None, registry=None, run_key: Optional[str] = None, targets=()) -> dict:
    """One seed's Train run up to ``stop``; runs as its own task (see :func:`run_trial`).

    Checkpoints and the final model go straight to ``seed_dir`` in the experiment directory, not to
    Tune's per-trial staging directory: Tune copied that whole directory into the experiment again
    at every periodic sync (every model of every trial so far, a cost growing with the experiment:
    random search's trials went from 62 to 80 s over 23 trials), and it copied the staging
    directories of models still being written (``.model_out.partial-*`` left behind)."""
    from raycse.config import RunConfig
    from raycse.platform.ray_session import setup_ray_data
    from raycse.train.driver import train
    from raycse.train.plan import TuneHooks

    setup_ray_data(progress_bars=False)  # k runs' bars interleaved in one log are ~4,000 lines per trial
    run = RunConfig.from_dict(run_dict)
    run.output_dir = os.path.join(seed_dir, SEED_MODEL)
    hooks = TuneHooks(stop_at=stop, eval_at=tuple(eval_at), score_sink=sink, prepared=prepared, registry=registry,
                      run_key=run_key, targets=tuple(targets))
    try:
        return train(run, overwrite=True, storage_path=seed_dir, run_name=SEED_RUN, hooks=hooks).metrics
    except Exception:
        if _ended_with_its_trial(registry, run_key):
            return {ENDED_WITH_TRIAL: True}
        raise


def _ended_with_its_trial(registry, run_key: Optional[str]) -> bool:
    """Whether the run ``run_key`` failed because its trial ended (ASHA stopped it, or another seed
    failed): Tune's EndTrialRuns closed its key and ended it on purpose. Its error is then nobody's to
    read, and left on the task Ray printed it as an "Unhandled error ... ActorDiedError" for every trial
    ASHA stopped."""
    import ray

    if registry is None or run_key is None:
        return False
    try:
        return bool(ray.get(registry.is_closed.remote(run_key), timeout=60))
    except Exception:  # noqa: BLE001 - no registry to ask (the experiment ended): the run's own error stands
        return False


def seed_runs(params: dict, setup: TrialSetup) -> dict:
    """seed -> the trial's RunConfig for that seed (no tracking of its own: the experiment's tracker logs the trial)."""
    changes = {"train.tracking": None, **({"train.cpus_per_worker": setup.cpus_per_worker}
                                          if setup.cpus_per_worker else {})}
    return {s: setup.space.run_config(params, seed=s).resolved(changes) for s in setup.seeds}


def rung_metrics(values: list, setup: TrialSetup, step: int, rung: int, final_rung: int,
                 goals: Optional[list] = None) -> dict:
    """What a trial reports for a rung: the target over its seeds' scores, their spread, each seed's score;
    and each goal of a search for several (``goals``: each seed's {key: value}) aggregated as the target is,
    with every seed's value under ``goals``."""
    per_goal = {t.key: [g.get(t.key, math.nan) for g in goals] for t in setup.targets} if goals else {}
    return {TARGET: target_value(values, setup.target), "mean": float(np.mean(values)),
            **{t.key: target_value(per_goal[t.key], setup.target, t.mode) for t in setup.targets if per_goal},
            **({"goals": per_goal} if per_goal else {}),
            "std": float(np.std(values)), "worst": float(np.min(values)), "best_seed": float(np.max(values)),
            "seed_scores": values, "seeds": list(setup.seeds), "step": step, "rung": rung,
            "final_rung": final_rung,
            **{f"seed{s}_score": v for s, v in zip(setup.seeds, values)}}  # scalars for trackers


def run_trial(params: dict, setup: TrialSetup) -> None:
    """Tune's trial function: ``params`` trained with every seed of ``setup``, rung by rung."""
    from raycse.platform.compat import quiet_checkpoint_logger

    quiet_checkpoint_logger()  # (raycse says each rung itself)
    TrialRungs(params, setup).run()


class TrialRungs:
    """One trial's seeds trained to each rung's step, scored there and reported to Tune a rung at a time.

    Parallel seeds: every seed's run goes once to the end, scoring at each rung's step, and the trial
    reports a rung when all seeds have scored it (ASHA stopping the trial ends the runs with it).
    Sequential: each rung continues every seed's run from its checkpoint, one after another."""

    def __init__(self, params: dict, setup: TrialSetup):
        import ray
        from ray import tune
        from ray.util.queue import Queue

        from raycse.train.plan import plan_steps

        self.setup = setup
        # Tune pins every task a trial starts to the trial's placement group (a 0.01-CPU bundle here),
        # where Ray Data's shuffle tasks cannot fit; the seeds' runs are driven from tasks outside it.
        outside = {"num_cpus": 0, "scheduling_strategy": "DEFAULT"}
        self.train_task = ray.remote(_train_outside_trial).options(**outside)
        self.queue = Queue(actor_options=outside)
        self.ctx = tune.get_context()
        trial_dir = Path(self.ctx.get_trial_dir())
        self.trial_root = object_store.join(setup.storage_path, setup.experiment, trial_dir.name)
        told = tune_progress(tune.get_checkpoint()) or no_progress(setup.seeds)
        self.reported = len(told["steps"])  # rungs Tune has (report() updates progress, which may be told)
        self.progress = max(told, saved_progress(self.trial_root) or told, key=lambda p: len(p["steps"]))
        self.runs = seed_runs(params, setup)
        self.ends = rung_ends(plan_steps(self.runs[setup.seeds[0]], setup.num_examples)[1], setup.rungs)
        # rung index -> score (and other goals) per seed; rungs scored before an interruption are kept as they were
        self.scores = {s: dict(enumerate(self.progress["scores"][str(s)])) for s in setup.seeds}
        self.goals = {s: dict(enumerate(self.progress.get("goals", {}).get(str(s), []))) for s in setup.seeds}
        self.running: dict = {}  # seed -> the ObjectRef of its Train run

    def run(self) -> None:
        import ray

        setup, ends = self.setup, self.ends
        if setup.parallel_seeds and len(self.progress["steps"]) < len(ends):
            self.running = {s: self.launch(s, ends[-1]) for s in setup.seeds}
        for rung, stop in enumerate(ends):
            if rung < self.reported:
                continue  # Tune has this rung's report
            if rung < len(self.progress["steps"]):
                self.report(rung)  # saved, but the driver died before Tune's record of it reached storage: told again
                continue
            if not setup.parallel_seeds:
                self.train_in_turn(rung, stop)
            self.collect(rung)
            if rung == len(ends) - 1:
                ray.get(list(self.running.values()))  # the final models are written before the last report
            self.report(rung)

    def launch(self, seed: int, stop: int):
        """Seed ``seed``'s Train run up to step ``stop``, as a task outside the trial's placement group."""
        seed_dir = object_store.join(self.trial_root, f"seed{seed}")
        return self.train_task.remote(self.runs[seed].to_dict(), seed_dir, stop, self.ends,
                                      QueueSink(self.queue, seed), self.setup.prepared.get(seed), self.setup.registry,
                                      f"{self.ctx.get_trial_id()}/seed{seed}", self.setup.targets)

    def train_in_turn(self, rung: int, stop: int) -> None:
        """Each seed without a score at ``rung`` continues its run to ``stop``, one after another."""
        import ray

        for seed in self.setup.seeds:
            if rung not in self.scores[seed]:
                self.running[seed] = self.launch(seed, stop)
                ray.get(self.running[seed])

    def collect(self, rung: int) -> None:
        """Read posted scores until every seed has one for ``rung``; a run that ended without one fails."""
        import ray
        from ray.util.queue import Empty

        while any(rung not in self.scores[s] for s in self.setup.seeds):
            try:
                seed, step, score, goals = self.queue.get(timeout=2)
            except Empty:
                for seed, ref in self.running.items():
                    if rung not in self.scores[seed] and ray.wait([ref], timeout=0)[0]:
                        ray.get(ref)  # raises the run's error, if it had one
                        if rung not in self.scores[seed] and self.queue.empty():
                            raise RuntimeError(f"seed {seed}'s Train run ended without a score at step "
                                               f"{self.ends[rung]}")
                continue
            if step in self.ends:
                self.scores[seed].setdefault(self.ends.index(step), score)
                self.goals[seed].setdefault(self.ends.index(step), goals)

    def report(self, rung: int) -> None:
        """Rung ``rung``'s scores saved on the experiment's storage, then reported to Tune with a checkpoint."""
        from ray import tune

        setup = self.setup
        self.progress["scores"] = {str(s): [self.scores[s][i] for i in range(rung + 1)] for s in setup.seeds}
        self.progress["steps"] = self.ends[:rung + 1]
        if setup.targets:
            self.progress["goals"] = {str(s): [self.goals[s].get(i, {}) for i in range(rung + 1)] for s in setup.seeds}
        # on the experiment's storage before Tune hears of it: Tune's own record of the trial's
        # checkpoint reaches storage seconds later, and a driver lost in between would rerun the rung
        text = json.dumps(self.progress)
        object_store.write_text(object_store.join(self.trial_root, RUNGS), text)
        metrics = rung_metrics([self.scores[s][rung] for s in setup.seeds], setup, self.ends[rung], rung + 1,
                               len(self.ends), [self.goals[s][rung] for s in setup.seeds] if setup.targets else None)
        with temporary_dir("raycse-rung-") as tmp:
            (tmp / RUNGS).write_text(text)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(str(tmp)))


def no_progress(seeds: list[int]) -> dict:
    """The record of a trial that has reported no rung yet."""
    return {"scores": {str(s): [] for s in seeds}, "steps": []}


def tune_progress(checkpoint) -> Optional[dict]:
    """The rungs a trial reported, from the checkpoint Tune restored it with (None for a new trial)."""
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as d:
        path = Path(d) / RUNGS
        if not path.is_file():
            path = Path(d) / "progress.json"  # its earlier name: experiments saved before stay resumable
        return json.loads(path.read_text())


def saved_progress(trial_root: str) -> Optional[dict]:
    """The rungs a trial saved on the experiment's storage, or None."""
    try:
        return json.loads(object_store.read_text(object_store.join(trial_root, RUNGS)))
    except FileNotFoundError:
        return None
