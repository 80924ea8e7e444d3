"""The checkpointer: each checkpoint written and reported to Ray Train through the worker's session (rank 0: the model,
optimizer and schedule; every rank: its random state), and the state a fit resumes from
(chosen by :mod:`raycse.train.checkpoints.choice`). The files' format is :mod:`raycse.train.checkpoints.files`."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Optional

from raycse.grouping.layout import Layout
from raycse.model import onednn
from raycse.platform import object_store
from raycse.platform.staging import private_tempdir
from raycse.train import kernels
from raycse.train.checkpoints import files as ckpt
from raycse.train.checkpoints.choice import choose_checkpoint
from raycse.train.module import export_encoder
from raycse.train.plan import FitPlan
from raycse.train.sharding import is_sharded

CHECKPOINT_RANK = "checkpoint_rank"
log = logging.getLogger("raycse.train")


def checkpoint_rank(score: Optional[float], step: int) -> float:
    """How Ray ranks a checkpoint for keeping: by score, a tie going to the earlier step (Ray keeps
    the newer of equals, so a resumed run's repeated last step evicted an equally good earlier
    best, and the published weights changed); unscored ones below every score, the latest first."""
    return score - 1e-12 * step if score is not None else -1e9 + step


def wait_for_upload(local: Path, step: int, limit_s: float, dest: str) -> None:
    """Wait until the checkpoint of ``step`` reached storage, which Ray says by removing its local
    directory ``local``: one upload at a time, so a slow store slows the run instead of filling
    this node's disk; after ``limit_s`` the run fails naming the store."""
    deadline = time.monotonic() + limit_s
    while local.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the checkpoint of step {step} has not reached {dest} in {limit_s:g} s; check that "
                               "the storage is reachable, or raise train.checkpoint_upload_timeout_s")
        time.sleep(0.05)


class Checkpointer:
    """Rank ``rank``'s checkpoints of ``plan``'s fit, of the state ``engine`` (StepEngine) trains."""

    def __init__(self, plan: FitPlan, rank: int, world_size: int, engine, session):
        self.plan, self.rank, self.world_size, self.engine, self.session = plan, rank, world_size, engine, session
        mode = plan.run.train.checkpoint_upload  # async: copied to storage while training goes on
        self.upload_async = mode == "async" or (mode == "auto" and object_store.is_uri(plan.checkpoint_dir))
        self.seconds, self.uploading = 0.0, None  # the training thread's time in checkpoints; the copy in flight
        self.export = None  # a sharded run's whole model for saving (rank 0; built at the first checkpoint)

    def resume(self, grouping: dict) -> Optional[tuple[dict, str, list]]:
        """Load the furthest whole checkpoint (every rank the same): (its state, its path, the damaged
        ones skipped), or None; the epoch's regrouped layout goes into ``grouping``."""
        chosen, skipped = choose_checkpoint(self.plan.checkpoint_dir, self.rank, self.world_size,
                                            self.session.handed_checkpoint())
        if chosen is None:
            return None
        e = self.engine
        with chosen.as_directory() as d:
            state = ckpt.load(Path(d), e.core, e.opt, e.sched, self.rank)
            grouping["layout"] = Layout.load(Path(d) / ckpt.STATE_DIR)
        grouping["log"] = list(state.get("grouping") or [])
        return state, chosen.path, skipped

    def save(self, metrics: dict, layout, initial: Optional[float]) -> None:
        """Write this step's checkpoint and report it with ``metrics`` (``layout``: the epoch's
        regrouped batches or None; ``initial``: the score before training, kept for a restart)."""
        t0, t = time.perf_counter(), self.plan.run.train
        if self.uploading is not None:
            wait_for_upload(*self.uploading, t.checkpoint_upload_timeout_s, self.plan.checkpoint_dir)
        # a worker killed meanwhile (a stopped trial, a lost node) leaves its directory to the next
        # checkpoint on this machine to remove: it holds the weights and optimizer state
        tmp = private_tempdir("raycse-ckpt-")
        try:
            state, e = {**metrics, "initial": initial, "world_size": self.world_size,
                        kernels.KEY: onednn.pinned()}, self.engine
            ckpt.write_rng(tmp, self.rank)  # (first: each rank's manifest covers its random state)
            if self.rank == 0 and layout is not None:
                layout.save(tmp / ckpt.STATE_DIR)
            if is_sharded(e.core):  # (every rank: its shards, and its part of gathering the whole model)
                if self.export is None:
                    self.export = export_encoder(self.plan.run) if self.rank == 0 else (lambda whole: None)
                ckpt.write_sharded(tmp, e.core, e.opt, e.sched, state, self.rank, self.world_size, self.export)
            elif self.rank == 0:
                ckpt.write(tmp, e.core, e.opt, e.sched, state)
            else:
                ckpt.write_rank_part(tmp, self.rank)
            self.session.report({**metrics, "checkpoint_seconds": self.seconds,
                                 "checkpoint_upload": "async" if self.upload_async else "sync"}, str(tmp),
                                self.upload_async)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if self.upload_async:  # Ray removes it after the copy; the next checkpoint (or the fit's end) waits
            self.uploading = (tmp, int(metrics["step"]))
        else:  # Ray removed it after the copy, unless it skipped the report (a worker lost)
            shutil.rmtree(tmp, ignore_errors=True)
        self.seconds += time.perf_counter() - t0
