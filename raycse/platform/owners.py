"""Names that carry their maker: a staging directory's, a private temporary directory's or a record file's
name holds a hash of the host and the pid of the process that made it, so a later run on the same
machine can tell one whose process was killed (SIGKILL, the OOM killer) from one still in use, and
never touches another machine's (a shared filesystem sees them too)."""

from __future__ import annotations

import hashlib
import os
import socket
from typing import Optional


def host() -> str:
    # a shared filesystem sees directories of other machines' processes: their pids mean nothing here
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def owner_tag() -> str:
    return f"{host()}-{os.getpid()}-"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def owner(name: str, prefix: str) -> Optional[tuple[str, int]]:
    """(host hash, pid) of the process that made ``name`` (``prefix`` followed by its owner tag), or
    None for a name raycse does not make."""
    if not name.startswith(prefix):
        return None
    made_on, _, rest = name[len(prefix):].partition("-")
    pid = rest.partition("-")[0]
    return (made_on, int(pid)) if pid.isdigit() else None


def abandoned_owner(name: str, prefix: str) -> Optional[int]:
    """The pid of the ended process of this machine that made the directory ``name`` (``prefix``
    followed by its owner tag), or None: not such a name, another machine's, or its process alive
    (a pid reused since only keeps a directory longer, never removes a live one)."""
    made_by = owner(name, prefix)
    if made_by is None or made_by[0] != host() or made_by[1] == os.getpid():
        return None
    return None if alive(made_by[1]) else made_by[1]
