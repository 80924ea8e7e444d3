"""Collate the next step's batch on a helper thread while the current step trains.

Tokenizing is work the training thread otherwise does between two steps: 22% of its samples for a
batch of 128 with a small model on the CPU, and 20% on an H100 with all-MiniLM-L6-v2
(BENCHMARKS.md, "Collating ahead" and "On a GPU"). A Hugging Face fast tokenizer releases the GIL
while it encodes, so a helper thread hides most of it behind the step.

Two rules keep a run the same as without the helper:
- the helper has its own copy of the tokenizer (a fast tokenizer's Rust state must not be used
  by two threads at once), and the loop waits for it before anything else runs (a checkpoint, an
  evaluation, a regroup), so the helper only ever overlaps the forward and backward;
- objectives whose collate draws random numbers (``collate_draws_random``: LA(SER)^3's elongation
  factors and random anchors) collate in the training thread, since a helper drawing from torch's
  global generator would interleave with dropout's draws and a restarted run would not replay
  its steps exactly.

``train.collate_ahead`` (auto: on GPUs only) decides; benchmarks/collate_ahead.py compares the two.
"""

from __future__ import annotations

import copy
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional


def wanted(setting: str, objective, device_type: str) -> bool:
    """Whether ``objective``'s batches are collated on a helper thread under ``train.collate_ahead``."""
    if objective.collate_draws_random:  # (every Objective says; base.py's default is False)
        return False
    return setting == "true" or (setting == "auto" and device_type == "cuda")


class CollateAhead:
    """``collate(row, tokenizer) -> prepared``, now in this thread or ahead on one helper thread."""

    def __init__(self, collate: Callable, tokenizer, enabled: bool):
        self.collate, self.tokenizer = collate, tokenizer
        self.pool: Optional[ThreadPoolExecutor] = None
        if enabled:
            self.helper_tokenizer = copy.deepcopy(tokenizer)
            self.pool = ThreadPoolExecutor(1, thread_name_prefix="raycse-collate")

    @property
    def enabled(self) -> bool:
        return self.pool is not None

    def now(self, row):
        return self.collate(row, self.tokenizer)

    def submit(self, row) -> Future:
        return self.pool.submit(self.collate, row, self.helper_tokenizer)

    def __enter__(self) -> "CollateAhead":
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:  # a batch in flight is a bounded tokenizer call: wait for it
            self.pool.shutdown(wait=True)
