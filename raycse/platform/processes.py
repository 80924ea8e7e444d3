"""The processes of a private local Ray: ended with the command, and reaped after a killed one.

A command that started its own Ray (``raycse.platform.ray_session.ensure_ray``) records the processes Ray
started (GCS, raylet, dashboard, ...) in a file of its own in the temporary directory. On its way
out after a signal, :func:`end_own_ray` shuts Ray down and ends what is left of them within a bound.
A command killed before it could (SIGKILL, the OOM killer) leaves the file behind: the next raycse
command on the machine ends the processes it names that still run (the same processes: pid and
start time match) and removes it, as :func:`raycse.platform.staging.sweep_abandoned` does for staging
directories. Linux only (``/proc``); elsewhere these are no-ops.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

from raycse.platform import owners

RECORD_PREFIX = "raycse-ray-procs-"
END_GRACE_S = 5.0  # SIGTERM, then this long, then SIGKILL
END_BOUND_S = 15.0  # every process of the command's Ray is gone within this (tested)


def _stat_fields(pid) -> Optional[list[str]]:
    """The fields of /proc/PID/stat after the command name (state first), or None: no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()  # (the command name may hold spaces)


def start_time(pid: int) -> int:
    """A process's start time in clock ticks (with its pid, what tells it from a later one); 0: gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else 0


def _table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time in clock ticks) of every process, from /proc."""
    out = {}
    for entry in Path("/proc").iterdir() if Path("/proc/self/stat").exists() else ():
        fields = _stat_fields(entry.name) if entry.name.isdigit() else None
        if fields:
            out[int(entry.name)] = (int(fields[1]), int(fields[19]))
    return out


def descendants(pid: int, table: Optional[dict] = None) -> list[tuple[int, int]]:
    """(pid, start time) of every process below ``pid``."""
    table = table if table is not None else _table()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append((p, table[p][1]))
        todo += children.get(p, [])
    return found


def alive(procs: list[tuple[int, int]], table: Optional[dict] = None) -> list[tuple[int, int]]:
    """Those of ``procs`` still running as the same processes (a reused pid has another start time)."""
    table = table if table is not None else _table()
    return [(p, start) for p, start in procs if p in table and table[p][1] == start and not _zombie(p)]


def _zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] == "Z"


def end(procs: list[tuple[int, int]], grace_s: float = END_GRACE_S, bound_s: float = END_BOUND_S) -> list[int]:
    """End ``procs`` and their descendants: SIGTERM to the topmost of them (a parent ends its own
    children in order: ``ray start`` stops its node in ~2 s, where a SIGTERM to every process at once
    took 6), ``grace_s``, then SIGKILL to all that remain; this process's children reaped; at most
    ``bound_s`` in all. Returns the pids still running then."""
    table = _table()
    procs = alive(procs, table)
    procs += [d for p, _ in procs for d in descendants(p, table) if d not in procs]
    pids = {p for p, _ in procs}
    tops = [(p, start) for p, start in procs if table.get(p, (0, 0))[0] not in pids]
    deadline = time.monotonic() + bound_s
    for sig, targets, wait_s in ((signal.SIGTERM, tops, grace_s), (signal.SIGKILL, procs, bound_s)):
        for p, _ in alive(targets):
            try:
                os.kill(p, sig)
            except OSError:
                pass
        until = min(deadline, time.monotonic() + wait_s)
        while alive(procs) and time.monotonic() < until:
            reap_children()
            time.sleep(0.05)
        if not alive(procs):
            break
    reap_children()
    return [p for p, _ in alive(procs)]


def reap_children() -> None:
    """Collect this process's ended children, so none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


_record: dict = {}


def record_own_ray(before: list, stop: Optional[Callable[[], list]] = None) -> None:
    """Write down the processes this command's freshly started Ray runs (called once it is up):
    those below this process now that were not there ``before`` (the caller's own children stay out).
    ``stop`` is how that Ray is ended in order (raycse.platform.private_ray.stop), tried first."""
    if stop is not None:
        _record["stop"] = stop
    procs = [p for p in descendants(os.getpid()) if p not in set(before)]
    if not procs:
        return
    path = Path(tempfile.gettempdir()) / f"{RECORD_PREFIX}{owners.owner_tag()}{uuid.uuid4().hex[:8]}.json"
    try:
        path.write_text(json.dumps(procs))
    except OSError:
        return  # the record only helps a later command after a SIGKILL: never fail a run for it
    _record.update(path=path, procs=procs)


def note_ray_joined() -> None:
    """This command started or connected to Ray (raycse.platform.ray_session.ensure_ray): it leaves it on a signal."""
    _record["joined"] = True


def end_own_ray() -> list[int]:
    """Shut down this command's Ray and end whatever of it is still running within the bound. A Ray the
    process had joined before the command (one calling ``raycse.cli.main``) stays joined."""
    import ray

    procs = list(_record.get("procs", []))
    procs += [d for p, _ in alive(procs) for d in descendants(p)]  # (its workers: below the raylet)
    stop = _record.pop("stop", None)
    if stop is not None:
        try:
            stop()  # (it leaves the driver too)
        except Exception:  # noqa: BLE001 - what remains is ended below either way
            pass
    if _record.pop("joined", False):
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001 - what remains is ended below either way
            pass
    left = end(procs)
    if _record.get("path") is not None and not left:
        _record["path"].unlink(missing_ok=True)
    return left


def forget_own_ray() -> None:
    """The command ended normally (Ray's own exit ends its processes): drop the record."""
    _record.pop("joined", None)
    _record.pop("stop", None)  # (at exit, raycse.platform.private_ray.stop ends it)
    if _record.get("path") is not None:
        _record["path"].unlink(missing_ok=True)


def sweep_killed_rays() -> None:
    """End the Ray processes that killed raycse commands of this machine left running."""
    root = Path(tempfile.gettempdir())
    try:
        records = [p for p in root.iterdir() if p.name.startswith(RECORD_PREFIX)]
    except OSError:
        return
    for path in records:
        owner = owners.abandoned_owner(path.name, RECORD_PREFIX)
        if owner is None:
            continue
        try:
            procs = [tuple(p) for p in json.loads(path.read_text())]
        except (OSError, ValueError, TypeError):
            path.unlink(missing_ok=True)
            continue
        running = alive(procs)
        if running:
            left = end(running)
            print(f"[raycse] ended {len(running) - len(left)} Ray process(es) left by raycse process {owner}, "
                  f"which was killed before it could", file=sys.stderr, flush=True)
        path.unlink(missing_ok=True)
