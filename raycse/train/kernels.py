"""One choice of float32 CPU kernels for the whole fit (raycse.model.onednn): rank 0's, given to every rank, and
recorded in each checkpoint, so that a resumed fit computes as the run it continues did.

oneDNN's and PyTorch's own kernels agree only to float32 rounding, and the probe that chooses between them can go
either way on a busy machine (its verdict is then not cached). Left to each process, two ranks of one fit, or a run
and its restart, could train on different kernels, and a resumed run would not end with the weights an uninterrupted
one ends with (seen: a restarted worker's probe chose oneDNN where the first worker's had not)."""

from __future__ import annotations

import contextlib
from typing import Optional

from raycse.model import onednn

KEY = "cpu_kernels"  # a checkpoint's record of its fit's choice ({"onednn": bool, "why": str}, or None)
KEPT = "; kept from the checkpoint the fit resumed"


def settle(device, dtypes: tuple, recorded: Optional[dict], rank: int, world: int) -> Optional[dict]:
    """The fit's choice, pinned in this process (:func:`raycse.model.onednn.pin`): rank 0's, from the checkpoint it
    resumed (``recorded``) or from its probe, then every rank's (one broadcast where ``world`` > 1). None, and no
    probe, where no float32 linear runs on the CPU (``dtypes``: training's and scoring's autocast types; empty where
    the model never takes oneDNN's path)."""
    verdict = None
    if rank == 0 and onednn.applies(device, *dtypes):
        kept = isinstance(recorded, dict) and {"onednn", "why"} <= set(recorded)  # (older checkpoints: none)
        verdict = {"onednn": bool(recorded["onednn"]), "why": str(recorded["why"]).removesuffix(KEPT) + KEPT} \
            if kept else onednn.choice()
    if world > 1:
        import torch.distributed as dist

        box = [verdict]
        dist.broadcast_object_list(box, src=0)
        verdict = box[0]
    onednn.pin(verdict)
    return verdict


@contextlib.contextmanager
def settled(worker):
    """:func:`settle` for ``worker`` (raycse.train.loop.WorkerRun: its engine, scoring type, resumed checkpoint's
    record, rank and world) while the block runs; nothing stays pinned after it (a worker in a process that goes on,
    as the tests' own do)."""
    e = worker.engine
    dtypes = (e.dtype, worker.reporter.eval_dtype) if e.core.encoder.onednn else ()
    settle(e.device, dtypes, (worker.progress.resumed or {}).get(KEY), worker.rank, worker.world_size)
    try:
        yield
    finally:
        onednn.pin(None)
