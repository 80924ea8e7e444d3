"""Hyperparameter search: Ray Tune + Optuna (TPE) with ASHA, every configuration trained with k seeds.

space (search_spaces/*.yaml) -> search (Tuner, Optuna, ASHA, pre-flight, resume) -> trial (seeds x rungs
of raycse.train.driver.train) -> raycse.analysis (tables and plots).
"""

from raycse.tune.settings import TuneSettings

__all__ = ["TuneSettings", "tune_search", "resume", "load_space", "SearchSpace"]
_LAZY = {"tune_search": "raycse.tune.search", "resume": "raycse.tune.search", "load_space": "raycse.tune.space",
         "SearchSpace": "raycse.tune.space"}


def __getattr__(name: str):
    """Ray Tune loads with the search, not with the package: ``raycse.tune.settings`` (the CLI's flags) stays
    light to import."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'raycse.tune' has no attribute {name!r}")
