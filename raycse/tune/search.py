"""Ray Tune + Optuna over a search space, each trial k seeds; resumable.

:func:`tune_search` starts an experiment, :func:`resume` continues one: each builds the one
:class:`~raycse.tune.experiment.Experiment` value and runs it. Both write ``raycse_tune.json`` (the settings) and a copy
of the space file into the experiment directory, so that a resumed run, ``raycse analyze`` and a notebook see exactly
what ran. The parts: the searcher and scheduler (searcher.py), what the cluster holds (capacity.py), the trials'
callbacks (callbacks.py), the experiment's record and fit (experiment.py).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from raycse.config import EvalConfig
from raycse.errors import ConfigError, require, require_installed
from raycse.platform import object_store
from raycse.platform.redact import refuse_credentials
from raycse.train import tracking as train_tracking
from raycse.tune import study
# (older experiments' pickled callbacks name these classes here)
from raycse.tune.callbacks import DropTrainCheckpoints, EndTrialRuns  # noqa: F401
from raycse.tune.callbacks import trial_dirname
from raycse.tune.capacity import preflight
from raycse.tune.experiment import (Experiment, experiment_location, load_settings, prepare_seeds,
                                    write_records)
from raycse.tune.searcher import optuna_search, scheduler, scheduler_note
from raycse.tune.settings import TuneSettings
from raycse.tune.space import SearchSpace, load_space, space_text


def tune_search(settings: TuneSettings, storage_path: str = "outputs/tune", name: Optional[str] = None):
    """Run a search; returns (experiment directory, ResultGrid)."""
    from ray import tune

    from raycse.platform.ray_session import ensure_ray, setup_ray_data

    settings.validate()
    if settings.searcher != "random":
        require("optuna", "tune", f"raycse tune --searcher {settings.searcher}")
    refuse_credentials("--storage-path", str(storage_path))
    refuse_credentials("--tracking", settings.tracking)
    train_tracking.check(settings.tracking)
    refuse_credentials("--optuna-storage", settings.optuna_storage)  # (Tune pickles the searcher with it)
    for goal in settings.goals():  # (a beir:DIR goal's DIR is recorded with the experiment)
        kind, directory, _ = EvalConfig(metric=goal.metric).selection() if goal.metric else (None, None, None)
        if kind == "beir":
            refuse_credentials("--objectives", directory)
    text = (space_text(settings.space, settings.corpus, settings.run_overrides) if Path(settings.space).is_file()
            else "")
    refuse_credentials("the search space", text)  # (with its --corpus and --set: the experiment records them)
    space = load_space(settings.space, settings.corpus, settings.run_overrides)
    if space.targets and not settings.objectives:  # (recorded as the flag: a resume and analyze read it there)
        settings.objectives = ",".join(space.targets)
        settings.validate()
    run = space.run_config({})  # (the base run, built once)
    check_goals(space, settings, run)
    check_space_extras(space, run)
    name = name or f"{Path(settings.space).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    exp_dir = experiment_location(storage_path, name)
    if object_store.exists(exp_dir):
        raise ConfigError(f"experiment directory {exp_dir} exists; continue it with --resume {exp_dir} or pick "
                          f"another --name")
    need = check_run(space, run)  # (a missing or untrusted model, or one that will not fit, refused before Ray starts)
    experiment = Experiment(settings, space, exp_dir, run)
    ensure_ray()
    setup_ray_data()
    concurrent, per_worker, settings.parallel_seeds = preflight(run, settings, need)
    prepared, num_examples = prepare_seeds(space, list(settings.seeds))  # data errors before any file
    where = study.place(exp_dir, name, settings.optuna_storage)
    settings_dict = {**asdict(settings), "space": object_store.join(str(exp_dir), "space.yaml"),
                     "num_examples": num_examples, "concurrent": concurrent, "cpus_per_worker": per_worker,
                     "optuna_study": {"name": where.name, "storage": where.remote or where.url}}
    write_records(exp_dir, text, settings_dict)
    study.prepare(where)
    print(f"[raycse] experiment {exp_dir}: {settings.num_samples} configurations x {len(settings.seeds)} seeds, "
          f"{settings.rungs} rung(s), {settings.searcher} search{goals_note(settings)}, {scheduler_note(settings)}, "
          f"{concurrent} concurrent trial(s), seeds {'side by side' if settings.parallel_seeds else 'in turn'}, "
          f"{per_worker:g} CPU per Train worker; Optuna study '{where.name}' in {where.remote or where.url}", flush=True)
    with experiment.registry() as registry:
        tuner = tune.Tuner(
            experiment.trainable(num_examples, per_worker, prepared, registry),
            tune_config=tune.TuneConfig(search_alg=optuna_search(space, settings, where),
                                        scheduler=scheduler(settings),
                                        num_samples=settings.num_samples, max_concurrent_trials=concurrent,
                                        trial_dirname_creator=trial_dirname),
            run_config=tune.RunConfig(name=name, storage_path=experiment.parent, verbose=1,
                                      checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                                      callbacks=experiment.callbacks()),
        )
        return exp_dir, experiment.fit(tuner, where)


def resume(exp_dir: str):
    """Continue an interrupted experiment (a local path or a URI): finished trials are kept,
    unfinished ones continue from their last reported rung."""
    from ray import tune

    from raycse.platform.ray_session import ensure_ray, setup_ray_data

    refuse_credentials("--resume", str(exp_dir))
    exp = object_store.located(exp_dir)
    settings, extra = load_settings(exp)
    space = load_space(settings.space)
    experiment = Experiment(settings, space, exp, space.run_config({}))
    ensure_ray()
    setup_ray_data()
    if not tune.Tuner.can_restore(str(exp)):
        raise ConfigError(f"{exp} has no Tune state to resume (the run stopped before its first trial started); "
                          f"start it again")
    print(f"[raycse] resuming {exp}", flush=True)
    prepared, _ = prepare_seeds(space, list(settings.seeds))  # the laid-out batches died with the last driver
    where = study.place(exp, object_store.name(exp), settings.optuna_storage)
    study.fetch(where)  # (Tune's restored searcher reopens the study by its URL)
    with experiment.registry() as registry:
        tuner = tune.Tuner.restore(str(exp), experiment.trainable(extra["num_examples"], extra["cpus_per_worker"],
                                                                  prepared, registry),
                                   resume_unfinished=True, resume_errored=True)
        return exp, experiment.fit(tuner, where)


def check_run(space: SearchSpace, run) -> Optional[int]:
    """The space's run without knobs (``run``) checked as a training run is (corpus named, data fits the objective,
    model found, each worker fits its memory); the bytes a worker of it needs (None: not estimated)."""
    from raycse.config.sources import check_corpora
    from raycse.data.dataset import resolve_sources
    from raycse.model.loading import resolve_model
    from raycse.train.memory import check_fits
    from raycse.train.model_checks import check_models, text_sample
    from raycse.train.preflight import check_data_fits_objective

    if not run.data.corpus and not run.data.is_mixture:
        raise ConfigError(f"{space.path}: run.data.corpus is not set; pass --corpus FILE or name the training "
                          f"corpus in the space file")
    check_corpora(run.data.sources, "--set run.data.sources.{name}.corpus=PATH")
    alone = list(run.source_runs().values()) or [run]  # (a mixture: each source as its own run)
    for each in alone:
        check_data_fits_objective(each)
    model_path = resolve_model(run.model.name_or_path, run.model.trust_remote_code)
    # the teacher and the guide as the student (each trial's own run checks them again, after its knobs)
    sources = [None if each.data.format == "hf" else resolve_sources(each.data.corpus) for each in alone]
    check_models(run, model_path, text_sample(alone[0], sources[0], None))
    try:
        need = check_fits(run, model_path)
    except ConfigError as e:  # (the fixes are train's flags; a search sets them on its run)
        raise ConfigError(f"{space.path}: a trial's run will not fit: {e}; raycse tune sets them as "
                          f"--set run.KEY=VALUE (e.g. --set run.train.sharding=fsdp)") from None
    if run.eval.selection()[0] == "stsb_dev":
        from raycse.evaluation.selection import stsb_dev

        if stsb_dev(run.eval) is None:  # (else every trial trained, then failed for want of a score)
            raise ConfigError(f"{space.path}: raycse tune scores every trial on STS-B dev, and run.eval.stsb_dev is "
                              f"{run.eval.stsb_dev or 'none'} (none found); name the file: --set run.eval.stsb_dev=FILE")
    return need.total if need is not None else None


def goals_note(settings: TuneSettings) -> str:
    goals = settings.goals()
    return f" for {len(goals)} goals ({', '.join(f'{g.name} {g.mode}' for g in goals)})" if goals else ""


def check_goals(space: SearchSpace, settings: TuneSettings, run) -> None:
    """A search's goals fit its runs: each @DIM a Matryoshka size that every run the space can make trains."""
    from raycse.evaluation.targets import check_sizes

    goals = settings.goals()
    if not goals:
        return
    knobs = [k for k in space.knobs if k.key == "objective.matryoshka_dims"]
    trained = [] if any(not k.when for k in knobs) else [run.objective.matryoshka_dims]
    trained += [list(choice) if choice else None for k in knobs for choice in (k.args if k.kind == "choice" else [])]
    check_sizes(goals, trained)


def check_space_extras(space: SearchSpace, run) -> None:
    """The optional packages some trial of ``space`` (its base run ``run``) needs, before Ray starts (not in a trial's
    error)."""
    from raycse.config.grouping import strategy_requires
    from raycse.train.preflight import check_extras

    check_extras(run)

    for knob in space.knobs:
        if knob.key == "grouping.strategy" and knob.kind == "choice":
            for strategy in map(str, knob.args):
                for module, installs in strategy_requires(strategy).items():
                    require_installed(module, installs, f"the search space's {knob.name} knob "
                                                        f"({', '.join(map(str, knob.args))})")
