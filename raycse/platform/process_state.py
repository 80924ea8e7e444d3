"""A worker process's own state: its seeds, its heap (glibc's malloc settings and trimming), and the
environment a Ray Train worker starts with."""

from __future__ import annotations

import os

# glibc malloc settings for the Train workers. The training loop runs in a worker thread, which
# glibc gives its own arena of 64 MB heaps: each step's activations were mapped, page-faulted in and
# unmapped again. One arena, no trimming and no mmap below 32 MB keep that memory mapped between steps
# (measured: benchmarks/results/speed-cpu.md). Freed memory is still returned after each evaluation
# (release_freed_memory). A variable already set in the environment wins.
TRAIN_WORKER_MALLOC = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                       "MALLOC_TRIM_THRESHOLD_": str(1 << 30), "MALLOC_TOP_PAD_": str(256 << 20)}


def train_worker_env() -> dict:
    """Environment variables for Ray Train worker processes (``worker_runtime_env``)."""
    env = {k: v for k, v in TRAIN_WORKER_MALLOC.items() if k not in os.environ}
    if os.environ.get("RAYCSE_GPU_STAND_IN"):  # (raycse.train.module.worker_device), to workers on any node
        env["RAYCSE_GPU_STAND_IN"] = os.environ["RAYCSE_GPU_STAND_IN"]
    return env


def seed_everything(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def release_freed_memory() -> None:
    """Return freed heap memory to the OS (glibc ``malloc_trim``); a no-op elsewhere.

    Why: after an evaluation pass (large batches up to the model's max length) glibc keeps the
    freed memory fragmented, and the training steps that follow ran slower until it was trimmed.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def return_large_frees(threshold: int = 1 << 20) -> None:
    """Serve allocations of ``threshold`` bytes or more by their own mappings (glibc ``mallopt(M_MMAP_THRESHOLD)``),
    so that freeing one returns it to the OS at once; a no-op elsewhere.

    Why: a sharded (FSDP2) CPU worker gathers and frees each block's whole weights and gradients every step. glibc
    raises its mapping threshold after the first such frees and serves the rest from its heap, which keeps them: a
    2-worker run of a 150M decoder held 3.5 GB resident a worker where its live tensors were 1.3 GB, more than DDP
    (benchmarks/results/speed-cpu.md, "Sharded training").
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, int(threshold))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass
