"""Ray Train: the driver (``driver.py``) builds a :class:`~raycse.train.plan.FitPlan`; every worker runs
``loop.py`` over four parts: the step engine (``steps.py``), the batch source (``batches.py``), the
reporter (``reporter.py``) and the checkpointer (``checkpoints/in_fit.py``; the checkpoints' files and
which one a fit resumes from: ``checkpoints/files.py``, ``checkpoints/choice.py``).

The package is also the Python API's entry point, ``raycse.train(run, corpus=...)``: a package
named like a function shadows the function once it is imported (``raycse.train`` becomes the
package), so the package itself is callable (a module whose class defines ``__call__``).
"""

import os
import sys
import types


def train(run, overwrite: bool = False, corpus=None, callbacks=()):
    """Train a :class:`raycse.config.RunConfig` on Ray Train; returns a ``TrainResult``.

    ``corpus``: a path or URI (as ``run.data.corpus``), or the data itself: a ``ray.data.Dataset`` or
    a Hugging Face ``datasets.Dataset`` (a ``DatasetDict``: its ``run.data.split``) with the columns
    ``run.data`` names (``text_column``, and ``pair_column``... for pairs). ``callbacks``:
    :class:`raycse.train.callbacks.Callback` objects, called on rank 0 at each logged step, evaluation
    and checkpoint."""
    from raycse.train.driver import train as run_training

    if corpus is None or isinstance(corpus, (str, os.PathLike)):
        if corpus is not None:  # (a copy: the caller's run is left as it is)
            run = run.resolved({"data.corpus": os.fspath(corpus)})
        return run_training(run, overwrite=overwrite, callbacks=callbacks)
    return run_training(run, overwrite=overwrite, source=corpus, callbacks=callbacks)


class _CallablePackage(types.ModuleType):
    def __call__(self, run, overwrite: bool = False, corpus=None, callbacks=()):
        return train(run, overwrite=overwrite, corpus=corpus, callbacks=callbacks)


sys.modules[__name__].__class__ = _CallablePackage
