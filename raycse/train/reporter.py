"""The evaluator and reporter: a fit's scores (rank 0 scores the model-selection data), its log
lines, tracking, the metrics each checkpoint carries, and the scores a Tune trial waits for."""

from __future__ import annotations

import logging
from typing import Optional

from raycse.evaluation import initial_scores
from raycse.evaluation.targets import GOALS, score_model
from raycse.model.precision import resolve_precision
from raycse.objectives.base import LossOutput
from raycse.objectives.references import step_notes
from raycse.platform.console import step_line
from raycse.platform.process_state import release_freed_memory
from raycse.platform.ray_session import fetch
from raycse.train import tracking
from raycse.train.callbacks import Callbacks
from raycse.train.module import compiled_note
from raycse.train.plan import FitPlan
from raycse.train.progress import Progress, start_lines
from raycse.train.sharding import broadcast_from_rank0, gathered

SCORE_METRIC = "stsb_dev_spearman"  # the default model-selection key (eval.metric: stsb_dev)
# Workers log instead of print: Ray Train V2 patches print() into its logger and would echo each line twice.
log = logging.getLogger("raycse.train")


class Reporter:
    """Rank ``rank``'s scores and reports for ``plan``'s fit of ``engine`` (StepEngine)."""

    def __init__(self, plan: FitPlan, rank: int, world_size: int, engine, progress: Progress):
        self.plan, self.run, self.rank, self.world_size = plan, plan.run, rank, world_size
        self.engine, self.progress = engine, progress
        # a sharded model encodes on every rank at once (its forward gathers every rank's shards); rank 0 scores
        self.collective = plan.run.train.sharding == "fsdp" and world_size > 1
        scores = rank == 0 or self.collective
        self.dev = fetch(plan.dev, "the scoring data") if plan.dev is not None and scores else None
        self.targets = fetch(plan.targets, "the goals' data") if plan.targets is not None and scores else None
        self.extras: dict = {}  # the last scoring's other goals (a search's --objectives)
        self.key = self.run.eval.score_key()
        self.eval_dtype = (engine.dtype if self.run.eval.precision == "train"
                           else resolve_precision(self.run.eval.precision, engine.device))
        self.sink = plan.score_sink if rank == 0 else None
        self.tlog = tracking.Logger(plan.tracking, rank)  # rank 0 logs; a no-op elsewhere
        self.hooks = Callbacks(plan.callbacks, rank)  # (the Python API's user callbacks: rank 0 only)

    def evaluate(self) -> Optional[float]:
        """Rank 0's model-selection score of the current weights (None elsewhere or without dev data); a
        sharded model's ranks all encode (a collective), rank 0 keeps the score."""
        if self.dev is None:
            return None
        encoder, size = self.engine.core.encoder, self.run.eval.batch_size
        with gathered(self.engine.module):
            score, extras = score_model(self.dev, self.targets, lambda xs, **how: encoder.encode(
                xs, batch_size=size, autocast_dtype=self.eval_dtype, **how), encoder)
        release_freed_memory()  # (encode() switched the encoder to eval mode and back by itself)
        self.extras = extras if self.rank == 0 else {}
        return score if self.rank == 0 else None

    def score_before_training(self) -> bool:
        """The starting model's score when asked (eval.before_training), once per machine; True if remembered."""
        before, p = self.run.eval.before_training, self.progress
        if p.step != 0 or before == "false" or self.dev is None:
            return False
        p.initial = initial_scores.lookup(self.plan.initial_key, self.plan.initial_file)
        if self.collective:  # (rank 0's machine decides whether every rank encodes)
            p.initial = broadcast_from_rank0(p.initial)
        remembered = p.initial is not None
        if p.initial is None and before == "true":
            p.initial = self.evaluate()
            if self.rank == 0:
                initial_scores.store(self.plan.initial_key, p.initial, self.plan.initial_file)
        if p.initial is not None:
            self.tlog.log({self.key: p.initial}, 0)  # (rank 0's logger; a no-op elsewhere)
        return remembered

    def log_start(self, remembered: bool) -> None:
        """Rank 0's first lines: the machine and kernels, then the run's shape and starting score."""
        log.setLevel(logging.INFO)
        for line in start_lines(self.plan, self.world_size, self.progress, self.engine, self.eval_dtype, self.dev,
                                remembered) if self.rank == 0 else ():
            log.info(line)

    def note_warmup(self, started: float) -> None:
        """The time this fit took to its 10th step (first shapes, kernel choice, allocator warm-up)."""
        self.progress.to_step_10 = self.engine.synchronize() - started
        if self.rank == 0:
            log.info(f"[raycse] 10 steps in {self.progress.to_step_10:.2f} s from the fit's first step"
                     f"{compiled_note(self.run)}")

    def log_progress(self, epoch: int, out: Optional[LossOutput] = None) -> None:
        """Rank 0, every train.log_steps: the mean loss, learning rate, examples/s (and ``out``'s teacher/guide)."""
        p, every, total = self.progress, self.run.train.log_steps, self.plan.total_steps
        if self.rank != 0 or not (p.step % every == 0 or p.step == total):
            return
        recent, (extra, said) = p.window[-every:], step_notes(out.metrics if out is not None else {})
        loss, lr, (by_source, of_sources) = sum(recent) / len(recent), self.engine.lr, p.source_notes(len(recent))
        log.info(step_line(p.step, total, epoch, loss, lr, p.speed) + said + of_sources)  # (the console's bar reads it)
        metrics = {"loss": loss, "lr": lr, "examples_per_s": p.speed, "epoch": epoch, **extra, **by_source}
        self.tlog.log(metrics, p.step)
        self.hooks.on_step(p.step, metrics)
        if self.plan.progress is not None:  # (not waited for: a note, not a report)
            self.plan.progress[0].note_step.remote(self.plan.progress[1], p.step)

    def metrics(self, epoch: int, out: LossOutput, grouping_log: list, profile: Optional[dict]) -> dict:
        """A checkpoint's metrics; closes the loss window."""
        return self.progress.checkpoint_metrics(epoch, out.metrics, grouping_log, profile, self.plan.total_steps,
                                                self.engine.peak_memory())

    def scored(self, metrics: dict, score: Optional[float]) -> dict:
        """``metrics`` with the score (None: unscored) and its starting value; logged and tracked."""
        if score is None:
            return metrics
        log.info(f"[raycse] step {self.progress.step}: {self.dev.label} {score:.2f}")
        self.tlog.log({self.key: score}, self.progress.step)
        metrics = {**metrics, self.key: score, self.key + "_initial": self.progress.initial,
                   **({GOALS: self.extras} if self.extras else {})}
        self.hooks.on_eval(self.progress.step, score, metrics)
        return metrics

    def post(self, step: int, score: Optional[float], extras: Optional[dict] = None) -> None:
        """Give a Tune trial ``step``'s score and other goals (default: the last scoring's) at once: it
        decides its rung on them while the checkpoint is written (it keeps the first it gets a step)."""
        if self.sink is not None and score is not None:
            self.sink.post(step, float(score), self.extras if extras is None else extras)

    def close(self) -> None:
        self.tlog.close()
