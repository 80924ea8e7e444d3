"""What picks a search's configurations and stops its trials: Optuna's sampler (TPE, NSGA-II or random, seeded)
behind Ray Tune's OptunaSearch, which tells Optuna a trial ASHA stopped early as pruned and starts none once the
time budget has passed; and ASHA on the target (or on the one goal --stop-on names)."""

from __future__ import annotations

import os
import time
from typing import Optional

from raycse.tune import study
from raycse.tune.settings import TuneSettings
from raycse.tune.space import SearchSpace
from raycse.tune.trial import TARGET, is_final

_DRIVER = os.urandom(8).hex()  # this process, as a searcher pickled by another driver can tell


def optuna_search(space: SearchSpace, settings: TuneSettings, where: Optional[study.StudyPlace] = None):
    import optuna
    from ray.tune.search import Searcher
    from ray.tune.search.optuna import OptunaSearch

    class TruncationAwareOptunaSearch(OptunaSearch):
        """Trials ASHA stopped early go to Optuna as PRUNED, not as finished values (unless asked). With a
        time budget, no trial starts once it has passed and the running ones finish (Tune's own
        ``time_budget_s`` stops every running trial: their work since the last rung was lost)."""

        def __init__(self, *args, learn_from_truncated: bool = False, budget_s: Optional[float] = None,
                     **kwargs):
            super().__init__(*args, **kwargs)
            self.learn_from_truncated = learn_from_truncated
            self.budget_s = budget_s
            self.clock: Optional[tuple[str, float]] = None  # (driver process, its first suggestion's time)

        def suggest(self, trial_id: str):
            if self.budget_s is not None:
                # the budget counts from this driver's first suggestion: a resumed experiment's searcher
                # (pickled by Tune with the lost driver's clock) gets the whole budget again, as Tune's would
                if self.clock is None or self.clock[0] != _DRIVER:
                    self.clock = (_DRIVER, time.time())
                if time.time() - self.clock[1] > self.budget_s:
                    return Searcher.FINISHED
            return super().suggest(trial_id)

        def on_trial_result(self, trial_id: str, result: dict):
            try:
                super().on_trial_result(trial_id, result)
            except optuna.exceptions.UpdateFinishedTrialError:
                # a resumed experiment's searcher (Tune's last checkpoint of it, older than the kept
                # study) re-reporting a trial that the lost driver already finished: the study has it
                pass

        def on_trial_complete(self, trial_id: str, result: Optional[dict] = None, error: bool = False):
            if result and not self.learn_from_truncated and not is_final(result):
                result = None
            super().on_trial_complete(trial_id, result, error)  # (Ray's tell logs an already-told trial)

    kept = {"storage": where.storage(), "study_name": where.name} if where is not None else {}  # else in memory
    goals = settings.goals()  # several: Optuna's multi-objective study, its Pareto front kept
    metric, mode = ([g.key for g in goals], [g.mode for g in goals]) if goals else (TARGET, "max")
    return TruncationAwareOptunaSearch(space=space.define_by_run(), metric=metric, mode=mode,
                                       sampler=sampler(settings), learn_from_truncated=settings.learn_from_truncated,
                                       budget_s=settings.time_budget_s, **kept)


def sampler(settings: TuneSettings):
    """Optuna's TPE (which samples multi-objective studies too), NSGA-II or random, seeded."""
    import optuna

    if settings.searcher == "optuna":
        return optuna.samplers.TPESampler(seed=settings.search_seed, n_startup_trials=settings.tpe_startup_trials)
    if settings.searcher == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=settings.search_seed)
    return optuna.samplers.RandomSampler(seed=settings.search_seed)


def scheduler(settings: TuneSettings):
    """ASHA on the target; with several goals on the one --stop-on names, else none (every trial runs to
    its end: ASHA ranks trials by one number, and no goal is picked for the user)."""
    stop_goal = settings.stop_goal()
    if settings.scheduler == "none" or settings.rungs == 1 or (settings.goals() and stop_goal is None):
        return None
    from ray.tune.schedulers import ASHAScheduler

    metric, mode = (stop_goal.key, stop_goal.mode) if stop_goal else (TARGET, "max")
    return ASHAScheduler(time_attr="rung", metric=metric, mode=mode, max_t=settings.rungs,
                         grace_period=settings.grace_period, reduction_factor=settings.reduction_factor)


def scheduler_note(settings: TuneSettings) -> str:
    """What stops trials early, as the start-up line says it."""
    if settings.scheduler == "none" or settings.rungs == 1:
        return "scheduler none"
    if not settings.goals():
        return "scheduler asha"
    if settings.stop_goal() is None:
        return "no early stopping (several goals: --stop-on GOAL lets ASHA stop trials on one)"
    return f"scheduler asha on {settings.stop_on}"
