"""Your own code at a fit's steps, evaluations and checkpoints: ``raycse.train(run, callbacks=[...])``.

A callback subclasses :class:`Callback` and overrides the hooks it needs. Every hook runs on rank 0
in the Ray Train worker that trains, not in the caller's process (as sentence-transformers'
``TrainerCallback`` runs in its trainer): so a callback must pickle (Ray ships it with the fit, once),
and what it keeps must go where the caller can read it (a file, a tracker, a Ray actor). A hook that
raises fails the run with its error, as a failing step would.

    >>> from raycse.train.callbacks import Callback
    >>> class StopWatch(Callback):
    ...     def on_eval(self, step, score, metrics):
    ...         print(f"step {step}: {score:.2f}")
    >>> StopWatch().on_eval(8, 81.234, {})
    step 8: 81.23
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path
from typing import Iterable

from raycse.errors import ConfigError


class Callback:
    """The hooks of a fit, each a no-op until overridden (rank 0 calls them): ``raycse.train(run, callbacks=[...])``.

    Args:
        (to its hooks) step: the fit's step; metrics: the step's (``loss``, ``lr``, ``examples_per_s``, ``epoch``)
            or the checkpoint's; score: the model-selection score.

    Returns:
        Each hook returns None.

    Raises:
        raycse.errors.ConfigError: ``raycse.train`` refuses, before Ray starts, a callback that is no Callback or
            does not pickle; a hook that raises fails the run with its error.

    >>> class Best(Callback):
    ...     best = None
    ...     def on_eval(self, step, score, metrics):
    ...         self.best = max(self.best or score, score)
    >>> b = Best()
    >>> b.on_eval(4, 80.5, {}); b.on_eval(8, 82.0, {}); b.best
    82.0
    """

    def on_step(self, step: int, metrics: dict) -> None:
        """Every ``train.log_steps`` steps: ``metrics`` holds ``loss`` (the recent mean), ``lr``,
        ``examples_per_s`` and ``epoch``."""

    def on_eval(self, step: int, score: float, metrics: dict) -> None:
        """After each model-selection score (``eval.metric`` at ``eval.eval_steps``): the score, and the
        metrics the checkpoint of this step carries."""

    def on_checkpoint(self, step: int, metrics: dict) -> None:
        """After each checkpoint of the fit is written and reported to Ray Train, with its metrics."""


class Callbacks:
    """The run's callbacks, called in order on rank 0 (nothing on the other ranks)."""

    def __init__(self, callbacks: Iterable[Callback], rank: int):
        self.callbacks = tuple(callbacks) if rank == 0 else ()

    def on_step(self, step: int, metrics: dict) -> None:
        for callback in self.callbacks:
            callback.on_step(step, dict(metrics))

    def on_eval(self, step: int, score: float, metrics: dict) -> None:
        for callback in self.callbacks:
            callback.on_eval(step, score, dict(metrics))

    def on_checkpoint(self, step: int, metrics: dict) -> None:
        for callback in self.callbacks:
            callback.on_checkpoint(step, dict(metrics))


def checked(callbacks: Iterable) -> tuple:
    """The callbacks as a tuple, each a :class:`Callback` that pickles; else one line that says which.

    A callback whose classes live in the user's own files (not in an installed package) travels by
    value: Ray's workers, on this machine or another, do not have those files on their path."""
    import ray.cloudpickle as cloudpickle

    found = tuple(callbacks or ())
    for i, callback in enumerate(found):
        if not isinstance(callback, Callback):
            raise ConfigError(f"callbacks[{i}] is {type(callback).__name__}, not a raycse.train.callbacks.Callback; "
                              f"subclass Callback and override on_step, on_eval or on_checkpoint")
        for cls in type(callback).__mro__:
            module = sys.modules.get(cls.__module__)
            if module is not None and _users_own(module):
                cloudpickle.register_pickle_by_value(module)
        try:
            cloudpickle.dumps(callback)
        except Exception as exc:  # (what fails to pickle varies: locks, open files, sockets, generators)
            raise ConfigError(f"callbacks[{i}] ({type(callback).__name__}) cannot be sent to the training worker: "
                              f"{str(exc).splitlines()[0][:200]}; keep only picklable state in it (open files "
                              f"and connections in the hook itself)") from None
    return found


def _users_own(module) -> bool:
    """A module from a file of the user's (a script, a notebook's helper), not from an installed package,
    the standard library or raycse: those the workers import by name."""
    file = getattr(module, "__file__", None)
    if not file or module.__name__ == "__main__" or module.__name__.split(".")[0] == "raycse":
        return False  # (__main__ and classes defined in functions go by value anyway)
    where = Path(file).resolve()
    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    return not any(where.is_relative_to(Path(p).resolve()) for p in installed)
