"""A checkpoint of several workers is whole only with every worker's part: its random state included.

Found by tests/test_regroup.py's restart (a flake in the whole suite, session 72): a worker killed while the workers
reported a checkpoint left rank 0's part in storage without rank 1's random state; the restarted run resumed from it,
rank 1 said "no RNG state ... fresh seed", and its dropout masks no longer continued the uninterrupted run's.

The checkpointer runs here in the test process, each rank's report merged into one folder as Ray Train's storage
merges the workers' folders."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch


class MergingSession:
    """Ray Train's storage for one checkpoint: each rank's reported folder copied into the same checkpoint folder."""

    def __init__(self, dest: Path):
        self.dest = dest

    def report(self, metrics: dict, directory: str, upload_async: bool) -> None:
        shutil.copytree(directory, self.dest, dirs_exist_ok=True)
        shutil.rmtree(directory)

    def handed_checkpoint(self):
        return None


def _checkpointer(model: Path, storage: Path, rank: int, world: int):
    from raycse.config import RunConfig
    from raycse.train.checkpoints.in_fit import Checkpointer
    from raycse.train.module import build_module
    from raycse.train.plan import FitPlan
    from raycse.train.steps import StepEngine

    run = RunConfig()
    run.model.name_or_path, run.model.max_length, run.train.num_workers = str(model), 16, world
    run = run.resolved()
    plan = FitPlan(run=run, total_steps=10, stop_at=10, steps_per_epoch=10, regroup_in_fit=False,
                   checkpoint_dir=str(storage), threads=1)
    engine = StepEngine(run, build_module(run), torch.device("cpu"), 10)
    return Checkpointer(plan, rank, world, engine, MergingSession(storage / "checkpoint_000000"))


def test_a_two_worker_checkpoint_without_rank_1s_part_is_not_resumed_from(tiny_model, tmp_path, s3_server):
    from raycse.train.checkpoints import files as ckpt

    storage, states = tmp_path / "train", {}
    merged = storage / "checkpoint_000000"
    workers = [_checkpointer(tiny_model, storage, rank, 2) for rank in (0, 1)]
    torch.manual_seed(7)
    torch.rand(5)  # (rank 0's stream, moved on)
    states[0] = torch.get_rng_state()
    workers[0].save({"step": 5, "loss_history": [1.0]}, None, None)

    # rank 1 killed before its report: rank 0's part alone is not a whole checkpoint, and a restart passes over it
    assert "rank 1's part" in ckpt.verify(merged)
    skipped: list = []
    assert ckpt.latest_valid(storage, skipped) is None
    assert skipped == ["checkpoint_000000: no manifest of rank 1's part (the checkpoint was not finished)"]

    torch.manual_seed(8)
    torch.rand(3)
    states[1] = torch.get_rng_state()
    workers[1].save({"step": 5, "loss_history": [1.0]}, None, None)
    assert ckpt.verify(merged) is None
    assert ckpt.latest_valid(storage)[1] == str(merged)
    for rank in (1, 0):  # each rank continues its own stream
        torch.manual_seed(99)
        e = workers[rank].engine
        assert ckpt.load(merged, e.core, e.opt, e.sched, rank)["step"] == 5
        assert torch.equal(torch.get_rng_state(), states[rank]), rank

    # on object storage (moto's S3 on 127.0.0.1): without rank 1's part it is passed over too
    import boto3

    bucket, s3 = s3_server(), boto3.client("s3")
    for name, rank1 in (("checkpoint_000001", True), ("checkpoint_000002", False)):
        for f in (p for p in merged.rglob("*") if p.is_file()):
            if rank1 or not f.name.startswith(("MANIFEST.rank1", "rng_rank1")):
                s3.put_object(Bucket=bucket, Key=f"run/{name}/{f.relative_to(merged)}", Body=f.read_bytes())
    skipped = []
    found = ckpt.whole_checkpoints(f"s3://{bucket}/run", skipped)
    assert [path.rsplit("/", 1)[-1] for _, path in found] == ["checkpoint_000001"]
    assert skipped == ["checkpoint_000002: no readable manifest of rank 1's part (the checkpoint was not finished)"]

    # rank 1's random state cut short in the copy: named
    rng1 = merged / ckpt.STATE_DIR / "rng_rank1.pt"
    rng1.write_bytes(rng1.read_bytes()[:-8])
    assert "rng_rank1.pt" in ckpt.verify(merged)


def test_one_worker_checkpoint_needs_no_other_part(tiny_model, tmp_path):
    from raycse.train.checkpoints import files as ckpt

    storage = tmp_path / "train"
    _checkpointer(tiny_model, storage, 0, 1).save({"step": 3, "loss_history": [1.0]}, None, None)
    assert ckpt.verify(storage / "checkpoint_000000") is None
    assert sorted(p.name for p in (storage / "checkpoint_000000" / ckpt.STATE_DIR).glob("MANIFEST*")) == [
        "MANIFEST.json"]


def test_a_checkpoint_written_before_the_ranks_parts_still_resumes(tiny_model, tmp_path):
    """A checkpoint of an earlier raycse (no worker count in its counters, rank 0's manifest alone) stays whole."""
    from raycse.train.checkpoints import files as ckpt

    worker = _checkpointer(tiny_model, tmp_path, 0, 2)
    e, root = worker.engine, tmp_path / "old"
    ckpt.write(root, e.core, e.opt, e.sched, {"step": 4, "loss_history": [1.0]})  # (what rank 0 wrote then)
    ckpt.write_rng(root, 0)
    assert ckpt.verify(root) is None and ckpt.step_of(root) == 4
