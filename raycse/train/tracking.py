"""Experiment tracking of a training run: ``train.tracking`` = ``mlflow:URI``, ``tensorboard:DIR`` or
``wandb:[ENTITY/]PROJECT``, or several of them joined by commas (one of each kind; each gets the same
config and metrics, and a failure to close one does not keep the others open).

- MLflow: the driver opens one MLflow run per ``train()`` call (experiment ``raycse``, run named after
  the output directory) and logs the resolved config as parameters; rank 0 of every fit logs its
  metrics into that run by id (loss, lr, throughput, the model-selection score); the driver closes it
  with the final scores and FINISHED, or FAILED. Why not Ray's ``setup_mlflow``: it starts a new
  MLflow run per call, and a raycse run can be several fits (regrouping every epoch, seeds in
  turn). Tune experiments use Ray's own ``MLflowLoggerCallback`` (``raycse.tune.search``).
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
from dataclasses import dataclass
from typing import Optional

from raycse.config import parse_tracking as parse
from raycse.errors import RaycseError
from raycse.platform.redact import redact, redact_obj

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


@dataclass
class Tracking:
    """What a run's workers need to log: picklable, travels in the train loop's config."""

    kind: str
    target: str
    run_id: Optional[str] = None  # MLflow's, W&B's
    name: str = "run"  # TensorBoard sub-directory, W&B run name
    config: Optional[dict] = None  # W&B: the resolved config (credentials masked), set on the run
    # W&B: the driver's WANDB_MODE and local directory (a worker's environment need not have them)
    wandb_mode: Optional[str] = None
    wandb_dir: Optional[str] = None


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


def check(spec: Optional[str]) -> None:
    """Before anything starts: the tracker's package, and what it needs to accept a run."""
    from raycse.errors import ConfigError, require

    for kind, target in parse(spec):
        if kind == "mlflow":
            require("mlflow", "tracking", "--tracking mlflow:...")
            if ("://" not in target or target.startswith("file:")) and os.environ.get("MLFLOW_ALLOW_FILE_STORE") != "true":
                raise ConfigError(f"--tracking mlflow:{redact(target)} is a file store, which MLflow 3 refuses by "
                                  f"default; use mlflow:sqlite:///PATH/mlflow.db or a tracking server "
                                  f"(mlflow:http://HOST:PORT), or set MLFLOW_ALLOW_FILE_STORE=true")
        elif kind == "tensorboard":
            require("tensorboardX", "tracking", "--tracking tensorboard:...")
        elif kind == "wandb":
            check_wandb()


def check_wandb() -> None:
    """Before anything starts: wandb installed, and a way to log in unless W&B runs offline."""
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


def _wandb_run(tracking: Tracking):
    """The raycse run's one W&B run, opened or resumed (driver or rank 0) through Ray's ``setup_wandb``."""
    from ray.air.integrations.wandb import setup_wandb

    if tracking.wandb_mode:
        os.environ["WANDB_MODE"] = tracking.wandb_mode  # (setup_wandb asks for an API key unless this says offline)
    os.makedirs(tracking.wandb_dir, exist_ok=True)
    entity, project = wandb_project(tracking.target)
    # (rank_zero_only off: raycse opens it on rank 0 only; one id, resume "allow": every fit logs into one run)
    return setup_wandb(config=tracking.config, project=project, entity=entity, trial_id=tracking.run_id,
                       trial_name=tracking.name, resume="allow", dir=tracking.wandb_dir, rank_zero_only=False)


def open_runs(spec: Optional[str], name: str, params: dict) -> tuple[Tracking, ...]:
    """Driver side, before the first fit (after :func:`check`): one :class:`Tracking` per tracker named
    (none when tracking is off). Should one fail to open, the MLflow run opened before it is marked FAILED
    (a W&B run opens only on rank 0's first log)."""
    opened: list[Tracking] = []
    try:
        for kind, target in parse(spec):
            opened.append(_open(kind, target, name, params))
    except BaseException:
        for t in opened:
            if t.kind == "mlflow":
                try:
                    close_run(t, ok=False)
                except Exception:  # (the error that stopped the run is the one to report)
                    pass
        raise
    return tuple(opened)


def _open(kind: str, target: str, name: str, params: dict) -> Tracking:
    """The MLflow run (params logged), the TensorBoard target, or the W&B run's id and settings."""
    if kind == "tensorboard":
        return Tracking(kind, target, name=name)
    if kind == "wandb":
        import uuid

        return Tracking(kind, target, run_id=uuid.uuid4().hex[:12], name=name, config=redact_obj(params),
                        wandb_mode=os.environ.get("WANDB_MODE"), wandb_dir=wandb_dir())
    mlflow_env()
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=target)
        exp = client.get_experiment_by_name(EXPERIMENT)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(EXPERIMENT)
        run = client.create_run(exp_id, run_name=name, tags={"raycse.output": name})
        for key, value in flat_params(redact_obj(params)).items():  # no credential of a URI is tracked
            client.log_param(run.info.run_id, key, value)
    except ImportError:
        raise RaycseError("--tracking mlflow needs mlflow: pip install 'raycse[tracking]'") from None
    except Exception as exc:
        raise RaycseError(f"cannot reach the MLflow tracking server {redact(target)} "
                          f"({redact(str(exc).splitlines()[0][:160])}); start it or drop --tracking") from None
    return Tracking(kind, target, run_id=run.info.run_id, name=name)


def log_model(tracking: Tracking, model_dir) -> None:
    """Driver side, once the model is saved: its directory as the MLflow run's ``model`` artifacts
    (``SentenceTransformer`` loads the downloaded copy as it loads the output)."""
    if tracking.kind != "mlflow":
        return
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=tracking.target).log_artifacts(tracking.run_id, str(model_dir), artifact_path="model")


def close_run(tracking: Tracking, ok: bool, final: Optional[dict] = None) -> None:
    """Driver side, after the last fit: final scores, and the run's status."""
    if tracking.kind == "wandb":
        run = _wandb_run(tracking)
        run.summary.update({k: float(v) for k, v in (final or {}).items()})
        run.finish(exit_code=0 if ok else 1)
        return
    if tracking.kind != "mlflow":
        return
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking.target)
    for key, value in (final or {}).items():
        client.log_metric(tracking.run_id, mlflow_name(key), float(value))
    client.set_terminated(tracking.run_id, "FINISHED" if ok else "FAILED")


class Logger:
    """Rank 0's metric writer for one fit, into every tracker of the run (a no-op elsewhere or without
    tracking)."""

    def __init__(self, trackings: tuple[Tracking, ...], rank: int):
        self.sinks = [_Sink(t) for t in trackings] if rank == 0 else []

    def log(self, metrics: dict, step: int) -> None:
        if not self.sinks:
            return
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for sink in self.sinks:
            sink.log(scalars, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class _Sink:
    """One tracker's writer on rank 0: a TensorBoard event file, the W&B run, or an MLflow client."""

    def __init__(self, tracking: Tracking):
        self.tracking, self.writer, self.client, self.wandb = tracking, None, None, None
        if tracking.kind == "wandb":
            self.wandb = _wandb_run(tracking)
        elif tracking.kind == "tensorboard":
            from tensorboardX import SummaryWriter

            self.writer = SummaryWriter(os.path.join(tracking.target, tracking.name), flush_secs=10)
        else:
            mlflow_env()
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=tracking.target)

    def log(self, scalars: dict, step: int) -> None:
        if self.writer is not None:
            for key, value in scalars.items():
                self.writer.add_scalar(key, value, step)
        elif self.wandb is not None:
            self.wandb.log(scalars, step=step)
        else:
            from mlflow.entities import Metric
            import time

            now = int(time.time() * 1000)
            self.client.log_batch(self.tracking.run_id,
                                  metrics=[Metric(mlflow_name(k), v, now, step) for k, v in scalars.items()])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()
