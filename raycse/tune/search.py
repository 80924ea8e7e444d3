"""Ray Tune + Optuna over a search space, each trial k seeds; resumable.

:func:`tune_search` starts an experiment, :func:`resume` continues one. Both write
``raycse_tune.json`` (the settings) and a copy of the space file into the experiment directory,
so that a resumed run, ``raycse analyze`` and a notebook see exactly what ran.
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from ray.tune import Callback

from raycse.config import EvalConfig, parse_tracking
from raycse.errors import ConfigError, require, require_installed
from raycse.platform import object_store
from raycse.platform.redact import refuse_credentials
from raycse.train import tracking as train_tracking
from raycse.tune import study
from raycse.tune.settings import TuneSettings
from raycse.tune.space import SearchSpace, load_space, space_text
from raycse.tune.trial import SEED_MODEL, SEED_RUN, TARGET, TrialSetup, is_final, run_trial

SETTINGS = "raycse_tune.json"
_DRIVER = os.urandom(8).hex()  # this process, as a searcher pickled by another driver can tell
TRIAL_CPU = 0.01  # the trial function only coordinates; the Train workers hold the real CPUs


def _optuna_search(space: SearchSpace, settings: TuneSettings, where: Optional[study.StudyPlace] = None):
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
                                       sampler=_sampler(settings), learn_from_truncated=settings.learn_from_truncated,
                                       budget_s=settings.time_budget_s, **kept)


def _sampler(settings: TuneSettings):
    """Optuna's TPE (which samples multi-objective studies too), NSGA-II or random, seeded."""
    import optuna

    if settings.searcher == "optuna":
        return optuna.samplers.TPESampler(seed=settings.search_seed, n_startup_trials=settings.tpe_startup_trials)
    if settings.searcher == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=settings.search_seed)
    return optuna.samplers.RandomSampler(seed=settings.search_seed)


def _scheduler(settings: TuneSettings):
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


def preflight(space: SearchSpace, settings: TuneSettings, run=None) -> tuple[int, float, bool]:
    """Check the space's run (corpus named, objective fits the data, model found) and that one trial
    fits what the cluster can grow to, before any data is read; returns (concurrent trials, CPUs per Train
    worker, seeds side by side), said in one line with why. Fails with the numbers instead of letting
    trials wait in PENDING forever. ``run``: the space's run, where the caller checked it already."""
    from raycse.platform.capacity import cluster_ceiling

    run = run if run is not None else _checked_run(space)
    ceiling = cluster_ceiling()
    cpus, gpus = _most(ceiling, "CPU"), _most(ceiling, "GPU")
    t, k = run.train, len(settings.seeds)
    workers, per_worker, share = t.num_workers, t.cpus_per_worker, t.gpu_share  # (share: 0 without use_gpu)
    if settings.preflight:
        _check_one_trial_fits(t, ceiling, cpus, gpus)
    parallel = settings.parallel_seeds
    if parallel is None:  # side by side unless k runs at once cannot fit
        parallel = (gpus + 1e-9 >= k * workers * share if t.use_gpu
                    else per_worker is None or k * workers * per_worker + TRIAL_CPU <= cpus) or not settings.preflight
        if not parallel:
            print(f"[raycse] the {k} seeds run one after another: {k} x {workers} worker(s) do not fit the cluster "
                  f"at once", flush=True)
    runs = k if parallel else 1
    concurrent, why = settings.concurrent, "--concurrent"
    if concurrent is None:
        if t.use_gpu:  # as many trials as the GPUs hold: 1 GPU at 0.25 a worker runs 4 one-worker trials
            concurrent = _at_most(gpus / (workers * runs * share), settings.num_samples)
            why = f"{gpus:g} GPU(s) / ({runs} run(s) x {workers} worker(s) x {share:g} GPU) a trial"
        else:
            concurrent = _at_most(cpus / (runs * workers * (per_worker or 1.0) + TRIAL_CPU), settings.num_samples)
            why = f"{cpus:g} CPU(s) / ({runs} run(s) x {workers} worker(s) x {per_worker or 1.0:g} CPU) a trial"
    if per_worker is None:
        per_worker = _cpus_per_worker(ceiling, cpus, concurrent, runs * workers, share, settings.preflight)
    print(f"[raycse] {concurrent} trial(s) at once: {why}; the cluster: {ceiling.describe()}", flush=True)
    return concurrent, per_worker, parallel


def _checked_run(space: SearchSpace):
    """The space's run without knobs, checked as a training run is (corpus named, data fits the objective,
    model found)."""
    from raycse.config.sources import check_corpora
    from raycse.data.dataset import resolve_sources
    from raycse.model.loading import resolve_model
    from raycse.train.model_checks import check_models, text_sample
    from raycse.train.preflight import check_data_fits_objective

    run = space.run_config({})
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
    if run.eval.selection()[0] == "stsb_dev":
        from raycse.evaluation.selection import stsb_dev

        if stsb_dev(run.eval) is None:  # (else every trial trained, then failed for want of a score)
            raise ConfigError(f"{space.path}: raycse tune scores every trial on STS-B dev, and run.eval.stsb_dev is "
                              f"{run.eval.stsb_dev or 'none'} (none found); name the file: --set run.eval.stsb_dev=FILE")
    return run


def _most(ceiling, resource: str) -> float:
    """What the cluster can hold of ``resource``: its ceiling, or what is up now where more is up."""
    import ray

    return max(ceiling.total(resource), float(ray.cluster_resources().get(resource, 0)))


def _at_most(fit: float, num_samples: int) -> int:
    return max(1, min(num_samples, int(fit + 1e-9) if math.isfinite(fit) else num_samples))


def _check_one_trial_fits(t, ceiling, cpus: float, gpus: float) -> None:
    """One trial's Train workers fit what the cluster can grow to, and each worker fits one node."""
    workers, share, per_worker = t.num_workers, t.gpu_share, t.cpus_per_worker
    fix = "add nodes or node types the autoscaler may launch"
    if t.use_gpu and gpus < t.gpus_needed():
        raise ConfigError(f"a trial needs {t.gpus_needed()} GPU(s) ({workers} worker(s) x {share:g} GPU) but the "
                          f"cluster can hold {gpus:g} ({ceiling.describe()}); lower --num-workers or "
                          f"--gpus-per-worker, or {fix}")
    if t.use_gpu and share > ceiling.largest("GPU"):
        raise ConfigError(f"a Train worker asks for {share:g} GPU(s) and the largest node holds "
                          f"{ceiling.largest('GPU'):g} ({ceiling.describe()}); lower --gpus-per-worker, or {fix}")
    if per_worker is not None and workers * per_worker + TRIAL_CPU > cpus:
        raise ConfigError(f"a trial needs {workers} worker(s) x {per_worker:g} CPU + {TRIAL_CPU} = "
                          f"{workers * per_worker + TRIAL_CPU:g} CPUs but the cluster can hold {cpus:g} "
                          f"({ceiling.describe()}); lower --num-workers / --cpus-per-worker, or {fix}")
    if per_worker is not None and per_worker > ceiling.largest("CPU"):
        raise ConfigError(f"a Train worker asks for {per_worker:g} CPUs and the largest node holds "
                          f"{ceiling.largest('CPU'):g} ({ceiling.describe()}); lower --cpus-per-worker, or {fix}")


def _cpus_per_worker(ceiling, cpus: float, concurrent: int, workers_a_trial: int, share: float, check: bool) -> float:
    """CPUs each Train worker reserves where the run does not say: the cluster's CPUs (less the trials' own)
    shared between every worker going at once, no more than a node holds, and for a GPU share no more than
    the GPU nodes have per share (0.5 GPU on a node of 2 CPUs and 1 GPU: 1 CPU, so two such workers pack it)."""
    from raycse.platform.capacity import worker_cpu_cap

    workers_at_once = concurrent * workers_a_trial
    fair = (cpus - concurrent * TRIAL_CPU) / workers_at_once
    cap = worker_cpu_cap(ceiling, share)
    # (a GPU share's less a trial's coordinating CPU, which may land on the same node)
    bounds = [fair] + ([cap - (TRIAL_CPU if share else 0)] if cap else [])
    per_worker = math.floor(100 * min(bounds)) / 100
    if per_worker <= 0 and check:
        raise ConfigError(f"{workers_at_once} Train worker(s) at once do not fit {cpus:g} CPUs; lower --concurrent "
                          f"or --num-workers")
    return per_worker


def drop_train_checkpoints(trial_path: str, fs=None) -> None:
    """Delete a finished trial's Train checkpoints (``seed*/SEED_RUN``) and the staging directories
    of seed runs that were cut short (``seed*/.model_out.partial-*``), keeping each seed's final model.

    Why: a trial never runs again once Tune has ended it (complete, stopped by ASHA, errored), and
    each seed's resumable checkpoints hold weights + optimizer state (~360 MB each for MiniLM), so a
    search's disk would grow with every trial. A seed run that ASHA's stop killed never got to
    remove its staging directory itself. A local path, a URI, or (Tune's ``trial.path`` on object
    storage) a path within ``fs``."""
    import pyarrow.fs as pafs

    from raycse.platform.staging import staging_prefix

    if fs is not None:
        root = trial_path
    else:
        fs, root = pafs.FileSystem.from_uri(trial_path if object_store.is_uri(trial_path)
                                            else str(Path(trial_path).resolve()))
    try:
        seeds = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except OSError:
        return
    for info in seeds:
        if info.type == pafs.FileType.Directory and info.base_name.startswith("seed"):
            for entry in fs.get_file_info(pafs.FileSelector(info.path)):
                if entry.type == pafs.FileType.Directory and (
                        entry.base_name == SEED_RUN or entry.base_name.startswith(staging_prefix(SEED_MODEL))):
                    fs.delete_dir(entry.path)


class EndTrialRuns(Callback):
    """Ends every Train run of a trial's seeds as soon as Tune ends the trial (complete, stopped by
    ASHA, errored), before the trial's CPUs are offered to the next trial: Tune runs callbacks in
    its control loop, so no trial starts while this waits (bounded; raycse.platform.release)."""

    def __init__(self, registry_name: str, timeout_s: float):
        # by name: Tune pickles its callbacks with the experiment, and a resumed one has a new registry
        self.registry_name, self.timeout_s = registry_name, timeout_s

    def _end(self, trial) -> None:
        import ray

        from raycse.platform.release import ReleaseError, release

        try:
            release(ray.get_actor(self.registry_name), f"{trial.trial_id}/", self.timeout_s, close=True)
        except (ReleaseError, ValueError, ray.exceptions.RayError) as err:  # ValueError: no registry
            print(f"[raycse] warning: trial {trial.trial_id}: its Train runs could not be ended: {err}", flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._end(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._end(trial)

    def on_experiment_end(self, trials, **info):
        for t in trials:
            self._end(t)


class DropTrainCheckpoints(Callback):
    """Frees each trial's Train checkpoints once Tune has ended the trial (see above). A trial that
    finished its rungs has no run left; one stopped early (ASHA) or failed still has runs being torn
    down, so its directory is freed at the next trial's end (or the experiment's), not under them."""

    def __init__(self):
        self.ending: list = []

    def _ended(self, trial, finished: bool) -> None:
        for path, fs in self.ending:
            drop_train_checkpoints(path, fs)
        self.ending = []
        if finished:
            _drop(trial)
        else:  # (path, filesystem): this callback is pickled with the experiment, a Trial is not needed
            self.ending.append((trial.path, trial.storage.storage_filesystem))

    def on_trial_complete(self, iteration, trials, trial, **info):
        last = trial.last_result or {}
        self._ended(trial, finished=bool(last) and is_final(last))

    def on_trial_error(self, iteration, trials, trial, **info):
        self._ended(trial, finished=False)

    def on_experiment_end(self, trials, **info):
        for t in trials:
            if t.status in ("TERMINATED", "ERROR"):
                _drop(t)


def _drop(trial) -> None:
    # trial.path is a path within the experiment's filesystem (no s3:// on object storage)
    drop_train_checkpoints(trial.path, trial.storage.storage_filesystem)


def prepare_seeds(space: SearchSpace, seeds: list) -> tuple[dict, int]:
    """Each seed's corpus read and batches laid out once, here, for every trial of the experiment;
    returns (seed -> ObjectRef of its PreparedData, examples in the corpus).

    Why: each trial's seeds otherwise read the corpus and laid out their batches through Ray Data
    again (~10 s of a ~30 s trial start-up on 2 cores, identical for every trial whose knobs leave
    the data alone), and those tasks held the CPUs the trial's Train workers were waiting for.
    A trial whose knobs do change the batches (batch size, grouping) lays out its own."""
    from raycse.train.prepare import load_run_corpus, prepare_data

    import ray

    prepared, num_examples = {}, None
    for seed in seeds:
        data = prepare_data(space.run_config({}, seed=seed))
        if data is None:  # batches regrouped by the model in training: every trial lays out its own
            break
        # by reference: a trial hands it to its seeds' runs unopened (unpickling it would import
        # torch, transformers and Ray Data into the trial's process, seconds of each trial's time)
        prepared[seed], num_examples = ray.put(data), data.num_examples
    if prepared:  # the example count does not depend on the seed (dedup comes before data.max_sentences)
        return prepared, num_examples
    run = space.run_config({})
    return {}, load_run_corpus(run).num_examples


def _trainable(settings: TuneSettings, space: SearchSpace, exp_dir: Path, num_examples: int, cpus_per_worker: float,
               prepared: dict, registry):
    from ray import tune

    setup = TrialSetup(space, list(settings.seeds), settings.rungs, settings.target, num_examples,
                       _parent(exp_dir), _name(exp_dir), cpus_per_worker, bool(settings.parallel_seeds), prepared,
                       registry, tuple(settings.goals()))
    return tune.with_resources(tune.with_parameters(run_trial, setup=setup), {"CPU": TRIAL_CPU})


@contextmanager
def _experiment_registry(exp_dir, space: SearchSpace):
    """The experiment's RunRegistry (raycse.platform.release), named after its directory, for the
    length of its fit: then any run still registered (an interrupted fit's) is ended and the
    registry with it, so the driver keeps nothing of the experiment."""
    from raycse.platform.release import release, start_registry, stop_registry

    name = _registry_name(exp_dir)
    registry = start_registry(name)
    try:
        yield registry
    finally:
        try:
            release(registry, "", _release_timeout(space))
        finally:
            stop_registry(registry, name)


def _release_timeout(space: SearchSpace) -> float:
    from raycse.platform.release import RELEASE_MARGIN_S

    return space.run_config({}).train.worker_start_timeout_s + RELEASE_MARGIN_S


def _registry_name(exp_dir: Path) -> str:
    return f"raycse-runs:{exp_dir}"


def _callbacks(space: SearchSpace, exp_dir: Path, tracking: Optional[str] = None) -> list:
    return [EndTrialRuns(_registry_name(exp_dir), _release_timeout(space)), DropTrainCheckpoints(),
            *_tracking_callbacks(tracking, _name(exp_dir))]


def _tracking_callbacks(tracking: Optional[str], experiment: str) -> list:
    """Ray Tune's own MLflow / TensorBoard / W&B logger callbacks, one per tracker named: a run per trial
    with its knobs as parameters and every rung's report (target, mean, std, worst, each seed's score)
    as metrics."""
    return [_tracking_callback(kind, target, experiment) for kind, target in parse_tracking(tracking)]


def _tracking_callback(kind: str, target: str, experiment: str):
    """The tracker's Ray Tune callback (raycse.train.tracker.Tracker.tune_callback: raycse's own and a user's
    alike)."""
    callback = train_tracking.get(kind).tune_callback(target, experiment)
    if callback is None:
        raise ConfigError(f"the tracker '{kind}' gives no Ray Tune callback (Tracker.tune_callback), so raycse tune "
                          f"cannot log trials to it; drop it from --tracking")
    return callback


def knob_text(value) -> str:
    """A knob as a trial directory shows it: 4 significant digits, never rounded to 0 (4.4e-05, not 0.0000)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def short_knob(key: str) -> str:
    """A knob's name in a trial's folder: its last part (tau), with its source for a mixture's (wiki.tau, sts.tau)."""
    parts = key.split(".")
    return f"{parts[2]}.{parts[-1]}" if key.startswith("data.sources.") and len(parts) > 3 else parts[-1]


def trial_dirname(trial) -> str:
    """``trial_<id>_<knob=value,...>``: Tune's default formats floats to 4 decimals (lr=0.0000)."""
    knobs = ",".join(f"{short_knob(k)}={knob_text(v)}" for k, v in sorted(trial.config.items())
                     if isinstance(v, (int, float, str, bool)))
    safe = "".join(ch if ch.isalnum() or ch in "=,.-+_" else "_" for ch in knobs)
    return f"trial_{trial.trial_id}_{safe}"[:120]


def goals_note(settings: TuneSettings) -> str:
    goals = settings.goals()
    return f" for {len(goals)} goals ({', '.join(f'{g.name} {g.mode}' for g in goals)})" if goals else ""


def check_goals(space: SearchSpace, settings: TuneSettings) -> None:
    """A search's goals fit its runs: each @DIM a Matryoshka size that every run the space can make trains."""
    from raycse.evaluation.targets import check_sizes

    goals = settings.goals()
    if not goals:
        return
    knobs = [k for k in space.knobs if k.key == "objective.matryoshka_dims"]
    trained = [] if any(not k.when for k in knobs) else [space.run_config({}).objective.matryoshka_dims]
    trained += [list(choice) if choice else None for k in knobs for choice in (k.args if k.kind == "choice" else [])]
    check_sizes(goals, trained)


def check_space_extras(space: SearchSpace) -> None:
    """The optional packages some trial of ``space`` needs, before Ray starts (not in a trial's error)."""
    from raycse.train.preflight import check_extras

    check_extras(space.run_config({}))
    from raycse.config.grouping import strategy_requires

    for knob in space.knobs:
        if knob.key == "grouping.strategy" and knob.kind == "choice":
            for strategy in map(str, knob.args):
                for module, installs in strategy_requires(strategy).items():
                    require_installed(module, installs, f"the search space's {knob.name} knob "
                                                        f"({', '.join(map(str, knob.args))})")


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
    check_goals(space, settings)
    check_space_extras(space)
    name = name or f"{Path(settings.space).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    exp_dir = experiment_location(storage_path, name)
    if (object_store.prefix_exists(str(exp_dir)) if object_store.is_uri(exp_dir) else exp_dir.exists()):
        raise ConfigError(f"experiment directory {exp_dir} exists; continue it with --resume {exp_dir} or pick "
                          f"another --name")
    run = _checked_run(space)  # (a missing or untrusted model refused before Ray starts)
    ensure_ray()
    setup_ray_data()
    concurrent, per_worker, settings.parallel_seeds = preflight(space, settings, run)
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
    with _experiment_registry(exp_dir, space) as registry:
        trainable = _trainable(settings, space, exp_dir, num_examples, per_worker, prepared, registry)
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(search_alg=_optuna_search(space, settings, where),
                                        scheduler=_scheduler(settings),
                                        num_samples=settings.num_samples, max_concurrent_trials=concurrent,
                                        trial_dirname_creator=trial_dirname),
            run_config=tune.RunConfig(name=name, storage_path=_parent(exp_dir), verbose=1,
                                      checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                                      callbacks=_callbacks(space, exp_dir, settings.tracking)),
        )
        try:
            results = _fit(tuner, exp_dir)
            study.close_orphans(where)
            return exp_dir, results
        finally:
            study.sync(where)


def _fit(tuner, exp_dir):
    """``tuner.fit()``; under raycse's signal handler (the CLI's) a SIGINT or SIGTERM asks Tune for its
    own orderly stop (the experiment's state saved, as its SIGUSR1 does) and then ends the command
    as interrupted, naming ``--resume``: Tune alone ended it with exit 0."""
    import signal

    from raycse.platform import interrupts

    if not interrupts.installed():
        return tuner.fit()
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # (raycse's handler stays, and calls Tune's stop)

    def stop(signum: int) -> None:
        tune_stop = signal.getsignal(signal.SIGUSR1)  # (Tune's, installed when its run started)
        print("[raycse] stopping the search: the running trials end and its state is saved", flush=True)
        if callable(tune_stop):
            tune_stop(signum, None)

    try:
        with interrupts.graceful(stop):
            return tuner.fit()
    except KeyboardInterrupt as caught:
        stop_signal = interrupts.interrupted(caught)
        stop_signal.detail = f"the search stopped with its state saved; continue it: raycse tune --resume {exp_dir}"
        raise stop_signal from None


def experiment_location(storage_path: str, name: str):
    """Where an experiment lives: a local Path (made absolute), or a URI string (``s3://...``), which
    Tune's own storage layer writes to."""
    if object_store.is_uri(storage_path):
        return object_store.join(str(storage_path), name)
    return Path(storage_path).resolve() / name


def _parent(exp_dir) -> str:
    return str(exp_dir).rstrip("/").rsplit("/", 1)[0] if object_store.is_uri(exp_dir) else str(Path(exp_dir).parent)


def _name(exp_dir) -> str:
    return str(exp_dir).rstrip("/").rsplit("/", 1)[1] if object_store.is_uri(exp_dir) else Path(exp_dir).name


def write_records(exp_dir, text: str, settings_dict: dict) -> None:
    """The search space's text and the settings, beside Tune's own state, before the first trial."""
    if object_store.is_uri(exp_dir):
        object_store.write_text(object_store.join(exp_dir, "space.yaml"), text)
        object_store.write_text(object_store.join(exp_dir, SETTINGS), json.dumps(settings_dict, indent=2))
        return
    exp_dir.mkdir(parents=True)
    (exp_dir / "space.yaml").write_text(text)
    (exp_dir / SETTINGS).write_text(json.dumps(settings_dict, indent=2))


def load_settings(exp_dir) -> tuple[TuneSettings, dict]:
    """The experiment's settings; for an experiment on object storage, ``space`` is a local copy."""
    try:
        raw = json.loads(object_store.read_text(object_store.join(str(exp_dir), SETTINGS)) if object_store.is_uri(exp_dir)
                         else (Path(exp_dir) / SETTINGS).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{exp_dir} is not a raycse tune experiment (no {SETTINGS}); pass the directory "
                          f"'raycse tune' printed") from None
    except (ValueError, UnicodeDecodeError):
        raise ConfigError(f"{exp_dir}/{SETTINGS} is damaged (not JSON); the experiment cannot be resumed: start "
                          f"a new one") from None
    try:
        extra = {k: raw.pop(k) for k in ("num_examples", "cpus_per_worker")}
        extra["optuna_study"] = raw.pop("optuna_study", None)  # (not recorded before studies were kept)
        settings = TuneSettings(**raw)
    except (KeyError, TypeError, AttributeError):
        raise ConfigError(f"{exp_dir}/{SETTINGS} is damaged (missing or unknown settings); the experiment cannot "
                          f"be resumed: start a new one") from None
    if object_store.is_uri(exp_dir):
        import atexit
        import shutil

        from raycse.platform.staging import private_tempdir

        local = private_tempdir("raycse-space-") / "space.yaml"
        atexit.register(shutil.rmtree, local.parent, True)
        local.write_text(object_store.read_text(settings.space))
        settings.space = str(local)
    return settings, extra


def resume(exp_dir: str):
    """Continue an interrupted experiment (a local path or a URI): finished trials are kept,
    unfinished ones continue from their last reported rung."""
    from ray import tune

    from raycse.platform.ray_session import ensure_ray, setup_ray_data

    refuse_credentials("--resume", str(exp_dir))
    exp = str(exp_dir).rstrip("/") if object_store.is_uri(exp_dir) else Path(exp_dir).resolve()
    settings, extra = load_settings(exp)
    space = load_space(settings.space)
    ensure_ray()
    setup_ray_data()
    if not tune.Tuner.can_restore(str(exp)):
        raise ConfigError(f"{exp} has no Tune state to resume (the run stopped before its first trial started); "
                          f"start it again")
    print(f"[raycse] resuming {exp}", flush=True)
    prepared, _ = prepare_seeds(space, list(settings.seeds))  # the laid-out batches died with the last driver
    where = study.place(exp, _name(exp), settings.optuna_storage)
    study.fetch(where)  # (Tune's restored searcher reopens the study by its URL)
    with _experiment_registry(exp, space) as registry:
        tuner = tune.Tuner.restore(str(exp), _trainable(settings, space, exp, extra["num_examples"],
                                                        extra["cpus_per_worker"], prepared, registry),
                                   resume_unfinished=True, resume_errored=True)
        try:
            results = _fit(tuner, exp)
            study.close_orphans(where)
            return exp, results
        finally:
            study.sync(where)
