"""Where a fit resumes from: the furthest whole checkpoint among the one Ray Train hands the worker
and the furthest in the run's storage, every rank agreeing; damaged ones are passed over by name."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from raycse.train.checkpoints import files as ckpt

log = logging.getLogger("raycse.train")


def latest_in_storage(run_dir: Optional[str], rank: int, world_size: int) -> tuple[Optional[str], list]:
    """The furthest whole checkpoint in the run's storage as rank 0 sees it, shared with every rank,
    and the damaged ones rank 0 skipped. Why: after a worker (or its node) is lost, Ray Train restarts
    with the latest checkpoint its controller registered, which can lag the uploads (a node removed
    right after two checkpoints reached S3 restarted the run from step 0); a restarted driver has none."""
    import torch.distributed as dist

    path, skipped = None, []
    if run_dir and rank == 0:
        found = ckpt.latest_valid(run_dir, skipped)
        path = found[1] if found else None
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        box = [path]
        dist.broadcast_object_list(box, src=0)
        path = box[0]
    return path, skipped


def choose_checkpoint(run_dir: Optional[str], rank: int, world_size: int, handed=None) -> tuple[Optional[object], list]:
    """The furthest whole checkpoint among the one Ray Train handed the worker (``handed``) and the furthest in
    storage (a ``ray.train.Checkpoint``, or None), and the damaged ones passed over ("name: problem")."""
    import ray.train

    candidates = [c for c in (handed,) if c is not None]
    found, skipped = latest_in_storage(run_dir, rank, world_size)
    if found:
        candidates.append(ray.train.Checkpoint(found))
    chosen = None
    for cand in candidates:
        with cand.as_directory() as d:
            problem = ckpt.verify(Path(d))
            if problem is not None:
                log.warning(f"[raycse] skipping checkpoint {cand.path}: {problem}")
                skipped.append(f"{Path(cand.path).name}: {problem}")
            elif chosen is None or ckpt.step_of(Path(d)) > chosen[0]:
                chosen = (ckpt.step_of(Path(d)), cand)
    return (chosen[1] if chosen else None), skipped
