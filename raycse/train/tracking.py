"""Experiment tracking of a training run: ``train.tracking`` = ``KIND:TARGET``, or several joined by
commas (one of each kind; each gets the same config and metrics, and a failure to close one does not keep
the others open). raycse's own kinds (raycse.train.trackers): ``mlflow:URI``, ``tensorboard:DIR``,
``wandb:[ENTITY/]PROJECT``. A user's own kind is a :class:`Tracker` an installed package registers under
that kind in the entry-point group ``raycse.trackers``
(``[project.entry-points."raycse.trackers"] aim = "my_pkg.aim_tracking:AimTracker"``: ``--tracking aim:DIR``).

A tracker follows one run through its life: :meth:`~Tracker.check` (the driver, before anything starts),
:meth:`~Tracker.open` (the driver, before the first fit: a :class:`Tracking` that travels to the
workers), :meth:`~Tracker.sink` (rank 0 of every fit: ``log(scalars, step)``, ``close()``),
:meth:`~Tracker.log_model` and :meth:`~Tracker.close` (the driver, at the end). ``raycse tune`` logs
each trial through Ray Tune's callback the tracker gives (:meth:`~Tracker.tune_callback`).

    >>> class Printed(Tracker):
    ...     "Prints each logged step."
    ...     kind = "print"
    ...     def sink(self, tracking):
    ...         class Sink:
    ...             def log(self, scalars, step): print(step, scalars)
    ...             def close(self): pass
    ...         return Sink()
    >>> tracking = Printed().open("-", "run", {})
    >>> tracking.kind, tracking.name
    ('print', 'run')
    >>> Printed().sink(tracking).log({"loss": 0.5}, step=3)
    3 {'loss': 0.5}
"""

from __future__ import annotations

from typing import Optional

from raycse.config import parse_tracking as parse
from raycse.config.train import TRACKER_GROUP
from raycse.errors import ConfigError
from raycse.platform import plugins
from raycse.platform.redact import redact_obj
from raycse.train.tracker import Tracker, Tracking
from raycse.train.trackers import BUILT_IN

__all__ = ["Tracker", "Tracking", "get", "check", "open_runs", "log_model", "close_run", "Logger"]


def get(kind: str) -> Tracker:
    """The tracker of ``kind``: raycse's own, or an installed package's entry point."""
    if kind in BUILT_IN:
        return BUILT_IN[kind]
    found = plugins.load_instance(TRACKER_GROUP, kind, "tracker", Tracker)
    if found is None:  # (parse_tracking refuses such a kind first)
        raise ConfigError(f"unknown tracker {kind!r}")
    return found


def check(spec: Optional[str]) -> None:
    """Before anything starts: every tracker named has what it needs to accept a run."""
    for kind, target in parse(spec):
        get(kind).check(target)


def open_runs(spec: Optional[str], name: str, params: dict) -> tuple[Tracking, ...]:
    """Driver side, before the first fit (after :func:`check`): one :class:`Tracking` per tracker named
    (none when tracking is off). Should one fail to open, those opened before it are abandoned. Every
    tracker is given the config with credentials masked (a URI's password never reaches a tracker)."""
    opened: list[Tracking] = []
    params = redact_obj(params)
    try:
        for kind, target in parse(spec):
            opened.append(get(kind).open(target, name, params))
    except BaseException:
        for t in opened:
            try:
                get(t.kind).abandon(t)
            except Exception:  # (the error that stopped the run is the one to report)
                pass
        raise
    return tuple(opened)


def log_model(tracking: Tracking, model_dir) -> None:
    """Driver side, once the model is saved."""
    get(tracking.kind).log_model(tracking, model_dir)


def close_run(tracking: Tracking, ok: bool, final: Optional[dict] = None) -> None:
    """Driver side, after the last fit: final scores, and the run's status."""
    get(tracking.kind).close(tracking, ok, final)


class Logger:
    """Rank 0's metric writer for one fit, into every tracker of the run (a no-op elsewhere or without
    tracking)."""

    def __init__(self, trackings: tuple[Tracking, ...], rank: int):
        self.sinks = [get(t.kind).sink(t) for t in trackings] if rank == 0 else []

    def log(self, metrics: dict, step: int) -> None:
        if not self.sinks:
            return
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for sink in self.sinks:
            sink.log(scalars, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
