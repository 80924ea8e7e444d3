"""Folders from someone else (a model, an export, a trial's output): what in them may be read, how they are
copied, and the digests that say they are whole.

A folder's entries are read only when each is a regular file, a directory, or a link to a regular file that
stays inside the folder: a FIFO, socket or device would hang or feed whatever opens it, and a link out of
the folder (``notes.txt -> ~/.aws/credentials``) would carry a user's own file into what raycse reads or
publishes. A Hugging Face cache snapshot is the one layout whose links leave the folder: into its own
repository's ``blobs/``, which is allowed.

Copies take regular files only, never raycse's own staging folders, and are digested: ``raycse_manifest.json``
(the format object-storage publishes use) lists every file's size and SHA-256, and :func:`check_digests`
refuses a file that no longer matches.

Ground floor: no raycse imports but :mod:`raycse.errors` and, for the digests kept per machine,
:mod:`raycse.platform.caches`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Iterable

from raycse.errors import ModelError

MANIFEST = "raycse_manifest.json"
# raycse's own staging and set-aside folders (raycse.platform.staging): never part of what a copy takes
OWN_STAGING = re.compile(r"^\..+\.(partial|replaced)-")
MAX_ENTRIES = 100_000  # a model folder holds tens of files: past this, it is not one
UNCHECKED = ("README.md",)  # the card: meant to be edited after publishing, and never read by a load


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _link_roots(folder: Path) -> list[Path]:
    """Where a link of ``folder`` may lead: the folder itself, and a Hugging Face cache snapshot's blobs."""
    root = folder.resolve()
    roots = [root]
    if root.parent.name == "snapshots":  # .../models--org--name/snapshots/<revision>/ -> ../../blobs
        roots.append(root.parent.parent / "blobs")
    return roots


def entries(folder: Path, what: str, leave_out: Iterable[Path] = ()) -> list[tuple[str, Path]]:
    """(relative name, path to read) of every file under ``folder``, refused in one line (naming ``what``, e.g.
    "model") at the first entry that is not a regular file or that leads out of the folder. Directories in
    ``leave_out`` and raycse's own staging folders are skipped, and so is everything under them."""
    folder = Path(folder)
    roots = _link_roots(folder)
    skip = {Path(p).resolve() for p in leave_out}
    found: list[tuple[str, Path]] = []
    pending = [folder]
    while pending:
        current = pending.pop()
        try:
            listing = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError as err:
            raise ModelError(f"{what} folder {current} cannot be read ({err.strerror}); check its permissions") from None
        for entry in listing:
            path = Path(entry.path)
            rel = path.relative_to(folder).as_posix()
            if OWN_STAGING.match(entry.name) or path.resolve() in skip:
                continue
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                target = path.resolve()
                if not any(target == r or r in target.parents for r in roots):
                    raise ModelError(f"{what} file {path} is a link to {target}, outside the {what} folder; raycse "
                                     f"reads and copies only the folder's own files: replace the link by the file "
                                     f"itself, or remove it")
                try:
                    st = os.stat(path)
                except OSError:
                    raise ModelError(f"{what} file {path} is a link to {target}, which does not exist; remove the "
                                     f"link or copy the file in") from None
                if stat.S_ISDIR(st.st_mode):
                    raise ModelError(f"{what} folder {path} is a link to the folder {target}; raycse follows no "
                                     f"folder links inside a {what}: copy the folder in instead")
            if stat.S_ISDIR(st.st_mode):
                pending.append(path)
            elif stat.S_ISREG(st.st_mode):
                found.append((rel, path))
            else:
                raise ModelError(f"{what} file {path} is {_kind(st.st_mode)}; raycse reads only regular files from a "
                                 f"{what} folder (this one would hang or feed it): remove it")
            if len(found) > MAX_ENTRIES:
                raise ModelError(f"{what} folder {folder} holds more than {MAX_ENTRIES:,} files; point at the "
                                 f"{what}'s own folder")
    return sorted(found)


def copy_folder(src: Path, dst: Path, what: str, leave_out: Iterable[Path] = (),
                skip_names: Iterable[str] = ()) -> None:
    """Copy ``src``'s regular files into ``dst`` (created; may exist): links inside the folder become the files
    they point to, a link out of it or anything not a regular file is refused (:func:`entries`), raycse's own
    staging folders and ``leave_out`` are not copied, nor the top-level names in ``skip_names``."""
    top = set(skip_names)
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for rel, path in entries(Path(src), what, leave_out):
        if rel.split("/", 1)[0] in top:
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target, follow_symlinks=True)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def digests(folder: Path) -> dict[str, dict]:
    """Every file of ``folder`` (its own manifest apart): {relative name: {"size", "sha256"}}."""
    return {rel: {"size": path.stat().st_size, "sha256": sha256_of(path)}
            for rel, path in entries(Path(folder), "output") if rel != MANIFEST}


def write_manifest(folder: Path) -> dict:
    """``folder``/raycse_manifest.json: the digest of every file in it (written last, once the folder is whole)."""
    files = digests(folder)
    (Path(folder) / MANIFEST).write_text(json.dumps({"files": files}, indent=1, sort_keys=True))
    return files


def check_digests(folder: Path, what: str = "model") -> None:
    """Refuse, in one line, a folder whose manifest names a file that is missing or no longer matches its
    digest (a swapped ONNX file, a weight file cut short); the card (README.md) may be edited freely. A folder
    without a manifest is not checked."""
    folder = Path(folder)
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return
    try:
        files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
        items = [(str(rel), int(meta["size"]), str(meta["sha256"])) for rel, meta in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise ModelError(f"{manifest} is damaged; write the {what} again, or remove the manifest to use the "
                         f"files as they are") from None
    for rel, size, digest in items:
        if rel in UNCHECKED:
            continue
        path = folder / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise ModelError(f"{manifest} lists {rel!r}, which is not a file inside the {what}; write it again")
        changed = not path.is_file() or path.stat().st_size != size or _digest_of(path) != digest
        if changed:
            state = "is missing" if not path.is_file() else "does not match its digest"
            raise ModelError(f"{what} file {path} {state} in {MANIFEST}: it changed after raycse wrote the {what}; "
                             f"write it again, or remove {MANIFEST} to use the files as they are")


_known: dict = {}  # (path, inode, size, ctime) -> SHA-256, this process's


def _digest_of(path: Path) -> str:
    """:func:`sha256_of`, computed once a process for a file that did not change since (its inode, size and
    ctime: a write changes the ctime, and no user can set it back), and once a machine through raycse's cache,
    so a big model's every worker and embedding actor does not read all its weights again to hash them."""
    from raycse.platform.caches import checked_cache_dir, read_json_cache, write_json_cache

    st = path.stat()
    key = f"{path.resolve()}|{st.st_ino}|{st.st_size}|{st.st_ctime_ns}"
    if key in _known:
        return _known[key]
    record = checked_cache_dir() / "digests.json"  # (refused where others could write what it says)
    kept = read_json_cache(record)
    digest = kept.get(key) if isinstance(kept.get(key), str) else None
    if digest is None:
        digest = sha256_of(path)
        if st.st_size >= DIGEST_KEPT_FROM:  # (small files hash faster than the record is read)
            where = key.split("|", 1)[0]  # (entries of files gone, or of this file before it changed, go)
            kept = {k: v for k, v in kept.items()
                    if k.split("|", 1)[0] != where and Path(k.split("|", 1)[0]).exists()}
            write_json_cache(record, {**kept, key: digest})
    _known[key] = digest
    return digest


DIGEST_KEPT_FROM = 16 << 20  # bytes: files this large have their digest kept in the machine's cache
