"""The interface of an experiment tracker (:class:`Tracker`) and the record of a run's tracker that travels
to the workers (:class:`Tracking`); raycse.train.tracking finds trackers by kind and drives them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Tracking:
    """What a run's workers need to log to its tracker: picklable, it travels in the train loop's plan.

    Args:
        kind: the tracker's kind (``--tracking KIND:TARGET``).
        target: where it logs (a server's address, a folder, a project).
        run_id: the tracker's own id of the run (MLflow's, W&B's), set by ``Tracker.open``.
        name: the run's name.
        config: the resolved config (credentials masked), where the tracker sets it on the run.
        extra: the tracker's own settings a worker's environment need not have.

    Returns:
        The value :meth:`Tracker.open` returns and :meth:`Tracker.sink` is given on rank 0.

    Raises:
        Nothing itself.

    >>> Tracking("jsonl", "runs/log", name="simcse").name
    'simcse'
    """

    kind: str
    target: str
    run_id: Optional[str] = None  # the tracker's own id of the run (MLflow's, W&B's)
    name: str = "run"  # the run's name (a TensorBoard sub-directory, a W&B run name)
    config: Optional[dict] = None  # the resolved config (credentials masked), where the tracker sets it on the run
    extra: dict = field(default_factory=dict)  # the tracker's own settings a worker's environment need not have


class Tracker:
    """One kind of experiment tracker (``kind``: the name before the colon of ``--tracking KIND:TARGET``). A subclass
    implements ``sink`` (and where it needs them ``check``, ``open``, ``close``, ``log_model``, ``tune_callback``);
    it is found by an installed package's entry point in ``raycse.trackers``, as raycse's own (MLflow, TensorBoard,
    W&B) are found by kind.

    Args:
        (to its hooks) target: the TARGET of ``--tracking KIND:TARGET``; tracking: the run's :class:`Tracking`.

    Returns:
        ``open`` a :class:`Tracking`; ``sink`` an object with ``log(scalars: dict, step: int)`` and ``close()``;
        ``tune_callback`` a Ray Tune callback for ``raycse tune`` (None: not for tune).

    Raises:
        raycse.errors.RaycseError: from ``check`` (its package missing, its server unreachable), before anything
            starts: one line.

    >>> class Printed(Tracker):
    ...     kind = "printed"
    ...     def sink(self, tracking):
    ...         class Sink:
    ...             def log(self, scalars, step):
    ...                 print(step, scalars)
    ...             def close(self):
    ...                 pass
    ...         return Sink()
    >>> tracker = Printed()
    >>> tracker.sink(tracker.open("-", "run", {})).log({"loss": 0.5}, 10)
    10 {'loss': 0.5}
    """

    kind: str = ""

    def check(self, target: str) -> None:
        """The driver, before anything starts: what the tracker needs (its package, credentials) is here."""

    def open(self, target: str, name: str, params: dict) -> Tracking:
        """The driver, before the first fit: the run's :class:`Tracking` (``params``: the resolved config, its
        credentials masked)."""
        return Tracking(self.kind, target, name=name)

    def abandon(self, tracking: Tracking) -> None:
        """The run :meth:`open` made, left because another tracker failed to open (default: nothing)."""

    def sink(self, tracking: Tracking):
        """Rank 0 of every fit: an object with ``log(scalars: dict, step: int)`` and ``close()``."""
        raise NotImplementedError

    def log_model(self, tracking: Tracking, model_dir) -> None:
        """The driver, once the model is saved (default: nothing)."""

    def close(self, tracking: Tracking, ok: bool, final: Optional[dict] = None) -> None:
        """The driver, after the last fit: the final scores and the run's status (default: nothing)."""

    def tune_callback(self, target: str, experiment: str):
        """Ray Tune's callback logging each trial of ``raycse tune`` (None: this tracker is not for tune)."""
        return None
