"""What a fit has done (:class:`Progress`: restored on resume, reported at each checkpoint) and rank
0's line that says the run's shape and where it starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from raycse.train.plan import FitPlan


@dataclass
class Progress:
    """What a fit has done: restored from a checkpoint on resume, reported at each one."""

    step: int = 0
    history: list = field(default_factory=list)  # mean loss per checkpoint
    initial: Optional[float] = None  # the score before training
    resumed: Optional[dict] = None  # where this fit's state came from
    window: list = field(default_factory=list)  # losses since the last checkpoint
    train_time: float = 0.0  # this fit's seconds in steps, and examples seen in them
    seen: int = 0
    to_step_10: Optional[float] = None  # seconds this fit took to its 10th step
    places: list = field(default_factory=list)  # every rank's (Ray node, GPU ids)
    sources: tuple = ()  # a mixture's source names (data.sources), by index
    source_window: list = field(default_factory=list)  # each step's source since the last checkpoint, as ``window``
    source_steps: dict = field(default_factory=dict)  # each source's steps so far (restored on resume)

    def note_source(self, batch: dict) -> None:
        """A mixture's step: which source its batch came from (raycse.objectives.by_source)."""
        index = batch.get("source")
        if index is not None:
            self.source_window.append(int(index))
            name = self.sources[int(index)]
            self.source_steps[name] = self.source_steps.get(name, 0) + 1

    def source_losses(self, last: Optional[int] = None) -> dict:
        """Each source's mean loss over the window's steps (its ``last`` ones), by name; {} for one corpus."""
        losses, marks = (self.window, self.source_window) if last is None else (self.window[-last:],
                                                                                self.source_window[-last:])
        by: dict = {}
        for loss, index in zip(losses, marks):
            by.setdefault(self.sources[index], []).append(loss)
        return {name: sum(v) / len(v) for name, v in by.items()}

    @property
    def speed(self) -> float:
        return self.seen / max(self.train_time, 1e-9)

    def source_notes(self, last: int) -> tuple[dict, str]:
        """A mixture's log step: each source's mean loss over the ``last`` steps and its steps so far, as tracked
        metrics and as the log line's end; ({}, "") for one corpus."""
        losses = self.source_losses(last)
        said = "".join(f", {n} {losses[n]:.4f} (its step {self.source_steps.get(n, 0)})" for n in self.sources
                       if n in losses)
        return {**{f"loss_{n}": v for n, v in losses.items()},
                **{f"steps_{n}": k for n, k in self.source_steps.items()}}, said

    def checkpoint_metrics(self, epoch: int, last: dict, grouping_log: list, profile: Optional[dict],
                           total_steps: int, memory: dict) -> dict:
        """A checkpoint's metrics (``last``: the step's loss diagnostics; ``memory``: the device's peaks);
        closes the loss window."""
        by_source = self.source_losses()
        if self.window:
            self.history.append(sum(self.window) / len(self.window))
            self.window, self.source_window = [], []
        mixture = {"source_losses": by_source, "source_steps": dict(self.source_steps)} if self.sources else {}
        return {**mixture, "step": self.step, "epoch": epoch, "loss": self.history[-1], "loss_history": list(self.history),
                "worker_nodes": [node for node, _ in self.places], "worker_gpus": [gpus for _, gpus in self.places],
                "resumed": self.resumed, **({"grouping": list(grouping_log)} if grouping_log else {}),
                "train_examples_per_s": self.speed, "train_seconds": self.train_time,
                "total_steps": total_steps, **memory, **({"profile": profile} if profile else {}),
                **({"seconds_to_step_10": self.to_step_10} if self.to_step_10 is not None else {}),
                **{f"last_{k}": float(v) for k, v in last.items()}}


def run_line(plan: FitPlan, world_size: int, p: Progress, dtype, dev, remembered: bool) -> str:
    """Workers, steps, global batch, precision, threads, and the starting score where there is one
    (``remembered``: read back from an earlier run, not computed)."""
    run = plan.run
    fresh = p.step == 0 and dev is not None
    return (f"[raycse] {world_size} worker(s), steps {p.step}..{plan.stop_at} of "
            f"{plan.total_steps}, global batch {run.train.batch_size * world_size}, precision "
            f"{dtype or 'fp32'}, threads {torch.get_num_threads()}" + (", resumed" if p.step else "")
            + (f", {dev.label} before: {p.initial:.2f}" if fresh and p.initial is not None else "")
            + (" (remembered from an earlier run: raycse.evaluation.initial_scores)" if remembered else "")
            + (f", {dev.label} before: not measured (--score-before true measures it)"
               if fresh and p.initial is None and run.eval.before_training == "auto" else ""))


def attention_note(encoder) -> str:
    """", attention KERNELS": what the encoder's attention runs on (raycse's unpadded BERT layers run their own)."""
    from raycse.platform import compat

    kernels = "raycse's unpadded" if encoder.unpadding() else compat.attention_implementation(encoder.backbone)
    return f", attention {kernels}" if kernels else ""


def start_lines(plan: FitPlan, world_size: int, progress: Progress, engine, eval_dtype, dev, remembered: bool
                ) -> list[str]:
    """Rank 0's first lines: the machine and the CPU kernels chosen (the detail unmarked: the console keeps it for
    the log file), the run's shape and starting score, its batch shapes and what trains."""
    from raycse.model import onednn
    from raycse.platform import machine
    from raycse.train.module import shape_bound, what_trains

    chosen = engine.core.encoder.onednn  # (off where the run cannot use it: compiled or sharded)
    kernels = onednn.kernels_note(engine.device, engine.dtype, eval_dtype) if chosen else ""
    detail = onednn.kernels_detail(engine.device, engine.dtype, eval_dtype) if chosen else ""
    said = attention_note(engine.core.encoder)
    return ([f"[raycse] rank 0 on {machine.describe()}, torch {torch.__version__}{said}{kernels}"]
            + ([detail] if detail else [])
            + [run_line(plan, world_size, progress, engine.dtype, dev, remembered)]
            + [f"[raycse] {line}" for line in (shape_bound(plan.run, engine.core.objective), what_trains(engine.core))])
