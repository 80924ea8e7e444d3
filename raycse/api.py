"""What an extension of raycse may subclass and call, in one module (as Ray keeps what its users subclass in
``ray.train.v2.api``, apart from its internals). Each name is documented where it is defined, with its arguments,
what it returns and raises, and an example that runs (tests/test_api.py runs them, and fails where one lacks them).

- an objective: :class:`Objective` with its knobs :class:`Params` (:func:`positive` checks one), returning a
  :class:`LossOutput`; paired data arrives as :class:`Pair` s; :func:`stack_twice` (two views in one call); the
  contrastive helpers :func:`info_nce`, :func:`info_nce_hard`,
  :func:`cosine_logits` and :func:`gather` (the rows of every worker);
- a grouping strategy: :class:`Strategy`, returning a :class:`GroupOrder`;
- an experiment tracker: :class:`Tracker`, with the run's :class:`Tracking`;
- code at a fit's steps: :class:`Callback`;
- the settings: :class:`RunConfig` (and its sections), and :class:`ConfigError` for a setting an extension refuses.

docs/extending.md walks through an objective, a strategy and a tracker written outside the package.

    >>> from raycse import api
    >>> issubclass(api.Objective, api.torch.nn.Module) and "Strategy" in api.__all__
    True
"""

import torch  # noqa: F401 - (an objective is a torch module)

from raycse.config import DataConfig, GroupingConfig, RunConfig
from raycse.errors import ConfigError
from raycse.grouping.registry import Strategy
from raycse.grouping.strategies import GroupOrder
from raycse.objectives.base import LossOutput, Objective, Pair, Params, positive, stack_twice
from raycse.objectives.contrastive import cosine_logits, gather, info_nce, info_nce_hard
from raycse.train.callbacks import Callback
from raycse.train.tracker import Tracker, Tracking

__all__ = ["Objective", "Params", "LossOutput", "Pair", "positive", "stack_twice", "info_nce", "info_nce_hard", "cosine_logits", "gather",
           "Strategy", "GroupOrder", "Tracker", "Tracking", "Callback", "RunConfig", "DataConfig", "GroupingConfig",
           "ConfigError"]
