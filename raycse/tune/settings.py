"""The settings of a ``raycse tune`` search: what it searches with, each field also its flag (one
definition: :func:`raycse.config.setting`). A module of its own, light to import: the CLI builds its flags
from it without loading Ray Tune."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from raycse.config import parse_tracking, setting
from raycse.errors import ConfigError
from raycse.tune.trial import parse_target

SEARCHERS = ("optuna", "nsga2", "random")


def _first_seeds(k: int) -> list:
    """--seeds K: the seeds 0..K-1."""
    if k < 1:
        raise ConfigError(f"--seeds must be >= 1, got {k}")
    return list(range(k))


@dataclass
class TuneSettings:
    """What ``raycse tune`` searches with; every field but ``space`` is also its flag (one definition)."""

    space: str
    num_samples: int = setting(8, "--num-samples", "configurations to try", type=int)
    seeds: list = setting([0, 1, 2], "--seeds", "seeds per configuration (0..k-1)", to_value=_first_seeds,
                          flag_default=3, type=int)
    rungs: int = setting(3, "--rungs", "reports per trial (at 1/R, 2/R, ... of its steps); ASHA stops trials "
                                       "between rungs", type=int)
    target: str = setting("mean", "--target", "optimised score over seeds: mean, or mean-Kstd (e.g. mean-1std)")
    searcher: str = setting("optuna", "--searcher", "optuna: TPE (multi-objective with --objectives); nsga2: "
                            "Optuna's NSGA-II; random: baseline", choices=list(SEARCHERS))
    scheduler: str = setting("asha", "--scheduler", "early stopping between rungs (with --objectives: only on the goal "
                             "--stop-on names)", choices=["asha", "none"])
    objectives: Optional[str] = setting(
        None, "--objectives", "search for several goals at once, each aggregated over the seeds as --target says: "
        "NAME:max|min joined by commas, NAME an --eval-metric (sts, beir:DIR:METRIC, mteb:TASK) optionally @DIM (a "
        "Matryoshka size) and @PRECISION (int8, binary...), or speed (sentences/s of the trial's model embedding the "
        "dev data), dims or params; e.g. 'sts:max,sts@64:max' (a space file's targets: list; raycse analyze draws "
        "their Pareto front)", metavar="GOALS")
    stop_on: Optional[str] = setting(None, "--stop-on", "with --objectives and --scheduler asha: the goal ASHA stops "
                                     "trials early on (without it, every trial runs to its end)", metavar="GOAL")
    grace_period: int = setting(1, "--grace-period", "rungs every trial runs before ASHA may stop it", type=int)
    reduction_factor: int = setting(2, "--reduction-factor", "ASHA keeps 1/F of trials at each rung", type=int)
    search_seed: int = setting(0, "--search-seed", "seed of the searcher (TPE / random sampler)", type=int)
    concurrent: Optional[int] = setting(None, "--concurrent", "trials at once (default: as many as the CPUs, or with "
                                        "use_gpu the GPUs at train.gpus_per_worker, fit)", type=int)
    learn_from_truncated: bool = setting(False, "--learn-from-truncated", "let Optuna treat an early-stopped "
                                         "trial's last value as final (default: it is PRUNED)", action="store_true")
    preflight: bool = setting(True, "--no-preflight", "skip the check that one trial fits the cluster "
                              "(autoscaling clusters)", action="store_false")
    # (Optuna's own default is 10)
    tpe_startup_trials: int = setting(5, "--tpe-startup", "random trials before TPE starts modelling", type=int)
    time_budget_s: Optional[float] = setting(None, "--time-budget", "seconds after which no new trial starts; the "
                                             "running ones finish", type=float)
    # None: side by side when the cluster holds them, which the pre-flight decides and records
    parallel_seeds: Optional[bool] = setting(
        None, "--seeds-in-turn", "train a trial's seeds one after another, a new fit per seed and rung (default: side "
        "by side, one fit per seed scored at every rung, when the cluster holds k runs at once)",
        action="store_const", const=False)
    tracking: Optional[str] = setting(
        None, "--tracking", "log every trial (knobs, each rung's target, mean, std and per-seed scores) to mlflow:URI "
        "(a run per trial in an MLflow experiment named after this one), tensorboard:DIR (DIR/NAME/<trial>) or "
        "wandb:[ENTITY/]PROJECT (a run per trial, grouped by experiment), or several joined by commas, through Ray "
        "Tune's logger callbacks (default: off)", metavar="SPEC")
    corpus: Optional[str] = setting(None, "--corpus", "the training corpus of every trial (replaces the space's "
                                    "run.data.corpus)", metavar="FILE_OR_URI")
    optuna_storage: Optional[str] = setting(
        None, "--optuna-storage", "keep the Optuna study in this database (e.g. postgresql://host/db; the password "
        "from the environment, e.g. PGPASSWORD) instead of the default, an SQLite file beside the experiment "
        "(EXP/optuna.db), opened by optuna.load_study(study_name=EXPERIMENT, storage=...)", metavar="URL")

    # (dotted run key, text): tune's --set run.KEY=VALUE and resource flags, applied to the space's run
    # (raycse.tune.space.with_run_settings) and recorded in the experiment's space.yaml
    run_overrides: list = field(default_factory=list)

    def validate(self) -> "TuneSettings":
        parse_tracking(self.tracking)
        if self.num_samples < 1:
            raise ConfigError(f"--num-samples must be >= 1, got {self.num_samples}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be distinct and at least one, got {self.seeds}")
        if self.rungs < 1:
            raise ConfigError(f"--rungs must be >= 1, got {self.rungs}")
        if self.searcher not in SEARCHERS:
            raise ConfigError(f"--searcher must be one of {', '.join(SEARCHERS)}, got {self.searcher!r}")
        if self.scheduler not in ("asha", "none"):
            raise ConfigError(f"--scheduler must be asha or none, got {self.scheduler!r}")
        if not 1 <= self.grace_period <= self.rungs:
            raise ConfigError(f"--grace-period must be in [1, rungs={self.rungs}], got {self.grace_period}")
        if self.reduction_factor < 2:
            raise ConfigError(f"--reduction-factor must be >= 2, got {self.reduction_factor}")
        if self.concurrent is not None and self.concurrent < 1:
            raise ConfigError(f"--concurrent must be >= 1 (or left out: as many as the CPUs fit), got {self.concurrent}")
        if self.time_budget_s is not None and not (math.isfinite(self.time_budget_s) and self.time_budget_s > 0):
            raise ConfigError(f"--time-budget must be a positive number of seconds, got {self.time_budget_s}")
        if self.tpe_startup_trials < 0:
            raise ConfigError(f"--tpe-startup must be >= 0, got {self.tpe_startup_trials}")
        self.target = parse_target(self.target)
        goals = self.goals()
        if self.stop_on is not None and self.stop_on not in [g.name for g in goals]:
            raise ConfigError(f"--stop-on {self.stop_on!r} names no goal of --objectives "
                              f"({', '.join(g.name for g in goals) or 'none given'})")
        return self

    def goals(self) -> list:
        """The goals of a search for several (raycse.evaluation.targets.Target), or [] for one."""
        from raycse.evaluation.targets import parse_targets

        return parse_targets(self.objectives) if self.objectives else []

    def stop_goal(self):
        """The goal ASHA stops on with several goals (--stop-on), else None."""
        return next((g for g in self.goals() if g.name == self.stop_on), None)
