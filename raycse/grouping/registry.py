"""Name -> grouping strategy, so configs, the CLI and search spaces can name one.

Three ways in, looked up in this order: raycse's own (``random``, ``knn``, ``shingle``, ``cluster``,
``none``: raycse.config.grouping.GROUPINGS); an installed package's entry point in the group
``raycse.groupings``; any importable one by its import path, ``grouping.strategy: my_pkg.module:MyStrategy``
(``--grouping my_pkg.module:MyStrategy``; found as raycse.platform.plugins finds objectives, never in the
working directory). ``examples/projection_groups.py`` is one.

A strategy from outside raycse subclasses :class:`Strategy` (a class, made with no arguments, or an
instance): ``features`` says what its :meth:`~Strategy.order` is given, and the order it returns is
checked to hold every row once.

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

from raycse.config.grouping import GROUPINGS, STRATEGY_GROUP
from raycse.errors import ConfigError
from raycse.grouping import strategies as built_in
from raycse.grouping.strategies import GroupOrder, epoch_rng
from raycse.platform import plugins


class Strategy:
    """Which examples share a batch, one epoch at a time.

    ``features``: what :meth:`order` is given as ``features``: ``"none"`` (None), ``"embeddings"`` (the
    corpus's embeddings by row id, ``(n, d)`` float, from the model being trained: the driver embeds
    before the fit, or each worker before every epoch with ``grouping.regroup_every_epoch``) or
    ``"shingles"`` (an int64 content-word key per row, BSC's shingles)."""

    features: str = "none"

    def order(self, cfg, n: int, seed: int, epoch: int, features: Optional[np.ndarray]) -> GroupOrder:
        """The epoch's group order: every row id in ``range(n)`` once, and the lengths of its consecutive
        groups (:class:`raycse.grouping.strategies.GroupOrder`). ``cfg``: the run's GroupingConfig
        (``group_size`` and the rest); ``seed`` and ``epoch`` seed it (the same pair, the same order)."""
        raise NotImplementedError


class _BuiltIn(Strategy):
    def __init__(self, name: str, order: Callable):
        self.name, self.features, self._order = name, GROUPINGS[name], order

    def order(self, cfg, n, seed, epoch, features):
        return self._order(cfg, n, seed, epoch, features)

    def __repr__(self) -> str:
        return f"<raycse grouping {self.name}>"


BUILT_IN = {s.name: s for s in (
    _BuiltIn("random", lambda cfg, n, seed, epoch, _: built_in.random_order(n, seed, epoch)),
    # the corpus's own order (it was read without its pre-shuffle)
    _BuiltIn("none", lambda cfg, n, seed, epoch, _: GroupOrder(np.arange(n), np.ones(n, dtype=np.int64))),
    _BuiltIn("knn", lambda cfg, n, seed, epoch, x: built_in.knn_order(x, cfg, seed, epoch)),
    _BuiltIn("cluster", lambda cfg, n, seed, epoch, x: built_in.keyed_order(
        built_in.cluster_keys(x, cfg.clusters, cfg.group_size, seed + epoch), cfg.group_size,
        epoch_rng(seed, epoch, 2))),
    _BuiltIn("shingle", lambda cfg, n, seed, epoch, keys: built_in.keyed_order(keys, cfg.group_size,
                                                                               epoch_rng(seed, epoch, 3))),
)}


def get(name: str) -> Strategy:
    """The strategy ``name`` means; one line (ConfigError) for a name that means none."""
    if name in BUILT_IN:
        return BUILT_IN[name]
    found = plugins.load_instance(STRATEGY_GROUP, name, "grouping strategy", Strategy)
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
    return order if strategy is BUILT_IN.get(cfg.strategy) else _checked(cfg.strategy, order, n)


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
