"""Ray Tune's own W&B logger callback, with logging actors that return only once W&B has written the
trial's run to disk.

Ray's logging actor's ``run`` ends at ``wandb.finish()``, and the callback kills the actor as soon as
``run`` returns (at the experiment's end without any wait). ``finish`` returns before W&B's service
process (``wandb-core``, a child of the actor's process) has closed the run's stream, and Ray ends a
killed worker's child processes with it: a run's last records (its history, its exit) were lost when
the service was slower than the kill, as happens under load.
``wandb.teardown()`` waits for the service process to exit, which closes every stream first.
"""

from __future__ import annotations

import sys

from ray.air.integrations.wandb import WandbLoggerCallback

from raycse.platform import compat

_RAYS_ACTOR = compat.wandb_logging_actor()  # None where Ray's callback takes no other actor class


class FlushingWandbLoggerCallback(WandbLoggerCallback):
    """``WandbLoggerCallback`` whose trials' runs are complete on disk (or uploaded) when their logging
    actors end. (Where Ray's callback has no hook for its actor class, it is Ray's callback as it is.)"""

    def __del__(self):
        # At interpreter exit Ray's ``__del__`` reads module globals that are already gone (``ray`` is None)
        # and prints an AttributeError after every tune run; the experiment's end has stopped the actors,
        # and Ray's own shutdown ends whatever is left.
        if not sys.is_finalizing():
            super().__del__()


if _RAYS_ACTOR is not None:
    import wandb

    class _FlushingLoggingActor(_RAYS_ACTOR):
        def run(self):
            super().run()
            try:
                wandb.teardown()  # W&B's own API: returns when W&B's service process has written everything and exited
            except SystemExit:  # (teardown exits with the service's own error code: nothing more to wait for)
                pass

    compat.use_wandb_logging_actor(FlushingWandbLoggerCallback, _FlushingLoggingActor)
