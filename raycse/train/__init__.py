"""Ray Train: the driver (``driver.py``) builds a :class:`~raycse.train.plan.FitPlan`; every worker runs
``loop.py`` over four parts: the step engine (``steps.py``), the batch source (``batches.py``), the
reporter (``reporter.py``) and the checkpointer (``checkpoints/in_fit.py``; the checkpoints' files and
which one a fit resumes from: ``checkpoints/files.py``, ``checkpoints/choice.py``).

The package is also the Python API's entry point, ``raycse.train(run, corpus=...)``: a package
named like a function shadows the function once it is imported (``raycse.train`` becomes the
package), so the package itself is callable (raycse.platform.callable_package).
"""

import os
import sys

from raycse.platform.callable_package import make_callable


def train(run, overwrite: bool = False, corpus=None, callbacks=(), storage_path=None, run_name: str = "train"):
    """Train a :class:`raycse.config.RunConfig` on Ray Train, as ``raycse train`` does; returns a
    ``TrainResult`` (``.path``: the saved model, ``.metrics``: its scores).

    ``corpus``: a path or URI (as ``run.data.corpus``), or the data itself: a ``ray.data.Dataset`` or
    a Hugging Face ``datasets.Dataset`` (a ``DatasetDict``: its ``run.data.split``) with the columns
    ``run.data`` names (``text_column``, and ``pair_column``... for pairs). ``callbacks``:
    :class:`raycse.train.callbacks.Callback` objects, called on rank 0 at each logged step, evaluation
    and checkpoint. ``storage_path`` and ``run_name`` (``--storage-path``, ``--run-name``): where Ray
    Train keeps checkpoints, so that the same call resumes after a crash.

    Bad settings are refused before Ray starts:

    >>> import raycse
    >>> raycse.train(raycse.RunConfig(), run_name="../elsewhere")
    Traceback (most recent call last):
    ...
    raycse.errors.ConfigError: --run-name must be letters, digits, '-', '_' or '.' (not first), got '../elsewhere'
    """
    from raycse.train.driver import train as run_training

    if corpus is None or isinstance(corpus, (str, os.PathLike)):
        if corpus is not None:  # (a copy: the caller's run is left as it is)
            run = run.resolved({"data.corpus": os.fspath(corpus)})
        corpus = None
    return run_training(run, overwrite=overwrite, storage_path=storage_path, run_name=run_name, source=corpus,
                        callbacks=callbacks)


make_callable(sys.modules[__name__], train)
