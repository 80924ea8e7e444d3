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
    """Train a :class:`raycse.config.RunConfig` on Ray Train, as ``raycse train`` does (on the Ray this process
    is connected to, else on ``RAY_ADDRESS``'s, else on a private one it starts and stops).

    Args:
        run: the run's settings (model, data, grouping, objective, train, eval; ``output_dir``: where the model
            goes).
        overwrite: replace an earlier raycse output in ``run.output_dir`` (never a folder raycse did not write).
        corpus: a path or URI (as ``run.data.corpus``), or the data itself: a ``ray.data.Dataset`` or a Hugging
            Face ``datasets.Dataset`` (a ``DatasetDict``: its ``run.data.split``) with the columns ``run.data``
            names (``text_column``, and ``pair_column``... for pairs).
        callbacks: :class:`raycse.train.callbacks.Callback` objects, called on rank 0 at each logged step,
            evaluation and checkpoint.
        storage_path: where Ray Train keeps the checkpoints (``--storage-path``; default: a staging folder removed
            on success), so that the same call resumes after a crash.
        run_name: the run's folder under ``storage_path`` (``--run-name``).

    Returns:
        A ``TrainResult``: ``model_dir`` (the saved model, which ``SentenceTransformer(model_dir)`` and
        ``AutoModel`` load), ``output_dir`` and ``metrics`` (``best`` and ``last``: the checkpoints' scores and
        figures).

    Raises:
        raycse.errors.ConfigError: a bad setting, file, model or output, in one line, before Ray starts.
        raycse.errors.RaycseError: the fit failed (a worker's error, a loss that is not finite, workers that
            did not start in time), in one line; the workers and their resources are released first.

    Bad settings are refused before Ray starts:

    >>> import os, tempfile, raycse
    >>> raycse.train(raycse.RunConfig(), run_name="../elsewhere")
    Traceback (most recent call last):
    ...
    raycse.errors.ConfigError: --run-name must be letters, digits, '-', '_' or '.' (not first), got '../elsewhere'

    Two steps of the shipped all-MiniLM-L6-v2 on 64 sentences:

    >>> work = tempfile.mkdtemp()
    >>> corpus = os.path.join(work, "sentences.txt")
    >>> _ = open(corpus, "w").write("".join(f"Sentence {i} is about topic {i % 7}.\\n" for i in range(64)))
    >>> run = raycse.RunConfig.from_dict({"data": {"corpus": corpus}, "output_dir": os.path.join(work, "out"),
    ...     "model": {"max_length": 16}, "train": {"batch_size": 8, "max_steps": 2}, "eval": {"stsb_dev": "none"}})
    >>> result = raycse.train(run)  # (starts Ray)
    [raycse] driver on ...
    >>> result.metrics["last"]["step"], os.path.basename(result.model_dir)
    (2, 'model')
    >>> from sentence_transformers import SentenceTransformer
    >>> SentenceTransformer(result.model_dir, device="cpu").encode(["a sentence"]).shape
    (1, 384)
    """
    from raycse.train.driver import train as run_training

    if corpus is None or isinstance(corpus, (str, os.PathLike)):
        if corpus is not None:  # (a copy: the caller's run is left as it is)
            run = run.resolved({"data.corpus": os.fspath(corpus)})
        corpus = None
    return run_training(run, overwrite=overwrite, storage_path=storage_path, run_name=run_name, source=corpus,
                        callbacks=callbacks)


make_callable(sys.modules[__name__], train)
