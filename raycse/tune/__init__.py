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
    """Run a search, as ``raycse tune`` does: a new one from a :class:`raycse.tune.TuneSettings` (its
    ``space``: a search-space YAML file or a shipped space's name), or, with ``resume`` (an experiment
    directory or URI), an interrupted one continued. Returns (the experiment directory, Ray Tune's
    ``ResultGrid``); :func:`raycse.analyze` reads the directory.

    >>> import raycse
    >>> raycse.tune()
    Traceback (most recent call last):
    ...
    raycse.errors.ConfigError: give exactly one of --space FILE (a new search) or --resume EXP_DIR
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
