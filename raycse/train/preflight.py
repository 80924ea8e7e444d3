"""Checks of the disks a run writes to, made before Ray starts: a run that would fill a disk is
refused in one line instead of failing after its training.

What a run writes: each checkpoint holds the model's export, every tensor of the module (SG-OPT's
frozen copy included) and the optimizer's two moments, about ``CHECKPOINT_MODEL_COPIES`` times the
model's weights; Ray Train keeps ``train.keep_checkpoints`` of them and writes one more before it
drops the oldest. The published output holds one copy of the model.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from raycse.errors import ConfigError

CHECKPOINT_MODEL_COPIES = 5  # model export + module tensors (up to 2 with SG-OPT's copy) + Adam's 2 moments
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
MB = 1 << 20


def model_bytes(model_path: str) -> int:
    """The bytes of a local model's weight files (0 for a hub name: its size is not known here)."""
    root = Path(model_path)
    if not root.is_dir():
        return 0
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def _existing(path: Path) -> Optional[Path]:
    """``path``, or its nearest ancestor that exists: where it is or would be created."""
    return next((c for c in [path, *path.parents] if c.exists()), None)


def free_bytes(path: Path) -> Optional[int]:
    """Free bytes on the filesystem that ``path`` is or would be created on, or None if none can be asked."""
    where = _existing(path)
    try:
        usage = shutil.disk_usage(where) if where is not None else None
    except OSError:
        return None
    return usage.free if usage and usage.total else None  # (a size of 0: /proc and the like, not a disk)


def _device(path: Path):
    where = _existing(path)
    try:
        return os.stat(where).st_dev if where is not None else str(path)
    except OSError:
        return str(where)


def check_free_space(model_path: str, output: Optional[Path], storage_path: Optional[str], keep: int) -> None:
    """Refuse a run whose output or checkpoints would not fit the free space of their filesystems.
    ``output``: the local output directory (None when it goes to object storage); ``storage_path``:
    a local ``--storage-path``, or None for the default (inside the output's staging directory)."""
    size = model_bytes(model_path)
    if not size:
        return
    storage = Path(storage_path) if storage_path and "://" not in storage_path else (None if storage_path else output)
    demands = [(output, size, f"the model {size / MB:.0f} MB"),
               (storage, (keep + 1) * CHECKPOINT_MODEL_COPIES * size,
                f"{keep + 1} checkpoints of {CHECKPOINT_MODEL_COPIES * size / MB:.0f} MB")]
    places: dict = {}  # filesystem -> [its first path, bytes written there, what they are]
    for path, need, what in demands:
        if path is not None:
            place = places.setdefault(_device(path), [path, 0, []])
            place[1] += need
            place[2].append(what)
    for path, need, what in places.values():
        free = free_bytes(path)
        if free is not None and free < need:
            flag = "--output" if path == output else "--storage-path"
            raise ConfigError(f"{flag} {path}: {free / MB:.0f} MB free on its filesystem, and this run writes about "
                              f"{need / MB:.0f} MB there ({' + '.join(what)}); free space, lower "
                              f"train.keep_checkpoints, or choose another {flag}")
