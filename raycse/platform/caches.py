"""raycse's per-machine caches: where they live (RAYCSE_CACHE) and JSON files written whole."""

from __future__ import annotations

import json
import os
from pathlib import Path


def cache_dir() -> Path:
    """raycse's per-machine caches (kernel probe, starting scores, fetched models); RAYCSE_CACHE moves it."""
    return Path(os.environ.get("RAYCSE_CACHE", Path.home() / ".cache" / "raycse"))


def checked_cache_dir(sub: str = "") -> Path:
    """``cache_dir() / sub``, refused in one line where it (or the cache itself) exists but is not this user's or
    is writable by others: whoever can write there could plant vectors or models that later runs trust (the
    names in it are predictable)."""
    from raycse.errors import ConfigError

    root = cache_dir()
    for folder in (root, root / sub) if sub else (root,):
        try:
            st = folder.stat()
        except OSError:
            continue  # (not made yet: raycse makes it, as this user)
        uid = os.geteuid()
        problem = (f"is owned by user id {st.st_uid}, not yours ({uid})" if st.st_uid != uid
                   else "is writable by every user" if st.st_mode & 0o002 else "")
        if problem:
            raise ConfigError(f"raycse's cache folder {folder} {problem}, so its files cannot be trusted; set "
                              f"RAYCSE_CACHE to a folder of your own that others cannot write (e.g. chmod 755)")
    return root / sub


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
