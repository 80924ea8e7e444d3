"""What happens around a search's trials, as Ray Tune callbacks: each ended trial's Train runs ended before its CPUs
are offered again, its Train checkpoints freed, its reports sent to the trackers named; and the trial folders'
names (their knobs, readable)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ray.tune import Callback

from raycse.config import parse_tracking
from raycse.errors import ConfigError
from raycse.platform import object_store
from raycse.train import tracking as train_tracking
from raycse.tune.trial import SEED_MODEL, SEED_RUN, is_final


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


def tracking_callbacks(tracking: Optional[str], experiment: str) -> list:
    """Ray Tune's own MLflow / TensorBoard / W&B logger callbacks, one per tracker named: a run per trial
    with its knobs as parameters and every rung's report (target, mean, std, worst, each seed's score)
    as metrics."""
    return [tracking_callback(kind, target, experiment) for kind, target in parse_tracking(tracking)]


def tracking_callback(kind: str, target: str, experiment: str):
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
