"""Outputs appear whole or not at all: each is written into a hidden staging directory beside its
destination and renamed over it when complete (one rename on the same filesystem), so a failed or
interrupted run never leaves a half-written model behind.

A staging (or private temporary) directory's name says which process of which machine made it, so
the next run beside it removes one whose process was killed before it could (SIGKILL, the OOM
killer): such a directory can hold a whole run's checkpoints.

Torch-free on purpose: ``raycse analyze --export-best`` and Tune's clean-up use it too.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from raycse.errors import RaycseError
from raycse.platform import owners
from raycse.platform.folders import MANIFEST


def staging_prefix(name: str) -> str:
    """Name prefix of the staging directories of the output ``name``."""
    return f".{name}.partial-"


def sweep_abandoned(parent: Path, prefix: str) -> list[Path]:
    """Remove the directories ``prefix*`` in ``parent`` whose process was killed before it could."""
    try:
        entries = [e for e in Path(parent).iterdir() if e.name.startswith(prefix)]
    except OSError:
        return []  # no such parent yet, or not readable: nothing of ours there
    removed = []
    for entry in entries:
        pid = owners.abandoned_owner(entry.name, prefix)
        if pid is not None and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            print(f"[raycse] removed {entry}: left by process {pid}, which ended before it finished",
                  file=sys.stderr, flush=True)
            removed.append(entry)
    return removed


def live_stagings(parent: Path, prefix: str) -> list[Path]:
    """The directories ``prefix*`` in ``parent`` that a process still running made (or another machine's
    process, whose life cannot be seen from here)."""
    try:
        entries = [e for e in Path(parent).iterdir() if e.name.startswith(prefix) and e.is_dir()]
    except OSError:
        return []
    live = []
    for entry in entries:
        owner = owners.owner(entry.name, prefix)
        if owner is not None and (owner[0] != owners.host() or owners.alive(owner[1])):
            live.append(entry)
    return sorted(live)


def staging_dir(dest: Path) -> Path:
    """A new, empty staging directory beside ``dest`` (first removing those killed runs left there),
    noted in the temporary directory so that the next raycse command on this machine removes it if
    this process is killed before it can (:func:`sweep_killed_stagings`), whatever output it then writes
    (a raycse command's; elsewhere the next run beside it does)."""
    sweep_abandoned(dest.parent, staging_prefix(dest.name))
    staging = dest.parent / f"{staging_prefix(dest.name)}{owners.owner_tag()}{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    _note_staging(staging, staging_prefix(dest.name))
    return staging


STAGING_RECORD_PREFIX = "raycse-staging-"
_noted: list[Path] = []


def _note_staging(staging: Path, prefix: str) -> None:
    from raycse.platform import interrupts

    if not interrupts.installed():  # a raycse command's own process (which forgets its records as it ends); a Tune
        return                      # trial's stagings are swept beside their output, as before
    record = Path(tempfile.gettempdir()) / f"{STAGING_RECORD_PREFIX}{owners.owner_tag()}{uuid.uuid4().hex[:8]}.json"
    try:
        record.write_text(json.dumps({"path": str(staging.resolve()), "prefix": prefix}))
    except OSError:
        return  # the record only helps after a SIGKILL: never fail a run for it
    _noted.append(record)


def forget_stagings() -> None:
    """The command ends (its staging directories published or removed on the way out): drop its records."""
    while _noted:
        _noted.pop().unlink(missing_ok=True)


def sweep_killed_stagings() -> list[Path]:
    """Remove the staging directories that killed raycse processes of this machine left, wherever they
    are: only a directory whose own name says that same ended process made it (a record pointing
    anywhere else removes nothing)."""
    removed = []
    try:
        records = [p for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(STAGING_RECORD_PREFIX)]
    except OSError:
        return removed
    for record in records:
        owner = owners.abandoned_owner(record.name, STAGING_RECORD_PREFIX)
        if owner is None:
            continue
        try:
            noted = json.loads(record.read_text())
            staging, prefix = Path(noted["path"]), str(noted["prefix"])
        except (OSError, ValueError, TypeError, KeyError):
            record.unlink(missing_ok=True)
            continue
        if (prefix.startswith(".") and prefix.endswith(".partial-") and staging.name.startswith(prefix)
                and owners.owner(staging.name, prefix) == (owners.host(), owner)
                and staging.is_dir() and not staging.is_symlink()):
            shutil.rmtree(staging, ignore_errors=True)
            print(f"[raycse] removed {staging}: left by process {owner}, which ended before it finished",
                  file=sys.stderr, flush=True)
            removed.append(staging)
        record.unlink(missing_ok=True)
    return removed


def private_tempdir(prefix: str) -> Path:
    """A new directory of this process in the system's temporary directory (first removing those of
    ``prefix`` that killed processes left there)."""
    sweep_abandoned(Path(tempfile.gettempdir()), prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{owners.owner_tag()}"))


@contextmanager
def temporary_dir(prefix: str):
    """:func:`private_tempdir` for a ``with`` block, removed at its end."""
    path = private_tempdir(prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# What marks a directory as raycse's own output: the manifest of a published output (MANIFEST: an
# object-store publish's, or an export's digests), or a run's files (metrics.json, config.yaml and the model's raycse.json).
RUN_MARKERS = ("metrics.json", "config.yaml", "model/raycse.json")
EXPORT_RECORD = "raycse_export.json"  # what marks a folder raycse export wrote


def is_raycse_output(path: Path) -> bool:
    return ((path / MANIFEST).is_file() or (path / EXPORT_RECORD).is_file()
            or all((path / m).is_file() for m in RUN_MARKERS))


def check_replaceable(path: Path, flag: str = "--output") -> None:
    """``--overwrite`` replaces raycse's own output only: a file, or a directory of someone else's
    files, given by mistake (a corpus folder, a home directory) is refused and left as it is."""
    from raycse.errors import ConfigError

    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file, not an output directory; choose another {flag}")
    if path.is_dir() and any(path.iterdir()) and not is_raycse_output(path):
        raise ConfigError(f"{flag} {path} holds files raycse did not write (no {MANIFEST} or {EXPORT_RECORD}, or no "
                          f"{', '.join(RUN_MARKERS)}); --overwrite replaces only a raycse output: choose another "
                          f"{flag}")


def snapshot(path: Path) -> Optional[frozenset]:
    """What is at ``path``: every entry under it with its kind, size and modification time; None for
    nothing there or an empty directory (what a publish may fill without removing anything)."""
    if not os.path.lexists(path):
        return None
    if path.is_symlink() or not path.is_dir():
        st = path.lstat()
        return frozenset({(".", st.st_mode, st.st_size, st.st_mtime_ns)})
    entries = set()
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(root, name)
            st = os.lstat(full)
            entries.add((os.path.relpath(full, path), st.st_mode, st.st_size, st.st_mtime_ns))
    return frozenset(entries) or None


@dataclass(frozen=True)
class OutputClaim:
    """An output directory this run will publish: its staging directory, and what was at the
    destination when the run checked it (None: nothing, or an empty directory)."""

    dest: Path
    staging: Path
    before: Optional[frozenset]
    flag: str = "--output"


class OutputConflict(RaycseError):
    """The destination changed during the run: nothing there was touched, the run's output was kept."""


def claim_output(dest: Path, overwrite: bool, flag: str = "--output") -> OutputClaim:
    """Check ``dest`` (empty, or raycse's own output and ``overwrite``), make the run's staging
    directory beside it, and refuse when another raycse run is writing the same destination."""
    from raycse.errors import ConfigError

    if dest.is_dir() and any(dest.iterdir()) and not overwrite:
        raise ConfigError(f"output directory {dest} already exists and is not empty; choose another {flag} or pass "
                          f"--overwrite")
    check_replaceable(dest, flag)
    try:
        staging = staging_dir(dest)
    except OSError as err:
        raise ConfigError(f"{flag} {dest}: cannot create a directory beside it ({err.strerror}); choose a {flag} "
                          f"in a directory you can write to") from None
    others = [s for s in live_stagings(dest.parent, staging_prefix(dest.name)) if s != staging]
    if others:  # (made first, checked after: of two runs starting together, neither goes on unseen)
        shutil.rmtree(staging, ignore_errors=True)
        raise ConfigError(f"{flag} {dest} is being written by another raycse run ({_who(others[0], dest.name)}); "
                          f"wait for it to finish or choose another {flag}")
    return OutputClaim(dest, staging, snapshot(dest), flag)


def _who(staging: Path, name: str) -> str:
    host, pid = owners.owner(staging.name, staging_prefix(name))
    where = "on this machine" if host == owners.host() else "on another machine; remove it if that run is gone"
    return f"process {pid} {where}: {staging}"


def publish_claimed(claim: OutputClaim) -> None:
    """The staging directory becomes the destination by renames that remove nothing this run did not
    check at its start: onto nothing (or an empty directory), or, with ``--overwrite``, after the old
    output is moved aside and found unchanged. If the destination changed meanwhile (another run
    published there, a user put files in it), nothing there is touched and the staged output is
    kept beside it under a visible name, named in the :class:`OutputConflict` raised."""
    dest, staging = claim.dest, claim.staging
    if snapshot(dest) != claim.before:
        _conflict(claim, "changed since this run checked it")
    if claim.before is None:
        try:
            os.rename(staging, dest)  # the kernel refuses a non-empty directory or a file there
        except OSError as err:
            _conflict(claim, f"was filled during the publish ({err.strerror})")
        return
    aside = dest.parent / f".{dest.name}.replaced-{owners.owner_tag()}{uuid.uuid4().hex[:8]}"
    os.rename(dest, aside)
    if snapshot(aside) != claim.before:  # (changed between the check and the move)
        os.rename(aside, dest)
        _conflict(claim, "changed since this run checked it")
    try:
        os.rename(staging, dest)
    except OSError as err:
        try:
            os.rename(aside, dest)
        except OSError:
            raise OutputConflict(f"{claim.flag} {dest} was filled during the publish; the output it held is kept at "
                                 f"{aside} and this run's at {staging}") from None
        _conflict(claim, f"was filled during the publish ({err.strerror})")
    shutil.rmtree(aside, ignore_errors=True)


def _conflict(claim: OutputClaim, what: str) -> None:
    kept = claim.dest.with_name(f"{claim.dest.name}.unpublished-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")
    os.rename(claim.staging, kept)
    raise OutputConflict(f"{claim.flag} {claim.dest} {what}, so nothing there was replaced; this run's output is "
                         f"kept at {kept}")


def check_not_inside(dest, flag: str, inputs: dict, writes: Optional[dict] = None) -> None:
    """Refuse an input (``{flag: path or paths}``, those that exist; URIs and None skipped) or another
    place the command writes (``writes``, checked before it exists) that is ``dest`` or lies inside it:
    publishing, or ``--overwrite``, would take it along."""
    from raycse.errors import ConfigError

    dest = Path(os.path.expanduser(str(dest))).resolve()
    for checked, must_exist in ((inputs, True), (writes or {}, False)):
        for what, value in checked.items():
            for item in _paths_of(value):
                path = Path(os.path.expanduser(item))
                if must_exist and not os.path.lexists(path):
                    continue  # a hub name, a glob: nothing of the user's there to lose
                path = path.resolve()
                if path == dest or dest in path.parents:
                    where = "is" if path == dest else "lies inside"
                    raise ConfigError(f"{what} {item} {where} {flag} {dest}, which this command writes; choose a "
                                      f"{flag} apart from its inputs")


def _paths_of(value) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [str(i).strip() for i in items if str(i).strip() and "://" not in str(i)]


def check_writable_file(path: str) -> Path:
    """``path`` as a file an entry point will write at its end: fail before any work if it cannot be."""
    from raycse.errors import RaycseError

    dest = Path(path)
    if dest.is_dir():
        raise RaycseError(f"{dest} is a directory; give a file name to write")
    if not dest.parent.is_dir():
        raise RaycseError(f"directory {dest.parent} does not exist; create it or write {dest.name} elsewhere")
    return dest


@contextmanager
def replaced_whole(dest: Path):
    """A hidden path beside ``dest`` to write, renamed over ``dest`` when the block ends without an error (one
    rename on the same filesystem: whole or not at all); on an error nothing is left."""
    from raycse.errors import named

    dest = Path(dest)
    tmp = dest.parent / f"{staging_prefix(dest.name)}{uuid.uuid4().hex[:8]}"
    try:
        yield tmp
        tmp.replace(dest)
    except OSError as err:
        raise named(err, dest) from None
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(dest: Path, text: str) -> None:
    """Write ``text`` to ``dest`` through a hidden file beside it and one rename: whole or not at all."""
    with replaced_whole(dest) as tmp:
        tmp.write_text(text)
