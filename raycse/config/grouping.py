"""The grouping part of a run: how examples are put into batches (hard in-batch negatives)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raycse.config.fields import Section, at_least, detail, knob, one_of
from raycse.errors import ConfigError
from raycse.platform import plugins

# raycse's own strategies: each name's class (raycse.grouping.builtin), loaded as an installed package's or a user's
# is (raycse.platform.plugins); the class says what it is given (features) and what it imports (requires)
STRATEGIES = {"random": "raycse.grouping.builtin:Random", "knn": "raycse.grouping.builtin:Knn",
              "shingle": "raycse.grouping.builtin:Shingle", "cluster": "raycse.grouping.builtin:Cluster",
              "none": "raycse.grouping.builtin:FileOrder"}
FEATURES = ("none", "embeddings", "shingles")
STRATEGY_GROUP = "raycse.groupings"  # the entry-point group of installed packages' strategies

KNN_SEARCH = ("auto", "exact", "cells", "ivf")


def strategy_of(name: str):
    """The strategy ``name`` means, as its module gives it (a Strategy subclass or an instance): raycse's own by its
    name (:data:`STRATEGIES`), a user's by entry point or import path; checked to declare what a Strategy does."""
    found = plugins.load(STRATEGY_GROUP, STRATEGIES.get(name, name), "grouping strategy")
    if found is None:
        raise ConfigError(f"grouping.strategy must be one of {', '.join(STRATEGIES)}, or your own as "
                          f"my_pkg.module:MyStrategy (raycse.grouping.registry.Strategy); got {name!r}")
    if not callable(getattr(found, "order", None)):
        raise ConfigError(f"grouping strategy '{name}' is {found!r}, not a grouping strategy; name a subclass of "
                          f"raycse.grouping.registry.Strategy (or an instance of one)")
    features = getattr(found, "features", None)
    if features not in FEATURES:
        raise ConfigError(f"grouping strategy '{name}' has features {features!r}; a Strategy's features are one "
                          f"of {', '.join(FEATURES)}")
    requires = getattr(found, "requires", None) or {}
    if not isinstance(requires, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in requires.items()):
        raise ConfigError(f"grouping strategy '{name}' has requires {requires!r}; a Strategy's requires maps each "
                          f"module it imports to what pip installs it by, e.g. {{'faiss': 'raycse[grouping]'}}")
    return found


def strategy_features(name: str) -> str:
    """What strategy ``name`` groups by (:data:`FEATURES`)."""
    return strategy_of(name).features


def strategy_requires(name: str) -> dict:
    """The optional modules strategy ``name`` imports, each with what pip installs it by."""
    return dict(getattr(strategy_of(name), "requires", None) or {})


@dataclass
class GroupingConfig(Section):
    """How examples are grouped into batches (hard in-batch negatives): the ``grouping`` section of a run, what a
    :class:`raycse.grouping.registry.Strategy`'s ``order`` is given as ``cfg``.

    Args:
        strategy: random, knn, shingle, cluster, none, or your own (``my_pkg.module:MyStrategy``); group_size:
            examples a group; the other fields: ``raycse train --help``.

    Returns:
        ``needs_embeddings`` and ``regroups_in_fit`` say what the strategy asks of the fit.

    Raises:
        raycse.errors.ConfigError: from ``validate``: an unknown strategy or a value out of range, one line.

    >>> g = GroupingConfig(strategy="knn", group_size=4)
    >>> g.validate(); g.needs_embeddings, g.regroups_in_fit
    (True, True)
    """

    strategy: str = knob("random", '--grouping',
                         'batch order: random (a seeded permutation) | knn (groups of nearest neighbours, BSC; '
                         'regrouped each epoch) | shingle (groups sharing a random content word) | cluster (groups of'
                         " one k-means cluster) | none (file order every epoch, not even pre-shuffled: BSC's 'w/o "
                         "shuffle') | MODULE:CLASS (your own raycse.grouping.registry.Strategy, or an installed "
                         "package's by its entry-point name)")
    group_size: int = knob(8, '--group-size',
                           'examples per group for knn/shingle/cluster')  # s (the BSC authors use 7-10)
    neighbours: int = detail(64, 'knn: candidates searched per example')
    search: str = detail("auto",
                         'knn search: auto (exact up to grouping.exact_threshold examples, the cell join above) | '
                         'exact | cells | ivf')
    exact_threshold: int = detail(50000, 'knn: exact search up to this many examples (grouping.search auto)')
    cell_size: int = detail(64, 'cells: examples per cell')
    neighbour_cells: int = detail(16, 'cells: each cell is joined with this many nearest cells, itself included')
    nlist: Optional[int] = detail(None, 'ivf: inverted lists (default ~4 sqrt(N))')
    nprobe: int = detail(16, 'ivf: lists searched per query')
    shards: int = detail(1, 'knn: database shards searched in parallel Ray tasks, merged per query')
    recall_sample: int = detail(1000,
                                'knn: queries checked against exact search when the search is approximate (0: none)')
    clusters: Optional[int] = detail(None, 'cluster: the k of k-means (default N / max(4 group_size, 40))')
    regroup_every_epoch: bool = detail(True,
                                       'knn, cluster: re-embed with the current weights before each epoch, inside the'
                                       ' fit')
    embed_actors: int = detail(1,
                               'actors embedding the corpus for grouping (with --use-gpu, a GPU or --gpus-per-worker '
                               'each)')
    embed_batch_size: int = detail(256, 'sentences per embedding call when grouping')
    shingle_size: int = detail(1, "shingle: content words in a shingle (t of BSC's Algorithm 2)")
    by: str = detail("first", 'which text of a pair groups are keyed on: first | second (BSC: the same either way)')
    drop_identical: bool = detail(False,
                                  "knn: leave neighbours with an identical embedding (duplicates) out of an example's"
                                  ' group')

    def validate(self) -> None:
        strategy_features(self.strategy)
        one_of("grouping.search", self.search, KNN_SEARCH)
        at_least("grouping.group_size", self.group_size, 2)
        at_least("grouping.neighbours", self.neighbours, 1)
        at_least("grouping.exact_threshold", self.exact_threshold, 1)
        if self.nlist is not None:
            at_least("grouping.nlist", self.nlist, 1)
        at_least("grouping.nprobe", self.nprobe, 1)
        at_least("grouping.cell_size", self.cell_size, 1)
        at_least("grouping.neighbour_cells", self.neighbour_cells, 1)
        at_least("grouping.shards", self.shards, 1)
        at_least("grouping.recall_sample", self.recall_sample, 0)
        if self.clusters is not None:
            at_least("grouping.clusters", self.clusters, 1)
        at_least("grouping.embed_actors", self.embed_actors, 1)
        at_least("grouping.embed_batch_size", self.embed_batch_size, 1)
        at_least("grouping.shingle_size", self.shingle_size, 1)
        one_of("grouping.by", self.by, ("first", "second"))

    @property
    def needs_embeddings(self) -> bool:
        return strategy_features(self.strategy) == "embeddings"

    @property
    def regroups_in_fit(self) -> bool:
        """The training workers regroup before every epoch with their current weights (raycse.train.regroup)."""
        return self.needs_embeddings and self.regroup_every_epoch
