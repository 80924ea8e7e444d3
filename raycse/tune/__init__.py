"""Hyperparameter search: Ray Tune + Optuna (TPE) with ASHA, every configuration trained with k seeds.

space (search_spaces/*.yaml) -> search (Tuner, Optuna, ASHA, pre-flight, resume) -> trial (seeds x rungs
of raycse.train.driver.train) -> raycse.analysis (tables and plots).

The package is also the Python API's ``raycse.tune(settings)``: callable, as ``raycse.train`` is
(raycse.platform.callable_package). Its names load on first use: ``import raycse`` stays light.
"""

import os
import sys

from raycse.platform.callable_package import make_callable

__all__ = ["TuneSettings", "tune_search", "resume", "load_space", "SearchSpace"]
_LAZY = {"TuneSettings": "raycse.tune.settings", "tune_search": "raycse.tune.search", "resume": "raycse.tune.search",
         "load_space": "raycse.tune.space", "SearchSpace": "raycse.tune.space"}


def tune(settings=None, storage_path: str = "outputs/tune", name=None, resume=None):
    """Run a search, as ``raycse tune`` does: a new one, or an interrupted one continued.

    Args:
        settings: a :class:`raycse.tune.TuneSettings` (its ``space``: a search-space YAML file or a shipped
            space's name; seeds, rungs, searcher, scheduler, goals); None with ``resume``.
        storage_path: where the experiment's folder goes (a path or an object-store URI).
        name: the experiment's folder under ``storage_path`` (default: the space's name and the time).
        resume: an interrupted experiment's folder or URI, continued where it stopped (instead of ``settings``).

    Returns:
        (the experiment's folder, Ray Tune's ``ResultGrid``); :func:`raycse.analyze` reads the folder.

    Raises:
        raycse.errors.ConfigError: a bad setting, space, model or corpus, or a trial the cluster can never hold,
            in one line, before Ray starts where it can be told then.

    >>> import os, tempfile, raycse
    >>> raycse.tune()
    Traceback (most recent call last):
    ...
    raycse.errors.ConfigError: give exactly one of --space FILE (a new search) or --resume EXP_DIR

    One configuration of the learning rate, one seed, two steps of the shipped all-MiniLM-L6-v2, scored on three
    STS-B-style pairs (tab-separated: genre, file, year, id, score, the two sentences):

    >>> work = tempfile.mkdtemp()
    >>> corpus, dev = os.path.join(work, "sentences.txt"), os.path.join(work, "sts-dev.csv")
    >>> _ = open(corpus, "w").write("".join(f"Sentence {i} is about topic {i % 7}.\\n" for i in range(64)))
    >>> pairs = [("A man plays a guitar.", 4.6), ("A man sells a car.", 0.8), ("A man tunes a guitar.", 3.2)]
    >>> _ = open(dev, "w").write("".join(f"g\\tf\\t2012\\t{i}\\t{score}\\t{a}\\tA man is playing the guitar.\\n"
    ...                                  for i, (a, score) in enumerate(pairs)))
    >>> space = os.path.join(work, "space.yaml")
    >>> _ = open(space, "w").write(f"run: {{data: {{corpus: {corpus}}}, model: {{max_length: 16}}, "
    ...     f"train: {{batch_size: 8, max_steps: 2}}, eval: {{stsb_dev: {dev}}}}}\\n"
    ...     f"search: {{lr: {{loguniform: [1.0e-5, 1.0e-4]}}}}\\n")
    >>> settings = raycse.TuneSettings(space=space, num_samples=1, seeds=[0], rungs=1)
    >>> exp, results = raycse.tune(settings, os.path.join(work, "tune"), "demo")  # (starts Ray)
    [raycse] ...
    >>> os.path.basename(exp), len(results), results[0].error
    ('demo', 1, None)
    """
    from raycse.errors import ConfigError

    if (settings is None) == (resume is None):
        raise ConfigError("give exactly one of --space FILE (a new search) or --resume EXP_DIR")
    from raycse.tune import search

    if resume is not None:
        return search.resume(resume)
    import dataclasses

    from raycse.config import recipe

    settings = dataclasses.replace(settings, space=recipe("search_spaces", os.fspath(settings.space)))
    return search.tune_search(settings, storage_path, name)


def __getattr__(name: str):
    """Ray Tune loads with the search, not with the package: ``raycse.tune.settings`` (the CLI's flags) stays
    light to import."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'raycse.tune' has no attribute {name!r}")


make_callable(sys.modules[__name__], tune)
