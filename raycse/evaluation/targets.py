"""The goals of a search for more than one (``raycse tune --objectives``): what a trial reports besides
its model-selection score, so Optuna can keep the trials no other beats on every goal.

A goal is ``NAME:max`` or ``NAME:min``; NAME is one of

- a model-selection metric as ``eval.metric`` names it (``sts``, ``stsb_dev``, ``beir:DIR:METRIC``,
  ``mteb:TASK``...), optionally cut to its first DIM dimensions (``@DIM``, a Matryoshka size the run
  trains; the cut vectors are compared by cosine, so renormalised) and quantized (``@int8``,
  ``@binary``...: :mod:`raycse.evaluation.quantized`): ``sts@64``, ``sts@binary``, ``sts@64@binary``;
- ``speed``: sentences per second of the model embedding the selection data at each scoring (rank 0's
  device, ``eval.batch_size``, ``eval.precision``): measured the same way for every trial, and as
  loaded as the machine is then;
- ``dims``: the width of the model's embeddings; ``params``: its parameter count.

    >>> [t.name for t in parse_targets("sts:max, sts@64:max, speed:max")]
    ['sts', 'sts@64', 'speed']
    >>> parse_targets("sts@64@binary:max")[0].precision
    'binary'
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np

from raycse.errors import ConfigError

SIZE_TARGETS = ("speed", "dims", "params")
GOALS = "goals"  # a checkpoint's metrics: {target key: value} of its scoring, beside its score
DIRECTIONS = ("max", "min")


@dataclass(frozen=True)
class Target:
    name: str  # as the user wrote it: sts@64
    mode: str  # max | min
    metric: Optional[str] = None  # the eval.metric it scores (None: speed, dims or params)
    dims: Optional[int] = None  # the Matryoshka size the embeddings are cut to
    precision: str = "float32"

    @property
    def key(self) -> str:
        """The name of the trial's report (``t_sts_at_64``): letters, digits, ``_.-`` only, as every
        tracker takes it."""
        return "t_" + re.sub(r"[^A-Za-z0-9_.-]", "_", self.name.replace("@", "_at_"))

    @property
    def eval_metric(self) -> str:
        """The ``eval.metric`` whose data and precision this target scores on."""
        return self.metric if self.precision == "float32" else f"{self.metric}@{self.precision}"


def parse_targets(text) -> list[Target]:
    """``'sts:max,sts@64:max'`` (or a YAML list of such strings) as targets; one line per mistake."""
    items = text if isinstance(text, (list, tuple)) else str(text or "").split(",")
    targets = [parse_target(str(item).strip()) for item in items if str(item).strip()]
    if len(targets) < 2:
        raise ConfigError(f"--objectives needs two goals or more, each NAME:max or NAME:min (e.g. "
                          f"'sts:max,sts@64:max'); got {text!r}: one goal is --eval-metric with --target")
    names = [t.name for t in targets]
    keys = [t.key for t in targets]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"--objectives names a goal twice: {', '.join(names)}")
    return targets


def parse_target(item: str) -> Target:
    from raycse.config.evaluation import EMBEDDING_PRECISIONS, EvalConfig

    name, colon, mode = item.rpartition(":")
    if not colon or mode not in DIRECTIONS:
        raise ConfigError(f"--objectives: '{item}' must be NAME:max or NAME:min (e.g. sts@64:max)")
    if name in SIZE_TARGETS:
        return Target(name, mode)
    base, precision = name, "float32"
    head, at, tail = base.rpartition("@")
    if at and tail in EMBEDDING_PRECISIONS[1:]:
        base, precision = head, tail
    dims = None
    head, at, tail = base.rpartition("@")
    if at and tail.isdigit() and _is_metric(head):  # (the @10 of beir:DIR:ndcg@10 is the metric's own)
        base, dims = head, int(tail)
        if dims < 1:
            raise ConfigError(f"--objectives: '{item}': a Matryoshka size must be >= 1")
    if not _is_metric(base):
        raise ConfigError(f"--objectives: '{item}': {base!r} is not a goal: give speed, dims, params or an "
                          f"--eval-metric (sts, beir:DIR:METRIC, mteb:TASK), optionally @DIM and @PRECISION")
    try:
        EvalConfig(metric=base if precision == "float32" else f"{base}@{precision}").selection()
    except ConfigError as exc:
        raise ConfigError(f"--objectives: '{item}': {exc}") from None
    return Target(name, mode, base, dims, precision)


def _is_metric(text: str) -> bool:
    from raycse.config.evaluation import EvalConfig

    try:
        EvalConfig(metric=text).selection()
        return True
    except ConfigError:
        return False


def check_sizes(targets: list[Target], trained: list[Optional[list]]) -> None:
    """Every ``@DIM`` is a Matryoshka size of every run the search can make (``trained``: each run's
    ``objective.matryoshka_dims``, None where it trains none)."""
    for target in targets:
        if target.dims is None:
            continue
        for sizes in trained:
            if not sizes or target.dims not in sizes:
                raise ConfigError(f"--objectives: '{target.name}' scores {target.dims} dimensions, which a run of this "
                                  f"search does not train (objective.matryoshka_dims: {sizes}); add {target.dims} "
                                  f"to run.objective.matryoshka_dims")


@dataclass
class TargetScores:
    """The model-selection data of each target (shipped to rank 0 with the run's own), and their scoring."""

    targets: tuple
    data: dict  # eval.metric -> raycse.evaluation.selection.Selection

    def score(self, main, embed: Callable, params: int) -> tuple[Optional[float], dict]:
        """(``main``'s score, {target key: value}), every text embedded once for all of them."""
        timed = _TimedEmbed(embed)
        score = main.score(timed) if main is not None else None
        out = {}
        for t in self.targets:
            if t.name == "params":
                out[t.key] = float(params)
            elif t.metric is not None and t.dims is None and self.data[t.eval_metric] is main:
                out[t.key] = score  # (the run's own selection score: not computed twice)
            elif t.metric is not None:
                out[t.key] = self.data[t.eval_metric].score(timed.cut(t.dims))
        if any(t.name in ("speed", "dims") for t in self.targets):
            width, rate = timed.width_and_rate(next(iter(self.data.values())))
            out.update({t.key: float(width if t.name == "dims" else rate)
                        for t in self.targets if t.name in ("speed", "dims")})
        return score, out


def score_model(main, targets: Optional[TargetScores], embed: Callable, model) -> tuple[Optional[float], dict]:
    """``main``'s score of the model ``embed`` runs, and each target's where a search has several (else {})."""
    if targets is None:
        return main.score(embed), {}
    return targets.score(main, embed, sum(p.numel() for p in model.parameters()))


def load_targets(targets, eval_cfg, main=None) -> TargetScores:
    """The data each target scores on (the run's own eval settings, its metric replaced), read once per metric;
    ``main``, the run's own selection data already read, serves the targets that name its metric."""
    from raycse.evaluation.selection import load_selection

    data = {}
    for metric in [t.eval_metric for t in targets if t.metric is not None] or [eval_cfg.metric]:
        if metric not in data and main is not None and _same_metric(metric, eval_cfg):
            data[metric] = main
        elif metric not in data:
            selection = load_selection(replace(eval_cfg, metric=metric))
            if selection is None:
                raise ConfigError(f"--objectives: {metric} needs its data; set run.eval.stsb_dev (or "
                                  f"eval.metric's data) in the search space")
            data[metric] = selection
    return TargetScores(tuple(targets), data)


def _same_metric(metric: str, eval_cfg) -> bool:
    """Whether ``metric`` names the run's own ``eval.metric`` (``sts`` and ``stsb_dev`` are one)."""
    other = replace(eval_cfg, metric=metric)
    return (other.selection(), other.embedding_precision()) == (eval_cfg.selection(), eval_cfg.embedding_precision())


class _TimedEmbed:
    """An embedding function that embeds each (texts, options) once, and times what it embedded."""

    def __init__(self, embed: Callable):
        self.embed, self.seen, self.sentences, self.seconds = embed, {}, 0, 0.0

    def __call__(self, xs, **how):
        key = (tuple(xs), tuple(sorted(how.items())))
        if key not in self.seen:
            started = time.perf_counter()
            self.seen[key] = self.embed(xs, **how)
            self.seconds += time.perf_counter() - started
            self.sentences += len(key[0])
        return self.seen[key]

    def cut(self, dims: Optional[int]) -> Callable:
        """The same embeddings, their first ``dims`` dimensions (all where None)."""
        if dims is None:
            return self
        return lambda xs, **how: np.ascontiguousarray(np.asarray(self(xs, **how))[:, :dims])

    def width_and_rate(self, selection) -> tuple[int, float]:
        """The embeddings' width and sentences per second; where nothing was embedded yet (a run
        with only speed and dims as goals), the selection data's first 256 texts are."""
        if not self.seen:
            texts = _texts(selection)[:256]
            self(texts)
        vectors = next(iter(self.seen.values()))
        return int(np.asarray(vectors).shape[1]), self.sentences / max(self.seconds, 1e-9)


def _texts(selection) -> list:
    """Texts of the selection data (an MTEB task's are embedded by its own scoring, first)."""
    if selection.sts is not None:
        return list(selection.sts.sent1)
    return list(selection.beir.queries) if selection.beir is not None else ["a sentence"] * 64
