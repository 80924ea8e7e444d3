"""raycse's own trackers (raycse.train.tracker.Tracker): MLflow, TensorBoard and W&B.

- MLflow: the driver opens one MLflow run per ``train()`` call (experiment ``raycse``, run named after
  the output directory) and logs the resolved config as parameters; rank 0 of every fit logs its
  metrics into that run by id (loss, lr, throughput, the model-selection score); the driver closes it
  with the final scores and FINISHED, or FAILED. Why not Ray's ``setup_mlflow``: it starts a new
  MLflow run per call, and a raycse run can be several fits (regrouping every epoch, seeds in
  turn). Tune experiments use Ray's own ``MLflowLoggerCallback`` (raycse.train.tune_loggers).
- TensorBoard: rank 0 writes scalars with tensorboardX (what Ray's TBX logger uses) under
  ``DIR/<output name>``; every fit appends to the same directory.
- W&B: Ray's own ``setup_wandb`` on rank 0 of every fit, each fit resuming the one W&B run the driver
  named (its id), with the resolved config; the driver adds the final scores to the run's summary.
  Its local files go to ``WANDB_DIR`` when set, else ``RAYCSE_CACHE/wandb`` (``WANDB_MODE=offline``
  keeps them there for ``wandb sync``).

Every wait on the tracking server is bounded (MLflow's own HTTP retries are capped below).
"""

from __future__ import annotations

import os
import re
from typing import Optional

from raycse.errors import RaycseError
from raycse.platform.redact import redact
from raycse.train.tracker import Tracker, Tracking

EXPERIMENT = "raycse"
# MLflow client settings (a value already in the environment wins):
# - MLflow retries an unreachable server for minutes by default: a tracking problem must not stall a run.
# - No MLflow telemetry: it phones home (there is no network here), and its background thread removes
#   _MLFLOW_TELEMETRY_SESSION_ID from os.environ while a request copies the environment, which failed
#   a run's first request with KeyError('_MLFLOW_TELEMETRY_SESSION_ID') in a test run.
_MLFLOW_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
               "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}


def mlflow_env() -> None:
    """Set the MLflow client's environment before it is first imported."""
    for key, value in _MLFLOW_ENV.items():
        os.environ.setdefault(key, value)


def mlflow_name(key: str) -> str:
    """A metric name as MLflow takes it (letters, digits, ``_ - . / : `` and spaces): ``beir_ndcg@10``
    is ``beir_ndcg_at_10`` there, since MLflow refuses the whole batch over one such name."""
    return re.sub(r"[^/\w.\- :]", "_", key.replace("@", "_at_"))


def flat_params(d: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flat_params(v, key + "."))
        else:
            out[key] = str(v)[:500]
    return out


class MLflowTracker(Tracker):
    kind = "mlflow"

    def tune_callback(self, target: str, experiment: str):
        from raycse.train import tune_loggers

        mlflow_env()  # before mlflow is first imported
        return tune_loggers.mlflow_callback(target, experiment)

    def check(self, target: str) -> None:
        from raycse.errors import ConfigError, require

        require("mlflow", "tracking", "--tracking mlflow:...")
        if ("://" not in target or target.startswith("file:")) and os.environ.get("MLFLOW_ALLOW_FILE_STORE") != "true":
            raise ConfigError(f"--tracking mlflow:{redact(target)} is a file store, which MLflow 3 refuses by "
                              f"default; use mlflow:sqlite:///PATH/mlflow.db or a tracking server "
                              f"(mlflow:http://HOST:PORT), or set MLFLOW_ALLOW_FILE_STORE=true")

    def open(self, target: str, name: str, params: dict) -> Tracking:
        """The MLflow run, its parameters logged."""
        mlflow_env()
        try:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=target)
            exp = client.get_experiment_by_name(EXPERIMENT)
            exp_id = exp.experiment_id if exp is not None else client.create_experiment(EXPERIMENT)
            run = client.create_run(exp_id, run_name=name, tags={"raycse.output": name})
            for key, value in flat_params(params).items():
                client.log_param(run.info.run_id, key, value)
        except ImportError:
            raise RaycseError("--tracking mlflow needs mlflow: pip install 'raycse[tracking]'") from None
        except Exception as exc:
            raise RaycseError(f"cannot reach the MLflow tracking server {redact(target)} "
                              f"({redact(str(exc).splitlines()[0][:160])}); start it or drop --tracking") from None
        return Tracking(self.kind, target, run_id=run.info.run_id, name=name)

    def abandon(self, tracking: Tracking) -> None:
        self.close(tracking, ok=False)

    def sink(self, tracking: Tracking):
        return _MLflowSink(tracking)

    def log_model(self, tracking: Tracking, model_dir) -> None:
        """The model directory as the run's ``model`` artifacts (``SentenceTransformer`` loads the downloaded
        copy as it loads the output)."""
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=tracking.target).log_artifacts(tracking.run_id, str(model_dir),
                                                                 artifact_path="model")

    def close(self, tracking: Tracking, ok: bool, final: Optional[dict] = None) -> None:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking.target)
        for key, value in (final or {}).items():
            client.log_metric(tracking.run_id, mlflow_name(key), float(value))
        client.set_terminated(tracking.run_id, "FINISHED" if ok else "FAILED")


class _MLflowSink:
    def __init__(self, tracking: Tracking):
        mlflow_env()
        from mlflow.tracking import MlflowClient

        self.run_id, self.client = tracking.run_id, MlflowClient(tracking_uri=tracking.target)

    def log(self, scalars: dict, step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(mlflow_name(k), v, now, step) for k, v in scalars.items()])

    def close(self) -> None:
        pass


class TensorBoardTracker(Tracker):
    kind = "tensorboard"

    def tune_callback(self, target: str, experiment: str):
        from raycse.train import tune_loggers

        return tune_loggers.tensorboard_callback(target, experiment)

    def check(self, target: str) -> None:
        from raycse.errors import require

        require("tensorboardX", "tracking", "--tracking tensorboard:...")

    def sink(self, tracking: Tracking):
        from tensorboardX import SummaryWriter

        return _TensorBoardSink(SummaryWriter(os.path.join(tracking.target, tracking.name), flush_secs=10))


class _TensorBoardSink:
    def __init__(self, writer):
        self.writer = writer

    def log(self, scalars: dict, step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


def wandb_dir() -> str:
    """Where W&B keeps a run's local files: WANDB_DIR, else raycse's cache (never the output directory)."""
    from raycse.platform.caches import cache_dir

    where = os.environ.get("WANDB_DIR") or str(cache_dir() / "wandb")
    try:
        os.makedirs(where, exist_ok=True)
    except OSError as exc:
        raise RaycseError(f"W&B's local directory {where} cannot be made ({exc.strerror}); set WANDB_DIR to a "
                          f"writable directory") from None
    return where


def wandb_project(target: str) -> tuple[Optional[str], str]:
    """``[ENTITY/]PROJECT`` -> (entity or None, project)."""
    entity, _, project = target.rpartition("/")
    return entity or None, project


class WandbTracker(Tracker):
    kind = "wandb"

    def tune_callback(self, target: str, experiment: str):
        from raycse.train import tune_loggers

        entity, project = wandb_project(target)
        return tune_loggers.wandb_callback(entity, project, experiment, wandb_dir())

    def check(self, target: str) -> None:
        """wandb installed, and a way to log in unless W&B runs offline."""
        from raycse.errors import require

        require("wandb", "tracking", "--tracking wandb:...")
        if os.environ.get("WANDB_MODE") in ("offline", "disabled") or os.environ.get("WANDB_API_KEY"):
            return
        import wandb

        try:  # (a key from settings or .netrc counts; nothing asked, nothing sent)
            logged_in = bool(wandb.login(prompt=False, verify=False))
        except Exception:
            logged_in = False
        if not logged_in:
            raise RaycseError("--tracking wandb needs W&B credentials: set WANDB_API_KEY (or run `wandb login`), "
                              "or set WANDB_MODE=offline to keep the runs locally for `wandb sync`")

    def open(self, target: str, name: str, params: dict) -> Tracking:
        """The W&B run's id and settings (the run itself opens on rank 0's first log)."""
        import uuid

        return Tracking(self.kind, target, run_id=uuid.uuid4().hex[:12], name=name, config=params,
                        extra={"mode": os.environ.get("WANDB_MODE"), "dir": wandb_dir()})

    def sink(self, tracking: Tracking):
        return _WandbSink(_wandb_run(tracking))

    def close(self, tracking: Tracking, ok: bool, final: Optional[dict] = None) -> None:
        run = _wandb_run(tracking)
        run.summary.update({k: float(v) for k, v in (final or {}).items()})
        run.finish(exit_code=0 if ok else 1)


def _wandb_run(tracking: Tracking):
    """The raycse run's one W&B run, opened or resumed (driver or rank 0) through Ray's ``setup_wandb``."""
    from ray.air.integrations.wandb import setup_wandb

    if tracking.extra.get("mode"):
        os.environ["WANDB_MODE"] = tracking.extra["mode"]  # (setup_wandb asks for an API key unless this says offline)
    os.makedirs(tracking.extra["dir"], exist_ok=True)
    entity, project = wandb_project(tracking.target)
    # (rank_zero_only off: raycse opens it on rank 0 only; one id, resume "allow": every fit logs into one run)
    return setup_wandb(config=tracking.config, project=project, entity=entity, trial_id=tracking.run_id,
                       trial_name=tracking.name, resume="allow", dir=tracking.extra["dir"], rank_zero_only=False)


class _WandbSink:
    def __init__(self, run):
        self.run = run

    def log(self, scalars: dict, step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


BUILT_IN = {t.kind: t for t in (MLflowTracker(), TensorBoardTracker(), WandbTracker())}
