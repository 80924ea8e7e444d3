"""Outputs appear whole or not at all: each is written into a hidden staging directory beside its
destination and renamed over it when complete (one rename on the same filesystem), so a failed or
interrupted run never leaves a half-written model behind.

Torch-free on purpose: ``raycse analyze --export-best`` and Tune's clean-up use it too.
"""

from __future__ import annotations

import uuid
from pathlib import Path


def staging_prefix(name: str) -> str:
    """Name prefix of the staging directories of the output ``name``."""
    return f".{name}.partial-"


def staging_dir(dest: Path) -> Path:
    """A new, empty staging directory beside ``dest``."""
    staging = dest.parent / f"{staging_prefix(dest.name)}{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    return staging
