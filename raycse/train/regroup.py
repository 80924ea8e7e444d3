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
                dtype: Optional[torch.dtype], prompt_name: Optional[str] = None) -> np.ndarray:
    """This rank's rows (``rank::world``), embedded in eval mode with no gradients, after the prompt
    ``prompt_name`` picks (the column's, as training puts it before them)."""
    texts = table.values(column(by), rank, world)
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


def regroup(encoder, table: CorpusTable, run, rank: int, world: int, device: torch.device,
            dtype: Optional[torch.dtype], epoch: int, max_steps: int) -> Layout:
    """Every rank: embed this rank's share, gather to rank 0, group there, broadcast the batches."""
    t0 = time.perf_counter()
    g = run.grouping
    if rank == 0:  # it keeps every vector: refused before the embedding, not after it
        check_room_to_group(table.n, encoder.output_size, g)
    share = embed_share(encoder, table, g.by, rank, world, run.model.max_length, g.embed_batch_size, dtype,
                        grouping_prompt_name(run.data.prompts, g.by))
    embed_s = time.perf_counter() - t0
    coll = _collective_device(device, world)
    if kept_dtype(table.n, share.shape[1], rank, world, coll) == np.float16:
        share = normalize(share).astype(np.float16)  # grouping compares cosines only
    vectors = gather_vectors(share, table.n, rank, world, coll)
    layout = (build_layout(vectors, g, run.train.batch_size, world, run.train.seed, epoch, max_steps)
              if rank == 0 else None)
    batches = broadcast_batches(layout.batches if layout is not None else None, rank, world, coll)
    if layout is None:
        return Layout(epoch, batches)
    layout.info.update(embed_seconds=embed_s, seconds=time.perf_counter() - t0)
    return layout


def regrouped_rows(encoder, table: Callable[[], CorpusTable], run, rank: int, world: int, device: torch.device,
                   dtype: Optional[torch.dtype], steps_per_epoch: int, total: int, end: int, start: int,
                   state: dict) -> Iterator[dict]:
    """The loop's batch rows from step ``start`` to ``end``, each epoch regrouped when the loop asks
    for its first batch (after the previous epoch's last step: the weights are current). ``table``:
    the corpus (read on the first call); ``state``: the loop's {"layout": the resumed epoch's Layout
    or None, "log": every epoch's record}, updated."""
    import logging

    log = logging.getLogger("raycse.train")
    for epoch in range(run.train.epochs):
        first = epoch * steps_per_epoch
        if first >= end:
            return
        if min(first + steps_per_epoch, total) <= start:
            continue  # done before the checkpoint this run resumed from
        layout = state.get("layout")
        if layout is None or layout.epoch != epoch:
            layout = regroup(encoder, table(), run, rank, world, device, dtype, epoch, total - first)
            state["layout"] = layout
            if rank == 0:
                info = layout.info
                state["log"] = [e for e in state["log"] if e.get("epoch") != epoch] + [info]
                log.info(f"[raycse] epoch {epoch}: {run.grouping.strategy} regrouped in the fit with the current "
                         f"weights: {info['groups']} groups, mean size {info['mean_group_size']:.2f}, "
                         f"{info['split_groups']} split, {info['seconds']:.1f} s (embedding "
                         f"{info['embed_seconds']:.1f} s)"
                         + (f", kNN {info['knn_method']} recall {info['knn_recall']:.3f}"
                            if info.get("knn_recall") is not None else ""))
        yield from epoch_rows(table(), layout, rank, world, first, max(start, first))
