"""How many steps a run takes and which epochs hold them: pure arithmetic on the config.

Kept apart from the driver (which imports torch, transformers and Ray Train) because a Tune trial
needs the step count for its rung ends and should not pay ~1.5 s of imports for it.
"""

from __future__ import annotations

from raycse.config import RunConfig
from raycse.errors import DataError


def plan_steps(run: RunConfig, num_examples: int) -> tuple[int, int]:
    """(steps per epoch, total steps) of ``run`` on a corpus of ``num_examples``."""
    t = run.train
    spe = (num_examples // t.batch_size) // t.num_workers
    if spe == 0:
        raise DataError(f"corpus has {num_examples} usable examples, fewer than one global batch "
                        f"({t.batch_size} x {t.num_workers} workers); lower --batch-size or add text")
    return spe, min(spe * t.epochs, t.max_steps or spe * t.epochs)


def planned_epochs(run: RunConfig, steps_per_epoch: int, total: int) -> list[int]:
    """The epochs that have steps (``max_steps`` may end the run early); all run in one fit."""
    return [e for e in range(run.train.epochs) if e * steps_per_epoch < total]
