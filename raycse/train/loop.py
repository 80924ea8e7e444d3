"""The per-worker training loop that Ray Train runs on every worker, read top to bottom.

A worker gets the driver's :class:`~raycse.train.plan.FitPlan` and assembles four parts:
- the step engine (:mod:`~raycse.train.steps`): forward, backward and the optimizer step;
- the batch source (:mod:`~raycse.train.batches`): this rank's batch rows, one per step;
- the reporter (:mod:`~raycse.train.reporter`): scores, log lines, tracking, metrics;
- the checkpointer (:mod:`~raycse.train.checkpoints.in_fit`): resume, and each checkpoint reported.
It resumes, scores the starting model when asked, then trains from its step to ``stop_at``,
checkpointing every ``train.checkpoint_steps`` and scoring every ``eval.eval_steps``, at the plan's
``eval_at`` steps and at the end of the fit.
"""

from __future__ import annotations

import time
from concurrent import futures

import torch

from raycse.evaluation.targets import GOALS
from raycse.model.precision import resolve_precision
from raycse.platform import compat
from raycse.platform import release
from raycse.platform.process_state import seed_everything
from raycse.platform.ray_session import setup_ray_data
from raycse.train import ahead, kernels
from raycse.train.batches import BatchSource
from raycse.train.checkpoints.in_fit import Checkpointer, checkpoint_rank, CHECKPOINT_RANK
from raycse.train.module import build_module, compile_module, prepare_data_parallel, worker_device
from raycse.train.plan import FitPlan
from raycse.train.profile import StepProfiler, describe, fit_window, span
from raycse.train.progress import Progress
from raycse.train.reporter import Reporter, log
from raycse.train.sharding import shard_from_rank0
from raycse.train.steps import StepEngine, move


class WorkerRun:
    """One rank's part of a fit: its four parts over one :class:`Progress`."""

    def __init__(self, plan: FitPlan, session):
        self.plan, run = plan, plan.run
        self.rank, self.world_size = session.rank_and_world()
        torch.set_num_threads(max(1, plan.threads))
        # Same init everywhere (DDP also broadcasts rank 0's weights); different dropout masks per rank.
        seed_everything(run.train.seed)
        device = worker_device(run.train, session)
        if run.train.sharding == "fsdp":
            # rank 0 reads the weights and sends each rank its shards (the others build on the meta device); FSDP2
            # moves each block to the device as it shards it, so no GPU, and no rank's memory but 0's, holds the
            # whole model
            module = shard_from_rank0(lambda weights: build_module(run, weights), device, self.rank,
                                      self.world_size, resolve_precision(run.train.precision, device),
                                      run.train.fsdp_offload)
        else:
            module = prepare_data_parallel(compile_module(build_module(run), run.train.compile_mode), run, device,
                                           session)
        seed_everything(run.train.seed + 1000 * self.rank)
        self.engine = StepEngine(run, module, device, plan.total_steps)
        self.progress = Progress(sources=tuple(s.name for s in plan.sources))
        self.batches = BatchSource(plan, self.rank, self.world_size, self.engine)
        self.reporter = Reporter(plan, self.rank, self.world_size, self.engine, self.progress)
        self.checkpointer = Checkpointer(plan, self.rank, self.world_size, self.engine, session)
        self.profiler = StepProfiler(fit_window(run, plan.stop_at, self.rank), self.rank, device)

    def resume(self) -> None:
        """Continue from the furthest whole checkpoint, if there is one (every rank loads the same)."""
        found = self.checkpointer.resume(self.batches.grouping)
        if found is None:
            return
        state, path, skipped = found
        p, key = self.progress, self.reporter.key
        p.step, p.history, p.initial = int(state["step"]), list(state["loss_history"]), state.get("initial")
        p.resumed = {"step": p.step, "path": path, "skipped": skipped, kernels.KEY: state.get(kernels.KEY)}
        p.source_steps = dict(state.get("source_steps") or {})  # (a mixture's)
        self.reporter.post(p.step, state.get(key), state.get(GOALS, {}))  # scored before the restart; maybe unread

    def due(self, step: int) -> tuple[bool, bool]:
        """(scored, saved) after ``step`` steps: each fit's end is scored, and every scored step saved."""
        t, plan = self.plan.run.train, self.plan
        scored = (step % plan.run.eval.eval_steps == 0 or step == plan.stop_at or step in plan.eval_at)
        return scored, scored or step % (t.checkpoint_steps or plan.run.eval.eval_steps) == 0

    def fit(self) -> None:
        """Train from the progress's step to ``stop_at``; each step's batch is collated during the step
        before it where that changes nothing (raycse.train.ahead)."""
        run, p, engine = self.plan.run, self.progress, self.engine
        engine.module.train()
        rows = self.batches.step_rows(p.step)
        started, first_step = time.perf_counter(), p.step
        wanted = ahead.wanted(run.train.collate_ahead, engine.core.objective, engine.device.type)
        with ahead.CollateAhead(self.batches.collate, engine.core.encoder.tokenizer, wanted) as helper:
            row, pending = next(rows, None), None
            while row is not None:
                self.profiler.before(p.step)
                t0 = time.perf_counter()
                with span(self.profiler, "raycse.collate"):
                    examples, batch = pending.result() if pending is not None else helper.now(row)
                epoch = int(row["epoch"])
                self.batches.record(p.step, epoch, examples)
                looked = self.batches.looks_ahead(p.step, helper)
                following = next(rows, None) if looked else None
                pending = helper.submit(following) if following is not None else None
                with span(self.profiler, "raycse.step"):
                    out = engine.step(move(batch, engine.device), p.step)
                p.note_source(batch)
                if pending is not None:
                    with span(self.profiler, "raycse.wait_ahead"):
                        futures.wait([pending])  # (its error, if any, is raised at the next step)
                p.step += 1
                scored, saved = self.due(p.step)
                if saved or p.step % run.train.log_steps == 0:
                    p.window.extend(engine.read_losses(p.step))  # (timed: the wait for the device is training)
                p.train_time += time.perf_counter() - t0
                if p.step == first_step + 10:
                    self.reporter.note_warmup(started)
                p.seen += len(examples) * self.world_size
                self.reporter.log_progress(epoch, out)
                if self.profiler.after(p.step):
                    log.info(f"[raycse] profile of {describe(self.profiler.summary)}\n{self.profiler.table}")
                if saved:
                    self.checkpoint(epoch, out, scored)
                row = following if looked else next(rows, None)
        self.reporter.close()

    def checkpoint(self, epoch: int, out, scored: bool) -> None:
        """Close the loss window, score (when ``scored``) and save a checkpoint at this step."""
        metrics = self.reporter.metrics(epoch, out, self.batches.grouping["log"], self.profiler.summary)
        self.save(self.reporter.scored(metrics, self.reporter.evaluate() if scored else None))

    def report_again(self) -> None:
        """A restart after this run had reached stop_at: report its state again."""
        p = self.progress
        self.save(self.reporter.scored({"step": p.step, "loss_history": p.history, "resumed": p.resumed,
                                        "total_steps": self.plan.total_steps}, self.reporter.evaluate()))

    def save(self, metrics: dict) -> None:
        """Post the score first (a Tune trial decides its rung on it while the checkpoint, ~1.3 s for
        MiniLM's weights and optimizer, is written), then save. Ray keeps the top train.keep_checkpoints
        by CHECKPOINT_RANK (+ the latest): scored ones first, then the most recent resume points."""
        score = metrics.get(self.reporter.key)
        self.reporter.post(self.progress.step, score)
        metrics[CHECKPOINT_RANK] = checkpoint_rank(score, self.progress.step)
        self.checkpointer.save(metrics, self.batches.grouping["layout"], self.progress.initial)
        self.reporter.hooks.on_checkpoint(self.progress.step, metrics)


def worker_places(world_size: int) -> list[tuple]:
    """(Ray node id, GPU ids Ray assigned) of every rank, rank-ordered (every rank calls it: one
    all_gather_object)."""
    import ray
    import torch.distributed as dist

    place = (ray.get_runtime_context().get_node_id(), [str(g) for g in ray.get_gpu_ids()])
    if world_size == 1 or not dist.is_initialized():
        return [place]
    places = [None] * world_size
    dist.all_gather_object(places, place)
    return places


def train_loop_per_worker(config: dict) -> None:
    from raycse.platform.redact import redacted_streams
    from raycse.train.session import RayTrainSession

    with redacted_streams():  # the worker's log (and the driver's copy of it) holds no credential of a URI
        run_worker(config["plan"], RayTrainSession())


def run_worker(plan: FitPlan, session) -> None:
    """One rank's whole part of ``plan``'s fit under ``session`` (raycse.train.session): resume, score the start,
    train to ``stop_at``."""
    rank, _ = session.rank_and_world()
    setup_ray_data(progress_bars=False)
    # Ray Train's per-report INFO line prints the whole metrics dict of every checkpoint (the loss history
    # and grouping record included, growing with the run) after raycse's own line for the same step
    compat.quiet_train_report_logger()
    compat.quiet_checkpoint_logger()
    if rank == 0:  # (where Ray Train's controller hooks could not say it)
        release.register_own_group(plan.progress)
    worker = WorkerRun(plan, session)
    worker.resume()
    with kernels.settled(worker):  # (a collective, as worker_places is: every rank, in the same order)
        worker.progress.places = worker_places(worker.world_size)
        worker.reporter.log_start(worker.reporter.score_before_training())
        if worker.progress.step >= plan.stop_at:
            worker.report_again()
            return
        try:
            worker.fit()
        except torch.OutOfMemoryError:
            raise RuntimeError(out_of_memory_line(plan.run.train, worker.progress.step)) from None


def out_of_memory_line(t, step: int) -> str:
    """One line for a run that ran out of GPU memory, naming its share of the GPU."""
    share = (f"each worker holds {t.gpu_share:g} GPU (train.gpus_per_worker) but the GPU's memory is not divided: the "
             f"runs sharing it needed more than it has" if t.shares_gpus else "the step needs more than the GPU has")
    return (f"out of GPU memory at step {step + 1} (batch {t.batch_size} per worker): {share}; lower --batch-size, "
            f"raise --gpus-per-worker, or encode in chunks with --set train.cache_chunk_size=N")
