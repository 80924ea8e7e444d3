"""What a training worker asks of the framework that runs it, in one place: its rank and the world's size, its
device, its module made data-parallel, each checkpoint reported, and the checkpoint it was handed at a restart.

:class:`RayTrainSession` answers through Ray Train's public API; it is the one raycse runs on. The worker loop
(raycse.train.loop) takes the session as a value, so the same loop, step engine, reporter and checkpointer run
unchanged under another: the tests run them in their own process through a session of one worker whose
checkpoints go to a folder (tests/local_session.py)."""

from __future__ import annotations

from typing import Optional


class RayTrainSession:
    """A Ray Train worker's session (``ray.train.get_context()`` and the calls beside it)."""

    def rank_and_world(self) -> tuple[int, int]:
        import ray.train

        ctx = ray.train.get_context()
        return ctx.get_world_rank(), ctx.get_world_size()

    def device(self):
        """The device Ray gave this worker (a GPU's, or the CPU)."""
        import ray.train.torch

        return ray.train.torch.get_device()

    def prepare_model(self, module, device, ddp_kwargs: Optional[dict]):
        """``module`` on ``device``, under DDP with ``ddp_kwargs`` where there are several workers."""
        import ray.train.torch

        return ray.train.torch.prepare_model(module, move_to_device=device, parallel_strategy_kwargs=ddp_kwargs)

    def report(self, metrics: dict, directory: str, upload_async: bool) -> None:
        """``metrics`` with the checkpoint in ``directory``, which is removed once it reached storage (at once for a
        synchronous upload, later for an asynchronous one)."""
        import ray.train
        from ray.train import CheckpointUploadMode

        mode = CheckpointUploadMode.ASYNC if upload_async else CheckpointUploadMode.SYNC
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory),
                         checkpoint_upload_mode=mode, delete_local_checkpoint_after_upload=True)

    def handed_checkpoint(self):
        """The checkpoint Ray Train restarted this worker with (a ``ray.train.Checkpoint``), or None."""
        import ray.train

        return ray.train.get_checkpoint()
