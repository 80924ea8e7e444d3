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


def check_writable_file(path: str) -> Path:
    """``path`` as a file an entry point will write at its end: fail before any work if it cannot be."""
    from raycse.errors import RaycseError

    dest = Path(path)
    if dest.is_dir():
        raise RaycseError(f"{dest} is a directory; give a file name to write")
    if not dest.parent.is_dir():
        raise RaycseError(f"directory {dest.parent} does not exist; create it or write {dest.name} elsewhere")
    return dest


def write_text_atomic(dest: Path, text: str) -> None:
    """Write ``text`` to ``dest`` through a hidden file beside it and one rename: whole or not at all."""
    tmp = dest.parent / f"{staging_prefix(dest.name)}{uuid.uuid4().hex[:8]}"
    try:
        tmp.write_text(text)
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
