"""raycse's worker loop, step engine, reporter and checkpointer run in the test process: a training session of
one worker (raycse.train.session's interface) whose checkpoints go to the run's checkpoint folder, as Ray Train
puts them there, and whose reports are kept. The plan is the driver's own (raycse.train.driver.plan_fit: the corpus
read by Ray Data, the batches laid out), so the shared Ray of the suite must be up (the ray_cluster fixture); what
is left out is Ray Train's start of a controller and a worker process (~35 CPU-seconds a fit on this box)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch


class LocalSession:
    """Rank 0 of 1 on the CPU. ``report`` copies each checkpoint to ``CHECKPOINTS/checkpoint_NNNNNN`` and removes
    the worker's directory (a synchronous upload); ``handed``: a checkpoint folder handed at a restart."""

    def __init__(self, checkpoints: str, handed: Optional[str] = None):
        self.root, self.handed, self.reports = Path(checkpoints), handed, []

    def rank_and_world(self) -> tuple[int, int]:
        return 0, 1

    def device(self) -> torch.device:
        return torch.device("cpu")

    def prepare_model(self, module, device, ddp_kwargs):
        return module.to(device)  # (one worker: no DDP, as Ray Train's prepare_model does for one)

    def report(self, metrics: dict, directory: str, upload_async: bool) -> None:
        dest = self.next_folder()
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copytree(directory, dest, dirs_exist_ok=True)  # (several ranks' parts: files of names of their own)
        shutil.rmtree(directory)
        self.reports.append((dict(metrics), dest))

    def next_folder(self) -> Path:
        """The next checkpoint's folder: after those already there (a resumed fit's go on from its run's)."""
        return self.root / f"checkpoint_{len(list(self.root.glob('checkpoint_*'))):06d}"

    def handed_checkpoint(self):
        import ray.train

        return ray.train.Checkpoint(self.handed) if self.handed else None


@dataclass
class LocalFit:
    """A fit run in this process: its plan (raycse.train.driver.PlannedFit) and its reports (metrics, folder)."""

    planned: object
    reports: list = field(default_factory=list)

    @property
    def last(self) -> dict:
        return self.reports[-1][0]

    def model_dir(self, index: int = -1) -> Path:
        """The whole model saved in a reported checkpoint (the last by default)."""
        from raycse.train.checkpoints.files import MODEL_DIR

        return self.reports[index][1] / MODEL_DIR

    def result(self):
        """What Ray Train's Result gives the driver of this fit: the last checkpoint and its metrics, and each reported
        checkpoint with its metrics (all of them: nothing here evicts one)."""
        from types import SimpleNamespace

        import ray.train

        reported = [(ray.train.Checkpoint(str(path)), metrics) for metrics, path in self.reports]
        return SimpleNamespace(checkpoint=reported[-1][0] if reported else None, metrics=self.last,
                               best_checkpoints=reported)

    def best(self, dev) -> tuple:
        """(checkpoint, its metrics) the driver publishes (raycse.train.publishing.best_checkpoint's choice), for the
        model-selection data ``dev``."""
        from raycse.train.publishing import best_checkpoint

        return best_checkpoint(self.result(), dev)

    def publish(self, out: Path) -> Path:
        """The driver's output of the best checkpoint: the model, its card, metrics.json and config.yaml in ``out``."""
        import ray

        from raycse.train.publishing import write_output

        plan = self.planned.plan
        best, metrics = self.best(ray.get(plan.dev) if plan.dev is not None else None)
        out.mkdir(parents=True)
        write_output(out, plan.run, best, self.planned.summary(self.last, metrics, [0.0]), str(out))
        return out


def fit_in_process(run, storage: Path, run_name: str = "train", hooks=None, callbacks=(), source=None) -> LocalFit:
    """``run`` checked, planned and trained as `raycse train` does, its one worker in this process (checkpoints under
    ``storage/run_name``); ``source``: the corpus as an object, as ``raycse.train(run, corpus=...)`` hands it."""
    from raycse.platform.ray_session import ensure_ray
    from raycse.train.driver import checked_inputs, plan_fit
    from raycse.train.plan import TuneHooks

    if source is not None and not run.data.corpus:  # (as raycse.train.driver.train names it)
        run = run.resolved({"data.corpus": f"<{type(source).__name__}>"})
    inputs = checked_inputs(run, False, str(storage), run_name, source is not None, callbacks)
    assert inputs.run.train.num_workers == 1, "a session in this process is one worker"
    ensure_ray()
    return run_here(plan_fit(inputs.run, inputs, hooks or TuneHooks(), source, storage, (), None))


def run_here(planned) -> LocalFit:
    """The planned fit's one worker, in this process."""
    from raycse.train.loop import run_worker

    session, threads = LocalSession(planned.plan.checkpoint_dir), torch.get_num_threads()
    try:
        run_worker(planned.plan, session)
    finally:
        torch.set_num_threads(threads)  # (the worker sets its own: this process goes on with its tests)
    return LocalFit(planned, session.reports)


def in_process_fits(monkeypatch) -> None:
    """`raycse train` (raycse.train.driver.train, the CLI's and the API's) with its fit run by one worker in this
    process instead of Ray Train's: the driver's checks, output claim, tracking, best-checkpoint choice, publish and
    summary run as they are."""
    from raycse.train import driver
    from raycse.train.fit import report_resume

    def fit_here(run, inputs, hooks, source, staging, tracking, live):  # (raycse.train.driver._fit's signature)
        assert run.train.num_workers == 1, "a session in this process is one worker"
        fit = run_here(driver.plan_fit(run, inputs, hooks, source, staging, tracking, live))
        report_resume(fit.last.get("resumed"))
        best, best_metrics = fit.best(inputs.dev)
        return best, fit.planned.summary(fit.last, best_metrics, [0.0])

    monkeypatch.setattr(driver, "_fit", fit_here)


def run_of(argv: list) -> object:
    """The run `raycse train ARGV` would train (the command line parsed and resolved as the CLI does)."""
    from raycse.cli import build_parser, resolve_train_config

    return resolve_train_config(build_parser().parse_args(["train", *argv]))


class RankSession(LocalSession):
    """Rank ``rank`` of ``world``, in a process that joined the others' gloo process group: its module under DDP as
    Ray Train wraps it on the CPU, and each report's checkpoint merged into ``CHECKPOINTS/checkpoint_NNNNNN`` beside
    the other ranks' parts of it (the k-th report of every rank into the k-th folder), as Ray Train's storage
    merges its workers' checkpoints."""

    def __init__(self, checkpoints: str, rank: int, world: int):
        super().__init__(checkpoints)
        self.rank, self.world = rank, world

    def rank_and_world(self) -> tuple[int, int]:
        return self.rank, self.world

    def prepare_model(self, module, device, ddp_kwargs):
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(module.to(device), **(ddp_kwargs or {}))  # (ray.train.torch.prepare_model's)

    def next_folder(self) -> Path:
        return self.root / f"checkpoint_{len(self.reports):06d}"  # (every rank's k-th report: the k-th folder)


def fit_ranks(run, storage: Path, run_name: str = "train", timeout_s: float = 600.0) -> LocalFit:
    """``run`` checked and planned as `raycse train` does, its ``train.num_workers`` ranks each a process spawned here
    that joins the suite's Ray (the plan's data are in its object store) and the others' gloo group: the fit Ray
    Train runs, without its controller and worker actors. Rank 0's reports come back; bounded by ``timeout_s``."""
    import pickle
    import tempfile

    import ray
    import torch.multiprocessing as mp

    from conftest import _free_port
    from raycse.platform.ray_session import ensure_ray
    from raycse.train.driver import checked_inputs, plan_fit
    from raycse.train.plan import TuneHooks

    inputs = checked_inputs(run, False, str(storage), run_name, False, ())
    ensure_ray()
    planned = plan_fit(inputs.run, inputs, TuneHooks(), None, storage, (), None)
    world = inputs.run.train.num_workers
    blob = ray.cloudpickle.dumps(planned.plan)  # (its ObjectRefs stay this driver's: it outlives the ranks)
    with tempfile.TemporaryDirectory() as held:
        reports = Path(held) / "rank0.pkl"
        ranks = mp.start_processes(_rank, args=(world, _free_port(), ray.get_runtime_context().gcs_address, blob,
                                                str(reports)), nprocs=world, join=False, start_method="spawn")
        _join_within(ranks, timeout_s)
        return LocalFit(planned, pickle.loads(reports.read_bytes()))


def _join_within(ranks, timeout_s: float) -> None:
    """Every rank ended (a rank's error raised as torch's spawn raises it) within ``timeout_s``, else all of them
    stopped and the wait fails."""
    import time

    deadline = time.monotonic() + timeout_s
    while not ranks.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ranks.processes:
                p.kill()
            raise TimeoutError(f"the fit's {len(ranks.processes)} ranks did not end in {timeout_s:.0f} s")


def _rank(rank: int, world: int, port: int, address: str, blob: bytes, reports: str) -> None:
    """One rank of :func:`fit_ranks`, then this process ended at once (see conftest._then_exit)."""
    import os
    import pickle
    import sys

    import ray
    import torch.distributed as dist

    from raycse.train.loop import run_worker

    ray.init(address=address, log_to_driver=False, configure_logging=False)
    plan = ray.cloudpickle.loads(blob)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    session = RankSession(plan.checkpoint_dir, rank, world)
    run_worker(plan, session)
    dist.barrier()  # (every rank's part of the last checkpoint is in place before rank 0 says it is done)
    if rank == 0:
        Path(reports).write_bytes(pickle.dumps(session.reports))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
