"""The grouping part of a run: how examples are put into batches (hard in-batch negatives)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raycse.config.fields import Section, at_least, knob, one_of

GROUPINGS = ("random", "knn", "shingle", "cluster", "none")


KNN_SEARCH = ("auto", "exact", "cells", "ivf")



@dataclass
class GroupingConfig(Section):
    """How examples are grouped into batches (hard in-batch negatives); see raycse.grouping."""

    strategy: str = knob("random", '--grouping',
                         'batch order: random (a seeded permutation) | knn (groups of nearest neighbours, BSC; '
                         'regrouped each epoch) | shingle (groups sharing a random content word) | cluster (groups of'
                         " one k-means cluster) | none (file order every epoch, not even pre-shuffled: BSC's 'w/o "
                         "shuffle')")
    group_size: int = knob(8, '--group-size',
                           'examples per group for knn/shingle/cluster')  # s (the BSC authors use 7-10)
    neighbours: int = 64  # n: candidates searched per example (knn)
    # exact flat search up to this many examples, the cell join above (auto); or force exact / cells / ivf.
    search: str = "auto"
    exact_threshold: int = 50000
    cell_size: int = 64  # cells: examples per cell (raycse.grouping.cells)
    neighbour_cells: int = 16  # cells: each cell is joined with this many nearest cells, itself included
    nlist: Optional[int] = None  # IVF lists (default ~4 sqrt(N))
    nprobe: int = 16
    shards: int = 1  # database shards searched in parallel Ray tasks, merged per query
    recall_sample: int = 1000  # queries checked against exact search when the search is approximate
    clusters: Optional[int] = None  # k-means k for cluster (default N / max(4 group_size, 40))
    regroup_every_epoch: bool = True  # re-embed with the current model before each epoch (knn, cluster)
    embed_actors: int = 1  # actor pool size for embedding (one GPU each with train.use_gpu)
    embed_batch_size: int = 256
    # BSC Algorithm 2: the shingle is a random subset of t content words (shingle strategy)
    shingle_size: int = 1
    # which text of a pair the keys and embeddings come from: first (q) or second (a); BSC notes
    # "the case of second elements is the same"
    by: str = "first"
    # knn: leave neighbours whose embedding is identical to the example's (duplicates) out of its group
    drop_identical: bool = False

    def validate(self) -> None:
        one_of("grouping.strategy", self.strategy, GROUPINGS)
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
        return self.strategy in ("knn", "cluster")

    @property
    def regroups_in_fit(self) -> bool:
        """The training workers regroup before every epoch with their current weights (raycse.train.regroup)."""
        return self.needs_embeddings and self.regroup_every_epoch
