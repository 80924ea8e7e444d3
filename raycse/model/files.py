"""A model folder's files, checked before anything loads them (torch-free: ``raycse analyze --export-best`` checks
a trial's model too): only regular files inside the folder, JSON that parses, safetensors weights whose header
and length agree, and the digests raycse recorded when it wrote the folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from raycse.errors import ModelError


def _safetensors_problem(path: Path) -> Optional[str]:
    """What is wrong with a safetensors file's header and length (a copy cut short), or None."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"{size} bytes: shorter than its header"
            n = int.from_bytes(head, "little")
            if n > size - 8:
                return f"{size} bytes: its header claims {n}"
            header = json.loads(fh.read(n))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return "unreadable header"
    if 8 + n + end > size:
        return f"{size} bytes where its header needs {8 + n + end}"
    return None


def check_model_files(path: Path, what: str = "model") -> None:
    """Refuse, in one line and before any work (not a traceback from a Ray worker, an actor retried for ever, or
    a read that never returns): a model folder with anything but regular files and links inside it
    (:func:`raycse.platform.folders.entries`: a FIFO, a link out of the folder), damaged JSON files or
    safetensors weights, or files that no longer match the digests raycse recorded when it wrote them."""
    from raycse.platform.folders import check_digests, entries

    for rel, f in entries(path, what):
        if rel.count("/") > 1 or f.suffix not in (".json", ".safetensors"):
            continue
        if f.suffix == ".json":
            try:
                json.loads(f.read_text(encoding="utf-8"))
                continue
            except (ValueError, UnicodeDecodeError):
                problem = "not valid JSON"
        else:
            problem = _safetensors_problem(f)
            if problem is None:
                continue
        raise ModelError(f"{what} file {path / rel} is damaged ({problem}); copy or save the {what} again")
    check_digests(path, what)
