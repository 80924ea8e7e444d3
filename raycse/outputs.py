"""Outputs appear whole or not at all: each is written into a hidden staging directory beside its
destination and renamed over it when complete (one rename on the same filesystem), so a failed or
interrupted run never leaves a half-written model behind.

A staging (or private temporary) directory's name says which process of which machine made it, so
the next run beside it removes one whose process was killed before it could (SIGKILL, the OOM
killer): such a directory can hold a whole run's checkpoints.

Torch-free on purpose: ``raycse analyze --export-best`` and Tune's clean-up use it too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import sys
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Optional


def staging_prefix(name: str) -> str:
    """Name prefix of the staging directories of the output ``name``."""
    return f".{name}.partial-"


def _host() -> str:
    # a shared filesystem sees directories of other machines' processes: their pids mean nothing here
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def _owner_tag() -> str:
    return f"{_host()}-{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _abandoned_owner(name: str, prefix: str) -> Optional[int]:
    """The pid of the ended process of this machine that made the directory ``name`` (``prefix``
    followed by its owner tag), or None: not such a name, another machine's, or its process alive
    (a pid reused since only keeps a directory longer, never removes a live one)."""
    if not name.startswith(prefix):
        return None
    host, _, rest = name[len(prefix):].partition("-")
    pid, _, _ = rest.partition("-")
    if host != _host() or not pid.isdigit() or int(pid) == os.getpid():
        return None
    return None if _alive(int(pid)) else int(pid)


def sweep_abandoned(parent: Path, prefix: str) -> list[Path]:
    """Remove the directories ``prefix*`` in ``parent`` whose process was killed before it could."""
    try:
        entries = [e for e in Path(parent).iterdir() if e.name.startswith(prefix)]
    except OSError:
        return []  # no such parent yet, or not readable: nothing of ours there
    removed = []
    for entry in entries:
        pid = _abandoned_owner(entry.name, prefix)
        if pid is not None and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            print(f"[raycse] removed {entry}: left by process {pid}, which ended before it finished",
                  file=sys.stderr, flush=True)
            removed.append(entry)
    return removed


def staging_dir(dest: Path) -> Path:
    """A new, empty staging directory beside ``dest`` (first removing those killed runs left there)."""
    sweep_abandoned(dest.parent, staging_prefix(dest.name))
    staging = dest.parent / f"{staging_prefix(dest.name)}{_owner_tag()}{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    return staging


def private_tempdir(prefix: str) -> Path:
    """A new directory of this process in the system's temporary directory (first removing those of
    ``prefix`` that killed processes left there)."""
    sweep_abandoned(Path(tempfile.gettempdir()), prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{_owner_tag()}"))


@contextmanager
def temporary_dir(prefix: str):
    """:func:`private_tempdir` for a ``with`` block, removed at its end."""
    path = private_tempdir(prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# What marks a directory as raycse's own output: the manifest of a published output
# (raycse.storage), or a run's files (metrics.json, config.yaml and the model's raycse.json).
MANIFEST = "raycse_manifest.json"
RUN_MARKERS = ("metrics.json", "config.yaml", "model/raycse.json")


def is_raycse_output(path: Path) -> bool:
    return (path / MANIFEST).is_file() or all((path / m).is_file() for m in RUN_MARKERS)


def check_replaceable(path: Path, flag: str = "--output") -> None:
    """``--overwrite`` replaces raycse's own output only: a file, or a directory of someone else's
    files, given by mistake (a corpus folder, a home directory) is refused and left as it is."""
    from raycse.errors import ConfigError

    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file, not an output directory; choose another {flag}")
    if path.is_dir() and any(path.iterdir()) and not is_raycse_output(path):
        raise ConfigError(f"{flag} {path} holds files raycse did not write (no {MANIFEST}, or no "
                          f"{', '.join(RUN_MARKERS)}); --overwrite replaces only a raycse output: choose another "
                          f"{flag}")


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
