"""The Ray Tune logger callbacks of raycse's own trackers (raycse.train.trackers: each tracker's ``tune_callback``),
one per tracker named in ``raycse tune --tracking``: a run per trial with its knobs and every rung's report.

- MLflow: Ray's own ``MLflowLoggerCallback``.
- W&B: Ray's own ``WandbLoggerCallback``, whose logging actors return only once W&B has written the trial's run
  (raycse.train.wandb_logging).
- TensorBoard: each trial's reports as scalars under ``DIR/EXPERIMENT/<the trial's directory name>``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from ray.tune.logger import LoggerCallback


def mlflow_callback(target: str, experiment: str):
    """(The MLflow client's environment set first: raycse.train.trackers.mlflow_env.)"""
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    return MLflowLoggerCallback(tracking_uri=target, experiment_name=experiment, save_artifact=False,
                                tags={"raycse.experiment": experiment})


def wandb_callback(entity, project: str, experiment: str, directory: str):
    from raycse.train.wandb_logging import FlushingWandbLoggerCallback  # (wandb imported only where it is named)

    # (mode and dir passed on: the logging actors need not share the driver's environment; a bound
    # on the wait for their last upload at the end of the experiment)
    mode = {"mode": os.environ["WANDB_MODE"]} if os.environ.get("WANDB_MODE") else {}
    return FlushingWandbLoggerCallback(project=project, entity=entity, group=experiment,
                                       dir=directory, upload_timeout=120, **mode)


def tensorboard_callback(target: str, experiment: str):
    return TensorBoardTo(str(Path(target) / experiment))


class TensorBoardTo(LoggerCallback):
    """Each trial's reports as TensorBoard scalars under DIR/<trial directory name>, the tags Ray's
    TBXLoggerCallback writes (``ray/tune/<metric>`` at each training iteration), through Ray's public
    LoggerCallback hooks: Ray's own callback can only write into the trial's directory, and
    ``--tracking tensorboard:DIR`` names where TensorBoard looks."""

    def __init__(self, root: str):
        from tensorboardX import SummaryWriter

        self.root, self.writer_cls, self.writers = root, SummaryWriter, {}

    def log_trial_start(self, trial) -> None:
        if trial in self.writers:  # a restarted trial appends to its own events
            self.writers[trial].close()
        self.writers[trial] = self.writer_cls(os.path.join(self.root, Path(trial.local_path).name), flush_secs=30)

    def log_trial_result(self, iteration: int, trial, result: dict) -> None:
        if trial not in self.writers:
            self.log_trial_start(trial)
        step = result.get("training_iteration", iteration)
        for key, value in _scalars(result):
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.writers[trial].add_scalar(f"ray/tune/{key}", value, global_step=step)
        self.writers[trial].flush()

    def log_trial_end(self, trial, failed: bool = False) -> None:
        writer = self.writers.pop(trial, None)
        if writer is not None:
            writer.close()


def _scalars(result: dict, prefix: str = ""):
    """(slash-joined key, value) of every leaf of a nested result."""
    for key, value in result.items():
        if isinstance(value, dict):
            yield from _scalars(value, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", value
