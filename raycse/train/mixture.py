"""A mixture's data made ready for its fit (``data.sources``): each source read as its own run would read it, the
sources' rows numbered one after the other into one corpus, and each epoch's batches laid out one source a step
(raycse.grouping.mixing).

The workers see one corpus and one layout, as for a single corpus; which source a batch is of, and so which
objective it trains, follows from its row ids (:class:`raycse.train.plan.SourceSpec`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from raycse.config import RunConfig
from raycse.train.plan import SourceSpec, planned_epochs, source_steps


@dataclass
class SourcesStats:
    """Each source's corpus statistics (raycse.data.corpus.CorpusStats), by name."""

    sources: dict = field(default_factory=dict)

    @property
    def decode_replaced(self) -> int:
        return sum(s.decode_replaced for s in self.sources.values())

    def summary(self) -> str:
        return "; ".join(f"{name}: {s.summary()}" for name, s in self.sources.items())

    def repetition_warning(self, dedup: bool):
        found = [(name, s.repetition_warning(dedup)) for name, s in self.sources.items()]
        return "; ".join(f"source {name}: {w}" for name, w in found if w) or None

    def record(self) -> dict:
        return {name: s.record() for name, s in self.sources.items()}


@dataclass
class MixedCorpus:
    """The sources' corpora (raycse.data.dataset.Corpus, by name) and their rows as one numbered corpus: source i's
    row ids start at ``offsets[i]``."""

    corpora: dict
    offsets: np.ndarray
    blocks: list  # every source's Arrow blocks, the row ids offset (ObjectRefs)
    stats: SourcesStats

    @property
    def num_examples(self) -> list[int]:
        """Each source's example count (raycse.train.plan.plan_steps takes them so)."""
        return [c.num_examples for c in self.corpora.values()]


def load_sources(run: RunConfig, load) -> MixedCorpus:
    """Each source of ``run`` read as its own run reads its corpus (``load(run)``: raycse.train.prepare's
    load_run_corpus), then numbered after the sources before it."""
    import ray

    corpora = {name: load(sub) for name, sub in run.source_runs().items()}
    counts = [c.num_examples for c in corpora.values()]
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    shift = ray.remote(scheduling_strategy="DEFAULT")(_shifted)
    blocks = [shift.remote(b, int(o)) if o else b for c, o in zip(corpora.values(), offsets) for b in c.blocks]
    return MixedCorpus(corpora, offsets, blocks, SourcesStats({n: c.stats for n, c in corpora.items()}))


def _shifted(table, offset: int):
    """A numbered block's row ids moved up by ``offset``."""
    import pyarrow.compute as pc

    return table.set_column(table.schema.get_field_index("_id"), "_id", pc.add(table["_id"], offset))


def specs(run: RunConfig, corpus: MixedCorpus) -> tuple:
    """The sources as the workers take them (raycse.train.plan.SourceSpec), in data.sources' order."""
    subs = run.source_runs()
    return tuple(SourceSpec(name, int(o), c.num_examples, subs[name].data.is_pairs,
                            bool(subs[name].data.negative_column))
                 for (name, c), o in zip(corpus.corpora.items(), corpus.offsets))


def epoch_steps(run: RunConfig, counts: list) -> np.ndarray:
    """Each source's steps in one epoch, by data.mixing and the sources' shares (raycse.grouping.mixing)."""
    from raycse.config.sources import explicit_shares
    from raycse.grouping import mixing

    given = explicit_shares(run.data.sources)
    share = mixing.shares(counts, run.data.mixing, [given.get(n) for n in run.data.sources],
                          run.data.mixing_temperature)
    return mixing.planned_steps(source_steps(run, counts), share)


def lay_out_mixture(run: RunConfig, corpus: MixedCorpus, spe: int, total: int, planner) -> tuple[list, list]:
    """The fit's epochs as layouts (raycse.grouping.layout.Layout), every step's batches of one source, and each
    epoch's record: the steps each source got, and each source's grouping. ``planner(run, corpus, say)``: a source's
    epoch planner (raycse.train.prepare.epoch_planner)."""
    out, logs = [], []
    for epoch, (batches, groupings) in sources_batches(run, corpus, spe, total, planner).items():
        layout = mixed_layout(run, epoch, batches, groupings)
        out.append(layout)
        logs.append({"epoch": epoch, "sources": layout.info["sources"], "strategy": run.grouping.strategy})
    return out, logs


def sources_batches(run: RunConfig, corpus: MixedCorpus, spe: int, total: int, planner) -> dict:
    """epoch -> (each source's batches for its steps of that epoch, by the row ids of the mixture, and their
    groupings' records), as the driver groups them before the fit; None for a source that the workers regroup in it
    (its grouping.regroup_every_epoch). A source planned more steps than its batches make takes its order again,
    grouped with the next seed (epoch ``e + k * train.epochs``)."""
    subs, names = run.source_runs(), list(corpus.corpora)
    planners = {n: planner(subs[n], corpus.corpora[n], f"source {n}: ") for n in names
                if not subs[n].grouping.regroups_in_fit}
    steps, w = epoch_steps(run, corpus.num_examples), run.train.num_workers
    out = {}
    for epoch in planned_epochs(run, spe, total):
        batches, groupings = [], {}
        for i, name in enumerate(names):
            if name not in planners:
                batches.append(None)
                continue
            need, parts, again = int(steps[i]) * w, [], 0
            while sum(len(p) for p in parts) < need:
                planned = planners[name](epoch + again * run.train.epochs, epoch * spe, None)
                parts.append(planned.packing.batches + corpus.offsets[i])
                groupings.setdefault(name, {k: v for k, v in planned.info.items() if k != "seconds"})
                again += 1
            batches.append(np.concatenate(parts)[:need] if parts else np.zeros((0, run.train.batch_size), np.int64))
        out[epoch] = (batches, groupings)
    return out


def mixed_layout(run: RunConfig, epoch: int, batches: list, groupings: dict):
    """One epoch of a mixture laid out one source a step (``batches``: each source's, ``train.num_workers`` a step
    of it), the steps in the order data.mixing gives (raycse.grouping.mixing); its info: the steps each source got
    and the sources' groupings."""
    from raycse.grouping import mixing
    from raycse.grouping.layout import Layout

    w = run.train.num_workers
    steps = np.array([len(b) // w for b in batches], dtype=np.int64)
    order = mixing.step_sources(steps, run.data.mixing, run.train.seed, epoch)
    info = {"sources": {n: int(k) for n, k in zip(run.data.sources, steps)}, "source_groupings": groupings}
    return Layout(epoch, mixing.mix(batches, order, w), info)
