"""Hyperparameter search: Ray Tune + Optuna (TPE) with ASHA, every configuration trained with k seeds.

space (search_spaces/*.yaml) -> search (Tuner, Optuna, ASHA, pre-flight, resume) -> trial (seeds x rungs
of raycse.train.driver.train) -> raycse.analysis (tables and plots).
"""

from raycse.tune.search import TuneSettings, resume, tune_search
from raycse.tune.space import SearchSpace, load_space

__all__ = ["TuneSettings", "tune_search", "resume", "load_space", "SearchSpace"]
