"""The fit itself: one ``TorchTrainer`` for every epoch, run in a thread of its own and bounded in its
waits, whose workers and placement group are released before it returns or raises."""

from __future__ import annotations

import contextlib
import os
from typing import Optional

from raycse.errors import RaycseError
from raycse.platform import release
from raycse.platform.process_state import train_worker_env
from raycse.platform.redact import redact
from raycse.train.checkpoints.in_fit import CHECKPOINT_RANK
from raycse.train.loop import train_loop_per_worker
from raycse.train.plan import FitPlan


def collective_backend(t) -> str:
    """torch.distributed's backend for the run: NCCL for whole GPUs per worker, gloo on CPUs and for
    fractional GPUs (NCCL refuses two ranks on one device; gloo all-reduces CUDA tensors, and the
    contrastive gather routes its all-gather through host memory, raycse.objectives.contrastive), and where
    RAYCSE_GPU_STAND_IN=cpu lets the workers that hold declared GPUs train on the CPU (NCCL needs CUDA)."""
    from raycse.train.module import GPU_STAND_IN

    stand_in = os.environ.get(GPU_STAND_IN) == "cpu"
    return "nccl" if t.use_gpu and not t.shares_gpus and not stand_in else "gloo"


def say_devices(t) -> None:
    """One line at start: what each worker holds and which backend its collectives use."""
    if not t.use_gpu:
        return
    backend = collective_backend(t)
    why = ("" if backend == "nccl" else " (GPUs stood in for by the CPU: RAYCSE_GPU_STAND_IN=cpu)"
           if not t.shares_gpus else " (workers hold a fraction of a GPU, so two may share a device, which NCCL refuses)")
    print(f"[raycse] {t.num_workers} worker(s) x {t.gpu_share:g} GPU; collectives: {backend}{why}", flush=True)


def worker_resources(t, cpus: float) -> dict:
    """What each Train worker reserves."""
    return {"CPU": cpus, **({"GPU": t.gpu_share} if t.use_gpu else {})}


def build_trainer(plan: FitPlan, cpus: float, storage: str, run_name: str, register,
                  scored: bool):
    """One ``TorchTrainer`` for every epoch. A restarted driver (same storage and run name) resumes
    inside it: the workers load the furthest whole checkpoint under ``plan.checkpoint_dir``
    (raycse.train.checkpoints.choice.latest_in_storage)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig as TrainRunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    t = plan.run.train
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"plan": plan},
        torch_config=TorchConfig(backend=collective_backend(t)),
        scaling_config=ScalingConfig(num_workers=t.num_workers, use_gpu=t.use_gpu,
                                     resources_per_worker=worker_resources(t, cpus)),
        run_config=TrainRunConfig(
            name=run_name, storage_path=storage,
            worker_runtime_env={"env_vars": train_worker_env()},
            # a run that cannot get its workers fails after worker_start_attempts tries
            failure_config=FailureConfig(max_failures=t.max_failures,
                                         controller_failure_limit=t.worker_start_attempts - 1),
            callbacks=[register],
            checkpoint_config=CheckpointConfig(
                num_to_keep=t.keep_checkpoints,
                checkpoint_score_attribute=CHECKPOINT_RANK if scored else None,
                checkpoint_score_order="max"),
        ),
    )


def report_resume(resumed: Optional[dict]) -> None:
    """Say where the fit's last (re)start took its state from and which damaged checkpoints it passed over."""
    if not resumed:
        return
    for item in resumed.get("skipped") or []:
        print(f"[raycse] warning: skipped damaged checkpoint {item}", flush=True)
    print(f"[raycse] resumed from step {resumed['step']} ({resumed['path']})", flush=True)


@contextlib.contextmanager
def _environ(**values: str):
    """Variables set for the duration of a ``fit``: Ray Train's controller reads RAY_TRAIN_* ones from
    the environment of the process that calls it."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# How often Ray Train's controller polls its workers (Ray's default: 2 s). A report, the end of a run and
# a dead worker are seen at a poll, so a shorter one ends each fit sooner for a few ms a second of the
# controller's time (measured: BENCHMARKS.md, fixed cost). A value set in the environment wins.
HEALTH_CHECK_INTERVAL_S = "0.5"


def fit_and_release(trainer, t, registry, run_key: str, per_worker: dict):
    """One ``fit`` whose workers and placement group are gone when it returns or raises.

    Waiting for workers is bounded: Ray Train gives up after ``worker_start_attempts`` tries of
    ``worker_start_timeout_s`` each, and the error then names what holds the cluster."""
    import ray

    if ray.get(registry.is_closed.remote(run_key), timeout=60):
        raise RuntimeError(f"Train run {run_key} was ended (its Tune trial stopped) before this fit started")
    release_s = t.worker_start_timeout_s + release.RELEASE_MARGIN_S
    try:
        with _environ(RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S=str(t.worker_start_timeout_s),
                      RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S",
                                                                       HEALTH_CHECK_INTERVAL_S)):
            result = _fit_in_thread(trainer, registry, run_key, release_s)
        if result.error:
            raise result.error
    except Exception as err:
        clear = release.worker_start_error(err, t.num_workers, per_worker, t.worker_start_timeout_s,
                                           t.worker_start_attempts)
        clear = clear or worker_refusal(err)
        try:
            release.release(registry, run_key, release_s)
        except release.ReleaseError as leak:
            print(f"[raycse] warning: {leak}", flush=True)
        if clear is not None:
            raise clear from err
        raise
    release.release(registry, run_key, release_s)
    return result


def worker_refusal(err: BaseException) -> Optional[RaycseError]:
    """The refusal a worker raised (a :class:`~raycse.errors.RaycseError`, e.g. kNN grouping that would
    not fit in rank 0's memory), out of Ray Train's error for the worker group, so the command says its
    one line instead of Ray's traceback; None for anything else (a bug keeps its traceback)."""
    failures = getattr(err, "worker_failures", None) or {}  # ray.train.WorkerGroupError: rank -> exception
    return next((failures[rank] for rank in sorted(failures) if isinstance(failures[rank], RaycseError)), None)


def _fit_in_thread(trainer, registry, run_key: str, release_s: float):
    """``trainer.fit()`` in a thread of its own, the main thread waiting for it. Why: in the main thread
    Ray Train replaces the SIGINT handler with its own, whose abort ended the command with exit 1 and
    no word; here raycse's handler raises :class:`Interrupted` in the main thread, the run is
    released (its controller aborted, its workers and placement group gone), and the interruption
    goes on up."""
    import threading

    box: dict = {}

    def fit() -> None:
        try:
            box["result"] = trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            box["error"] = exc

    thread = threading.Thread(target=fit, name="raycse-fit", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.2)  # (short waits: the main thread handles signals between them)
    except KeyboardInterrupt:  # raycse's Interrupted, or the bare one Ray raises in its place
        try:
            release.release(registry, run_key, release_s)
        except Exception as leak:  # noqa: BLE001 - the command still ends; its Ray is shut down after
            print(f"[raycse] warning: {redact(str(leak))[:300]}", flush=True)
        thread.join(release_s)
        raise
    if "error" in box:
        raise box["error"]
    return box["result"]
