"""A search's experiment: its record (the settings and the space's text beside Tune's own state, written before the
first trial and read back by a resume and by ``raycse analyze``), its data made ready once for every trial, and the
one :class:`Experiment` value both a new search and a resumed one run: its base run resolved once, its registry of
live Train runs, its callbacks, its trainable, and its fit under raycse's signal handling."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass

from raycse.config import RunConfig
from raycse.errors import ConfigError
from raycse.platform import object_store
from raycse.tune import study
from raycse.tune.callbacks import DropTrainCheckpoints, EndTrialRuns, tracking_callbacks
from raycse.tune.capacity import TRIAL_CPU
from raycse.tune.settings import TuneSettings
from raycse.tune.space import SearchSpace
from raycse.tune.trial import TrialSetup, run_trial

SETTINGS = "raycse_tune.json"


@dataclass
class Experiment:
    """One search as its driver runs it, new or resumed: its settings, its space, where it lives (a local Path or a
    URI) and its base run (the space's run without knobs, resolved once)."""

    settings: TuneSettings
    space: SearchSpace
    location: object
    run: RunConfig

    @property
    def name(self) -> str:
        return object_store.name(self.location)

    @property
    def parent(self) -> str:
        return object_store.parent(self.location)

    @property
    def registry_name(self) -> str:
        return f"raycse-runs:{self.location}"

    @property
    def release_timeout_s(self) -> float:
        from raycse.platform.release import RELEASE_MARGIN_S

        return self.run.train.worker_start_timeout_s + RELEASE_MARGIN_S

    @contextmanager
    def registry(self):
        """The experiment's RunRegistry (raycse.platform.release), named after its location, for the length of its
        fit: then any run still registered (an interrupted fit's) is ended and the registry with it, so the driver
        keeps nothing of the experiment."""
        from raycse.platform.release import release, start_registry, stop_registry

        registry = start_registry(self.registry_name)
        try:
            yield registry
        finally:
            try:
                release(registry, "", self.release_timeout_s)
            finally:
                stop_registry(registry, self.registry_name)

    def callbacks(self) -> list:
        """Tune's callbacks of the experiment: its trials' runs ended and checkpoints freed, its trackers fed."""
        return [EndTrialRuns(self.registry_name, self.release_timeout_s), DropTrainCheckpoints(),
                *tracking_callbacks(self.settings.tracking, self.name)]

    def trainable(self, num_examples: int, cpus_per_worker: float, prepared: dict, registry):
        """The trial function (raycse.tune.trial.run_trial) with what every trial shares."""
        from ray import tune

        s = self.settings
        setup = TrialSetup(self.space, list(s.seeds), s.rungs, s.target, num_examples, self.parent, self.name,
                           cpus_per_worker, bool(s.parallel_seeds), prepared, registry, tuple(s.goals()))
        return tune.with_resources(tune.with_parameters(run_trial, setup=setup), {"CPU": TRIAL_CPU})

    def fit(self, tuner, where: study.StudyPlace):
        """``tuner.fit()`` (:func:`_fit_under_signals`), the Optuna study's trials that Tune never ran closed and the
        study kept with the experiment: the ResultGrid."""
        try:
            results = _fit_under_signals(tuner, self.location)
            study.close_orphans(where)
            return results
        finally:
            study.sync(where)


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


def _fit_under_signals(tuner, exp_dir):
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
    return object_store.located(object_store.join(str(storage_path), name))


def write_records(exp_dir, text: str, settings_dict: dict) -> None:
    """The search space's text and the settings, beside Tune's own state, before the first trial (a path or a
    URI)."""
    object_store.write_text(object_store.join(str(exp_dir), "space.yaml"), text)
    object_store.write_text(object_store.join(str(exp_dir), SETTINGS), json.dumps(settings_dict, indent=2))


def load_settings(exp_dir) -> tuple[TuneSettings, dict]:
    """The experiment's settings; for an experiment on object storage, ``space`` is a local copy."""
    try:
        raw = json.loads(object_store.read_text(object_store.join(str(exp_dir), SETTINGS)))
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
