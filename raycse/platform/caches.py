"""raycse's per-machine caches: where they live (RAYCSE_CACHE) and JSON files written whole."""

from __future__ import annotations

import json
import os
from pathlib import Path


def cache_dir() -> Path:
    """raycse's per-machine caches (kernel probe, starting scores, fetched models); RAYCSE_CACHE moves it."""
    return Path(os.environ.get("RAYCSE_CACHE", Path.home() / ".cache" / "raycse"))


def read_json_cache(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def write_json_cache(path: Path, cache: dict) -> None:
    """Whole or not at all (concurrent writers can only lose an entry); a read-only home is no error:
    what was computed still serves this process."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        tmp.replace(path)
    except OSError:
        pass


def model_stamp(model_path: str) -> list:
    """What a cached result of a model depends on: its resolved path and each file's size and mtime (a hub
    name resolved from the HF cache: its name, which pins the revision in use)."""
    root = Path(model_path)
    if not root.is_dir():
        return [model_path]
    return [str(root.resolve()), sorted([str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns]
                                        for p in root.rglob("*") if p.is_file())]
