"""Regrouping inside the running fit: knn / cluster batch orders rebuilt before every epoch by the
training workers themselves, with the weights they hold (grouping.regroup_every_epoch).

Before epoch e each worker embeds its share of the corpus (rows ``rank::world``) in eval mode
without gradients, rank 0 gathers the vectors, builds the epoch's group order and packing (the
same :func:`raycse.grouping.registry.group_order` and :func:`raycse.grouping.batches.pack_epoch` the
driver uses for epoch layouts) and broadcasts the batches, and every rank reads its own batches
(``b % world == rank``) from its copy of the corpus (the one route of :mod:`raycse.grouping.layout`). No fit ends, no checkpoint is reloaded and no
separate embedding pool starts (a new ``TorchTrainer.fit`` per regroup would pay a run's whole
start-up each epoch).

Restarts stay exact: the current epoch's batches travel in every checkpoint (``state/layout.npz``,
covered by its manifest), so a run resumed mid-epoch reads the batches it was training on instead
of regrouping with later weights; one resumed exactly at an epoch boundary regroups with the same
weights the uninterrupted run had there.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from raycse.grouping.batches import pack_epoch
from raycse.grouping.embed import check_room_to_group, column, grouping_prompt_name, vector_dtype
from raycse.grouping.layout import CorpusTable, Layout, epoch_rows
from raycse.grouping.registry import group_order
from raycse.grouping.vectors import normalize


def embed_share(encoder, table: CorpusTable, by: str, rank: int, world: int, max_length: int, batch_size: int,
                dtype: Optional[torch.dtype], prompt_name: Optional[str] = None, rows: Optional[range] = None) -> np.ndarray:
    """This rank's rows (``rank::world`` of ``rows``, by default all), embedded in eval mode with no gradients, after
    the prompt ``prompt_name`` picks (the column's, as training puts it before them)."""
    rows = rows if rows is not None else range(table.n)
    texts = table.values(column(by), rows.start + rank, world, rows.stop)
    with torch.no_grad():
        return encoder.encode(texts, batch_size=batch_size, max_length=max_length, autocast_dtype=dtype,
                              prompt_name=prompt_name)


def kept_dtype(n: int, dim: int, rank: int, world: int, device: torch.device):
    """The dtype the epoch's vectors travel and stay in: float16 (unit rows) where rank 0, which holds them
    all, would give float32 ones more than its share of free memory (:func:`raycse.grouping.embed.vector_dtype`,
    which says so); rank 0's choice is told to every rank, as a collective needs one dtype."""
    kept = vector_dtype(n, dim) if rank == 0 else np.float32
    if world == 1:
        return kept
    import torch.distributed as dist

    half = torch.tensor([int(kept == np.float16)], dtype=torch.int64, device=device)
    dist.broadcast(half, src=0)
    return np.float16 if half.item() else np.float32


def gather_vectors(share: np.ndarray, n: int, rank: int, world: int, device: torch.device) -> Optional[np.ndarray]:
    """Rank 0 gets every row's vector in row order, in the shares' dtype; the others None. Shares differ
    by at most one row: padded to equal shapes, as collectives need."""
    if world == 1:
        return share
    import torch.distributed as dist

    rows = -(-n // world)
    mine = torch.from_numpy(np.ascontiguousarray(share))
    padded = torch.zeros(rows, share.shape[1], dtype=mine.dtype, device=device)
    padded[:len(share)] = mine.to(device)
    parts = [torch.empty_like(padded) for _ in range(world)] if rank == 0 else None
    dist.gather(padded, parts, dst=0)
    if rank != 0:
        return None
    out = np.zeros((n, share.shape[1]), dtype=share.dtype)
    for r in range(world):
        count = len(range(r, n, world))
        out[r::world] = parts[r][:count].cpu().numpy()
        parts[r] = None  # freed once copied: np.zeros takes its pages as they are written, so rank 0 holds ~1 copy
    return out


def broadcast_batches(batches: Optional[np.ndarray], rank: int, world: int, device: torch.device) -> np.ndarray:
    if world == 1:
        return batches
    import torch.distributed as dist

    shape = torch.tensor(batches.shape if rank == 0 else (0, 0), dtype=torch.int64, device=device)
    dist.broadcast(shape, src=0)
    data = (torch.from_numpy(np.ascontiguousarray(batches)).to(device) if rank == 0
            else torch.empty(tuple(shape.tolist()), dtype=torch.int64, device=device))
    dist.broadcast(data, src=0)
    return data.cpu().numpy()


def build_layout(vectors: np.ndarray, grouping, batch_size: int, world: int, seed: int, epoch: int,
                 max_steps: int) -> Layout:
    """Rank 0: the epoch's group order from the gathered vectors, packed into batches (the driver's
    epoch layout, on this process: a Ray task from inside the fit would wait for CPUs the workers hold)."""
    t0 = time.perf_counter()
    order = group_order(replace(grouping, shards=1), len(vectors), seed, epoch, vectors=lambda: vectors)
    packing, info = pack_epoch(order, batch_size, world, max_steps)
    info.update(epoch=epoch, in_fit=True)
    info["seconds"] = time.perf_counter() - t0
    return Layout(epoch, packing.batches, info)


def _collective_device(device: torch.device, world: int) -> torch.device:
    if world > 1:
        import torch.distributed as dist

        if dist.get_backend() == "nccl":  # NCCL moves CUDA tensors only
            return device
    return torch.device("cpu")


def gathered_vectors(encoder, table: CorpusTable, run, rank: int, world: int, device: torch.device,
                     dtype: Optional[torch.dtype], prompt_name: Optional[str], rows: range) -> tuple:
    """Every rank: its share of ``rows`` embedded, the vectors gathered to rank 0. (rank 0's vectors, or None
    elsewhere; the device the collectives use; the seconds embedding took)."""
    t0, g = time.perf_counter(), run.grouping
    if rank == 0:  # it keeps every vector: refused before the embedding, not after it
        check_room_to_group(len(rows), encoder.output_size, g)
    share = embed_share(encoder, table, g.by, rank, world, run.model.max_length, g.embed_batch_size, dtype,
                        prompt_name, rows)
    embed_s = time.perf_counter() - t0
    coll = _collective_device(device, world)
    if kept_dtype(len(rows), share.shape[1], rank, world, coll) == np.float16:
        share = normalize(share).astype(np.float16)  # grouping compares cosines only
    return gather_vectors(share, len(rows), rank, world, coll), coll, embed_s


def regroup(encoder, table: CorpusTable, run, rank: int, world: int, device: torch.device,
            dtype: Optional[torch.dtype], epoch: int, max_steps: int) -> Layout:
    """Every rank: embed this rank's share, gather to rank 0, group there, broadcast the batches."""
    t0 = time.perf_counter()
    vectors, coll, embed_s = gathered_vectors(encoder, table, run, rank, world, device, dtype,
                                              grouping_prompt_name(run.data.prompts, run.grouping.by), range(table.n))
    layout = (build_layout(vectors, run.grouping, run.train.batch_size, world, run.train.seed, epoch, max_steps)
              if rank == 0 else None)
    batches = broadcast_batches(layout.batches if layout is not None else None, rank, world, coll)
    if layout is None:
        return Layout(epoch, batches)
    layout.info.update(embed_seconds=embed_s, seconds=time.perf_counter() - t0)
    return layout


def source_prompt_name(name: str, prompts: Optional[dict], by: str) -> Optional[str]:
    """The prompt a mixture's source ``name`` embeds its grouping column with: its own, as the trained model keeps
    it (raycse.model.encoder.Encoder.add_source_prompts), else the model's default (None)."""
    role = column(by)
    return (name if role == "text" else f"{name}_document") if role in (prompts or {}) else None


def regroup_source(encoder, table: CorpusTable, sub, spec, rank: int, world: int, device: torch.device,
                   dtype: Optional[torch.dtype], epoch: int, steps: int) -> tuple[np.ndarray, Optional[dict]]:
    """Every rank: a mixture's source (``spec``: raycse.train.plan.SourceSpec; ``sub``: its run) regrouped on its own
    rows with the current weights, for ``steps`` steps of ``world`` batches, by the mixture's row ids. A source
    given more steps than its batches make takes its order again, grouped with the next seed (epoch
    ``e + k * train.epochs``), as the driver's layouts do (raycse.train.mixture.sources_batches). (the batches,
    rank 0's grouping record or None)."""
    need = steps * world
    if need == 0:
        return np.zeros((0, sub.train.batch_size), np.int64), None
    t0, rows = time.perf_counter(), range(spec.offset, spec.offset + spec.rows)
    vectors, coll, embed_s = gathered_vectors(encoder, table, sub, rank, world, device, dtype,
                                              source_prompt_name(spec.name, sub.data.prompts, sub.grouping.by), rows)
    batches, info = None, None
    if rank == 0:
        parts, again = [], 0
        while sum(len(p) for p in parts) < need:
            layout = build_layout(vectors, sub.grouping, sub.train.batch_size, world, sub.train.seed,
                                  epoch + again * sub.train.epochs, None)
            parts.append(layout.batches + spec.offset)
            info = info or layout.info
            again += 1
        batches = np.concatenate(parts)[:need]
        info.update(embed_seconds=embed_s, seconds=time.perf_counter() - t0)
    return broadcast_batches(batches, rank, world, coll), info


def regroup_mixture(encoder, table: CorpusTable, run, sources: tuple, fixed: tuple, rank: int, world: int,
                    device: torch.device, dtype: Optional[torch.dtype], epoch: int) -> Layout:
    """Every rank: one epoch of a mixture, each source that regroups in the fit regrouped on its own rows
    (:func:`regroup_source`), the others' batches as the driver grouped them (``fixed``: (each source's batches or
    None, their groupings), raycse.train.prepare.fixed_sources), laid out one source a step."""
    from raycse.train.mixture import epoch_steps, mixed_layout

    subs, (batches, groupings) = run.source_runs(), fixed
    steps = epoch_steps(run, [s.rows for s in sources])
    batches, groupings = list(batches), dict(groupings)
    for i, spec in enumerate(sources):
        if batches[i] is None:
            batches[i], info = regroup_source(encoder, table, subs[spec.name], spec, rank, world, device, dtype,
                                              epoch, int(steps[i]))
            if info is not None:
                groupings[spec.name] = {**info, "in_fit": True}
    return mixed_layout(run, epoch, batches, groupings)


def regroup_epoch(plan, table: CorpusTable, engine, rank: int, world: int, epoch: int, max_steps: int) -> Layout:
    """Every rank: epoch ``epoch`` of ``plan`` (raycse.train.plan.FitPlan) regrouped with the weights ``engine``
    (raycse.train.steps.StepEngine) holds now: the corpus, or a mixture's sources that regroup in the fit beside the
    others' batches from the driver."""
    from raycse.platform.ray_session import fetch

    encoder = engine.core.encoder
    if not plan.sources:
        return regroup(encoder, table, plan.run, rank, world, engine.device, engine.dtype, epoch, max_steps)
    fixed = fetch(plan.fixed_sources, "the sources' batches")[epoch]
    return regroup_mixture(encoder, table, plan.run, plan.sources, fixed, rank, world, engine.device, engine.dtype,
                           epoch)


def say_regrouped(run, layout: Layout) -> None:
    """Rank 0's log line for an epoch regrouped in the fit (a mixture: one for each source regrouped)."""
    import logging

    log = logging.getLogger("raycse.train")
    regrouped = ({name: info for name, info in layout.info["source_groupings"].items() if info.get("in_fit")}
                 if "source_groupings" in layout.info else {"": layout.info})
    for name, info in regrouped.items():
        strategy = run.source_runs()[name].grouping.strategy if name else run.grouping.strategy
        log.info(f"[raycse] epoch {layout.epoch}: {f'source {name}: ' if name else ''}{strategy} regrouped in the "
                 f"fit with the current weights: {info['groups']} groups, mean size {info['mean_group_size']:.2f}, "
                 f"{info['split_groups']} split, {info['seconds']:.1f} s (embedding {info['embed_seconds']:.1f} s)"
                 + (f", kNN {info['knn_method']} recall {info['knn_recall']:.3f}"
                    if info.get("knn_recall") is not None else ""))


def regrouped_rows(build: Callable[[int, int], Layout], table: Callable[[], CorpusTable], run, rank: int,
                   world: int, steps_per_epoch: int, total: int, end: int, start: int, state: dict) -> Iterator[dict]:
    """The loop's batch rows from step ``start`` to ``end``, each epoch regrouped (``build(epoch, max_steps)``: every
    rank, :func:`regroup` or :func:`regroup_mixture`) when the loop asks for its first batch (after the previous
    epoch's last step: the weights are current). ``table``: the corpus (read on the first call); ``state``: the
    loop's {"layout": the resumed epoch's Layout or None, "log": every epoch's record}, updated."""
    for epoch in range(run.train.epochs):
        first = epoch * steps_per_epoch
        if first >= end:
            return
        if min(first + steps_per_epoch, total) <= start:
            continue  # done before the checkpoint this run resumed from
        layout = state.get("layout")
        if layout is None or layout.epoch != epoch:
            layout = build(epoch, total - first)
            state["layout"] = layout
            if rank == 0:
                info = {"epoch": epoch, **layout.info}
                state["log"] = [e for e in state["log"] if e.get("epoch") != epoch] + [info]
                say_regrouped(run, layout)
        yield from epoch_rows(table(), layout, rank, world, first, max(start, first))
