"""Name -> grouping strategy, so configs, the CLI and search spaces can name one.

Three ways in, looked up in this order: raycse's own (``random``, ``knn``, ``shingle``, ``cluster``,
``none``: the classes of raycse.grouping.builtin, named in raycse.config.grouping.STRATEGIES and loaded as the
others are); an installed package's entry point in the group ``raycse.groupings``; any importable one by its import path, ``grouping.strategy: my_pkg.module:MyStrategy``
(``--grouping my_pkg.module:MyStrategy``; found as raycse.platform.plugins finds objectives, never in the
working directory). ``examples/projection_groups.py`` is one.

A strategy from outside raycse subclasses :class:`Strategy` (a class, made with no arguments, or an
instance): ``features`` says what its :meth:`~Strategy.order` is given, ``requires`` the optional packages it
imports (checked before a run starts), and the order it returns is checked to hold every row once.

    >>> import numpy as np
    >>> from raycse.config import GroupingConfig
    >>> class Reversed(Strategy):
    ...     "The file order backwards, in groups of one."
    ...     def order(self, cfg, n, seed, epoch, features):
    ...         return GroupOrder(np.arange(n)[::-1], np.ones(n, dtype=np.int64))
    >>> Reversed().order(GroupingConfig(), 3, 0, 0, None).order.tolist()
    [2, 1, 0]
    >>> get("random").features, get("knn").features
    ('none', 'embeddings')
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from raycse.config.grouping import STRATEGIES, STRATEGY_GROUP
from raycse.errors import ConfigError
from raycse.grouping.strategies import GroupOrder
from raycse.platform import plugins


class Strategy:
    """Which examples share a batch, one epoch at a time. A subclass sets ``features`` and ``requires`` and implements
    ``order``; it is named by import path (``--grouping my_pkg.mod:Cls``) or an installed package's entry point in
    ``raycse.groupings``.

    ``features``: what :meth:`order` is given as ``features``: ``"none"`` (None), ``"embeddings"`` (the
    corpus's embeddings by row id, ``(n, d)`` float, from the model being trained: the driver embeds
    before the fit, or each worker before every epoch with ``grouping.regroup_every_epoch``) or
    ``"shingles"`` (an int64 content-word key per row, BSC's shingles). ``requires``: the optional packages its
    order imports, each with what pip installs it by (``{"faiss": "raycse[grouping]"}``), checked before a run
    starts.

    Args:
        (to ``order``) cfg: the run's GroupingConfig (``group_size`` and the rest); n: the corpus's rows; seed,
            epoch: the same pair gives the same order; features: as ``features`` says.

    Returns:
        (from ``order``) a :class:`~raycse.grouping.strategies.GroupOrder`: every row id in ``range(n)`` once, and
        the lengths of its consecutive groups (a group is never split across batches where it fits one).

    Raises:
        raycse.errors.ConfigError: where the order it returns loses or repeats a row, or its ``features`` or
            ``requires`` are not of the kinds above (one line, before the fit).

    >>> import numpy as np
    >>> from raycse.config import GroupingConfig
    >>> from raycse.grouping.strategies import GroupOrder
    >>> class Pairs(Strategy):
    ...     "Rows two by two in file order."
    ...     def order(self, cfg, n, seed, epoch, features):
    ...         return GroupOrder(np.arange(n), np.full(n // 2, 2))
    >>> Pairs().order(GroupingConfig(), 4, 0, 0, None).groups()
    [array([0, 1]), array([2, 3])]
    """

    features: str = "none"
    requires: dict = {}

    def order(self, cfg, n: int, seed: int, epoch: int, features: Optional[np.ndarray]) -> GroupOrder:
        """The epoch's group order: every row id in ``range(n)`` once, and the lengths of its consecutive
        groups (:class:`raycse.grouping.strategies.GroupOrder`). ``cfg``: the run's GroupingConfig
        (``group_size`` and the rest); ``seed`` and ``epoch`` seed it (the same pair, the same order)."""
        raise NotImplementedError


def get(name: str) -> Strategy:
    """The strategy ``name`` means (raycse's own by its name, as a user's by entry point or import path); one line
    (ConfigError) for a name that means none."""
    found = plugins.load_instance(STRATEGY_GROUP, STRATEGIES.get(name, name), "grouping strategy", Strategy)
    if found is None:  # (GroupingConfig.validate refuses such a name first)
        raise ConfigError(f"unknown grouping strategy {name!r}")
    return found


def group_order(cfg, n: int, seed: int, epoch: int, vectors: Optional[Callable[[], np.ndarray]] = None,
                shingles: Optional[Callable[[], np.ndarray]] = None) -> GroupOrder:
    """The group order of one epoch for ``cfg.strategy``; embeddings/keys are computed on demand (only a
    strategy whose ``features`` names them asks for them)."""
    strategy = get(cfg.strategy)
    source = {"embeddings": vectors, "shingles": shingles}.get(strategy.features)
    order = strategy.order(cfg, n, seed, epoch, source() if source is not None else None)
    return order if cfg.strategy in STRATEGIES else _checked(cfg.strategy, order, n)  # (raycse's own: tested)


def _checked(name: str, got, n: int) -> GroupOrder:
    """A user strategy's order holds every row once, in groups that add up (else batches would repeat or
    leave out rows without a word)."""
    if not isinstance(got, GroupOrder):
        raise ConfigError(f"grouping strategy '{name}' returned {type(got).__name__}, not a GroupOrder")
    order, sizes = np.asarray(got.order), np.asarray(got.sizes)
    whole = len(order) == n and (n == 0 or np.array_equal(np.sort(order), np.arange(n)))
    if not whole or (sizes < 1).any() or int(sizes.sum()) != n:
        raise ConfigError(f"grouping strategy '{name}' returned an order that does not hold each of the {n} rows "
                          f"once in groups adding up to {n} ({len(order)} ids, group sizes summing to "
                          f"{int(sizes.sum())}); return every row id once")
    return GroupOrder(order.astype(np.int64, copy=False), sizes.astype(np.int64, copy=False), dict(got.info))
