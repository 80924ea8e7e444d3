"""A fit's plan: how many steps a run takes and which epochs hold them (pure arithmetic on the
config), and the typed plan the driver hands its workers (:class:`FitPlan`).

Kept apart from the driver (which imports torch, transformers and Ray Train) because a Tune trial
needs the step count for its rung ends and should not pay ~1.5 s of imports for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from raycse.config import RunConfig
from raycse.errors import DataError


def plan_steps(run: RunConfig, num_examples) -> tuple[int, int]:
    """(steps per epoch, total steps) of ``run`` on a corpus of ``num_examples``; a mixture's (``data.sources``):
    ``num_examples`` has each source's count, and its epoch the steps of all its sources' batches."""
    t = run.train
    if run.data.is_mixture:
        return _mixture_steps(run, list(num_examples))
    spe = (num_examples // t.batch_size) // t.num_workers
    if spe == 0:
        raise DataError(f"corpus has {num_examples} usable examples, fewer than one global batch "
                        f"({t.batch_size} x {t.num_workers} workers); lower --batch-size or add text")
    return spe, min(spe * t.epochs, t.max_steps or spe * t.epochs)


def source_steps(run: RunConfig, counts: list) -> list[int]:
    """Each source's steps alone: its batches of ``train.batch_size`` a worker, one a worker a step."""
    t = run.train
    steps = [(n // t.batch_size) // t.num_workers for n in counts]
    for name, n, s in zip(run.data.sources, counts, steps):
        if s == 0:
            raise DataError(f"source {name} has {n} usable example(s), fewer than one global batch ({t.batch_size} x "
                            f"{t.num_workers} workers); lower --batch-size, add rows, or drop the source")
    return steps


def _mixture_steps(run: RunConfig, counts: list) -> tuple[int, int]:
    t = run.train
    spe = sum(source_steps(run, counts))
    return spe, min(spe * t.epochs, t.max_steps or spe * t.epochs)


def planned_epochs(run: RunConfig, steps_per_epoch: int, total: int) -> list[int]:
    """The epochs that have steps (``max_steps`` may end the run early); all run in one fit."""
    return [e for e in range(run.train.epochs) if e * steps_per_epoch < total]


@dataclass(frozen=True)
class FitPlan:
    """One fit as the driver resolved it, handed to every worker as is (Ray pickles it once).

    Everything a worker needs and nothing it must parse: the run, the step arithmetic, the batch
    route, where checkpoints go and what scores them."""

    run: RunConfig
    total_steps: int
    stop_at: int  # below total_steps: a Tune rung ends the fit early, the schedule still spans the run
    steps_per_epoch: int
    regroup_in_fit: bool  # batches regrouped by the workers every epoch, else the driver's ``layouts``
    checkpoint_dir: str  # the run's checkpoints in storage (a restarted driver resumes from the furthest)
    threads: int  # torch threads per worker
    dev: Any = None  # ObjectRef of the model-selection data (raycse.evaluation.selection.Selection), or None
    targets: Any = None  # ObjectRef of a search's other goals and their data (raycse.evaluation.targets.TargetScores)
    initial_key: Optional[str] = None  # raycse.evaluation.initial_scores: the untrained model's remembered score
    initial_file: str = ""
    eval_at: tuple[int, ...] = ()  # extra scored steps (Tune's rung ends)
    score_sink: Any = None  # rank 0 posts each dev score here at once (TuneHooks.score_sink)
    tracking: tuple = ()  # raycse.train.tracking.Tracking, one per tracker of the run
    layouts: Any = None  # ObjectRef of the epochs' raycse.grouping.layout.Layout list (fixed orders), or None
    # the numbered corpus's Arrow blocks (ObjectRefs; raycse.data.dataset.Corpus.blocks): every worker
    # reads them whole, straight from the object store (no Ray Data pipeline or actor per fit)
    corpus: tuple = ()
    # the teacher's and guide's vectors by row id ({"teacher.text": ObjectRef, ...}; raycse.train.prepare.prepare_references)
    references: Any = None
    progress: Any = None  # (RunRegistry, run key): rank 0 notes each logged step there (said on an interrupt)
    callbacks: tuple = ()  # the Python API's user callbacks (raycse.train.callbacks.Callback), run on rank 0
    sources: tuple = ()  # a mixture's sources (SourceSpec), in data.sources' order; () for one corpus
    # a mixture that regroups some sources in the fit: ObjectRef of {epoch: (the other sources' batches, None for
    # those regrouped, their groupings)} (raycse.train.prepare.fixed_sources), or None
    fixed_sources: Any = None


@dataclass(frozen=True)
class SourceSpec:
    """One source of a mixture as the workers see it: its name, its rows' ids (``offset`` on, ``rows`` of them)
    and what its rows hold."""

    name: str
    offset: int
    rows: int
    pairs: bool
    negatives: bool


@dataclass(frozen=True)
class TuneHooks:
    """What a Tune trial asks of a Train run beyond the run itself.

    ``stop_at``: stop after this many steps, the learning-rate schedule still spanning the whole run
    (a rung); ``eval_at``: steps scored besides eval.eval_steps; ``score_sink``: an object with
    ``post(step, score, goals)`` receiving each dev score as rank 0 has it; ``prepared``: the corpus read and
    laid out once for the experiment (raycse.train.prepare.PreparedData); ``registry``/``run_key``:
    the experiment's registry of live Train runs, so a stopped trial's fit is released; ``targets``: a
    search's goals (raycse.evaluation.targets.Target), each scored at every scoring and posted with it."""

    stop_at: Optional[int] = None
    eval_at: tuple[int, ...] = ()
    score_sink: Any = None
    prepared: Any = None
    registry: Any = None
    run_key: Optional[str] = None
    targets: tuple = ()
