"""Storage by path or URI: a local directory published to a URI whole or not at all, a model on a URI fetched
once into a local cache, and the small reads, writes and listings a run or a search keeps beside its checkpoints,
which take a local path or a URI alike (:func:`read_text`, :func:`write_text`, :func:`list_dir`, :func:`exists`,
:func:`join`, :func:`parent`, :func:`name`, :func:`located`): a local path through pyarrow's local filesystem, so
that the callers hold no branch of their own.

Any filesystem pyarrow reaches by URI (``s3://``, ``gs://``, ``abfs://``, ...), configured the
standard way (for S3: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``). Object stores have no rename, so a published prefix is complete when its
manifest is there: the files are uploaded first, ``raycse_manifest.json`` (every file with its size
and SHA-256) last; a reader refuses a prefix without a manifest, or whose files do not match it. A
failed upload deletes what it wrote. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Optional

from raycse.errors import DataError, RaycseError
from raycse.platform.folders import sha256_of as _sha256
from raycse.platform.staging import MANIFEST, write_text_atomic


def is_uri(path) -> bool:
    return "://" in str(path) and not str(path).startswith("file://")


def _plain_path(location) -> bool:
    """A local path without a scheme (a ``file://`` URI goes through pyarrow as every URI does)."""
    return "://" not in str(location)


def _fs(uri: str):
    """(pyarrow filesystem, path inside it) of a URI, or of a local path (made absolute)."""
    import pyarrow.fs as pafs

    if _plain_path(uri):
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(os.fspath(uri)))
    try:
        return pafs.FileSystem.from_uri(uri)
    except OSError as exc:  # S3 resolves the bucket's region here: no network, no endpoint
        raise _unreachable(uri, exc) from None
    except Exception as exc:
        raise RaycseError(f"cannot open {uri}: {str(exc).splitlines()[0][:200]}") from None


def filesystem(uri: str):
    """(pyarrow filesystem, path inside it) of a URI, for libraries that take both (Ray Tune's)."""
    return _fs(uri)


def _files(local: Path) -> list[Path]:
    """What a publish uploads: every file but a manifest written locally (the publish writes its own)."""
    return sorted(p for p in local.rglob("*") if p.is_file() and p.name != MANIFEST)


def _unreachable(uri: str, exc: OSError) -> RaycseError:
    return RaycseError(f"cannot use {uri}: {str(exc).splitlines()[0][:300]} (check the bucket, and the credentials "
                       f"and endpoint in the environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)")


def check_usable(uri: str):
    """(filesystem, path) of ``uri`` once its bucket is known to exist: a typo'd bucket, no server or no
    credentials is one line now, not a traceback from a Ray worker later."""
    import pyarrow.fs as pafs

    fs, root = _fs(uri)
    bucket = root.split("/", 1)[0]
    try:
        missing = fs.get_file_info(bucket).type == pafs.FileType.NotFound
    except OSError as exc:
        raise _unreachable(uri, exc) from None
    if missing:  # a typo'd bucket, not an empty prefix
        raise RaycseError(f"cannot use {uri}: bucket {bucket!r} does not exist (create it, or fix the URI)")
    return fs, root


def check_exists(uri: str, what: str) -> None:
    """Raise a DataError naming ``what`` (e.g. "corpus") when nothing is at ``uri`` (a file or a prefix)."""
    import pyarrow.fs as pafs

    fs, path = _fs(uri)
    try:
        missing = fs.get_file_info(path).type == pafs.FileType.NotFound
    except OSError as exc:
        raise _unreachable(uri, exc) from None
    if missing:
        check_usable(uri)  # only now: when the object is there, so is its bucket
        raise DataError(f"{what} not found: {uri} (no object or prefix there; check the URI)")


def prefix_exists(uri: str) -> bool:
    import pyarrow.fs as pafs

    fs, root = check_usable(uri)
    try:
        info = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return False
    except OSError as exc:  # no server, no credentials: one line, not a traceback
        raise _unreachable(uri, exc) from None
    return bool(info)


def check_replaceable_prefix(uri: str) -> None:
    """``--overwrite`` of a prefix that raycse published (its root manifest is there); anything else
    under it is someone else's and is refused, untouched."""
    import pyarrow.fs as pafs

    fs, root = _fs(uri)
    try:
        ours = fs.get_file_info(f"{root}/{MANIFEST}").type == pafs.FileType.File
    except OSError as exc:
        raise _unreachable(uri, exc) from None
    if not ours:
        raise RaycseError(f"{uri} holds objects raycse did not publish (no {MANIFEST} there); --overwrite replaces "
                          f"only a raycse output: choose another --output")


def publish(local: Path, uri: str, overwrite: bool = False, parts: tuple[str, ...] = ()) -> str:
    """Upload ``local`` (a directory) to ``uri``: every file, then a manifest for each sub-directory in
    ``parts`` (e.g. ``model``, so ``URI/model`` loads on its own), then the root manifest. Whole or
    not at all: a failure deletes what was written."""
    fs, root = _fs(uri)
    if prefix_exists(uri):
        if not overwrite:
            raise RaycseError(f"{uri} is not empty; pass --overwrite or choose another --output")
        check_replaceable_prefix(uri)
        fs.delete_dir_contents(root, missing_dir_ok=True)
    written: list[str] = []
    entries: dict[str, dict] = {}

    def put(rel: str, data: Optional[bytes] = None, path: Optional[Path] = None) -> None:
        with fs.open_output_stream(f"{root}/{rel}") as dst:
            if data is not None:
                dst.write(data)
            else:
                with open(path, "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
        written.append(f"{root}/{rel}")

    try:
        for path in _files(local):
            rel = path.relative_to(local).as_posix()
            put(rel, path=path)
            entries[rel] = {"size": path.stat().st_size, "sha256": _sha256(path)}
        for part in parts:
            sub = {rel[len(part) + 1:]: meta for rel, meta in entries.items() if rel.startswith(part + "/")}
            if sub:
                put(f"{part}/{MANIFEST}", json.dumps({"files": sub}, indent=1, sort_keys=True).encode())
        put(MANIFEST, json.dumps({"files": entries}, indent=1, sort_keys=True).encode())  # last: complete now
    except BaseException:
        for obj in written:
            try:
                fs.delete_file(obj)
            except Exception:  # best effort: the missing manifest already marks the prefix incomplete
                pass
        raise
    return uri


def read_manifest(uri: str) -> dict:
    fs, root = _fs(uri)
    try:
        with fs.open_input_stream(f"{root}/{MANIFEST}") as fh:
            manifest = json.loads(fh.read())
    except (FileNotFoundError, OSError):
        raise DataError(f"{uri} has no {MANIFEST}: it is not a complete raycse output (an upload that did not "
                        f"finish, or not written by raycse); write it again") from None
    return manifest


def plain_relative(rel) -> bool:
    """Whether ``rel`` is a plain relative path that stays inside whatever folder it is joined to: no
    absolute or empty part, no ``.``/``..``, no backslash, colon, ``~`` or NUL (names written by someone
    else become local paths: a manifest's entries, a model's module folders)."""
    parts = rel.split("/") if isinstance(rel, str) else [""]
    return not (not rel or rel.startswith(("/", "~")) or "\\" in rel or ":" in rel or "\0" in rel
                or any(p in ("", ".", "..") for p in parts))


def _checked_entries(uri: str, manifest) -> dict[str, dict]:
    """The manifest's files, each name a plain relative path (no ``..``, no absolute or empty part):
    a manifest is written by whoever wrote the prefix, and its names become local paths."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise DataError(f"{uri}/{MANIFEST} is damaged (no 'files' mapping); write the output again")
    for rel, meta in files.items():
        if not plain_relative(rel):
            raise DataError(f"{uri}/{MANIFEST} lists {rel!r}, which is not a plain relative path inside the model; "
                            f"refusing to fetch it (do not use this model, or write it again with raycse)")
        if (not isinstance(meta, dict) or not isinstance(meta.get("size"), int)
                or not re.fullmatch(r"[0-9a-f]{64}", str(meta.get("sha256")))):
            raise DataError(f"{uri}/{MANIFEST} is damaged (entry {rel!r} lacks its size or SHA-256); write it again")
    return files


def _inside(root: Path, rel: str) -> Path:
    target = root / rel
    if not target.resolve().is_relative_to(root.resolve()):  # a link on the way out of the cache
        raise DataError(f"{rel!r} resolves outside the fetch directory; refusing to write it")
    return target


def fetch(uri: str, cache_root: Optional[Path] = None) -> Path:
    """The local copy of the complete prefix ``uri``, downloaded once into a cache keyed by its manifest.
    Every name is checked before anything is written, and every file lands inside a new staging
    directory of the cache, renamed into place only when all of them match the manifest."""
    manifest = read_manifest(uri)
    files = _checked_entries(uri, manifest)
    key = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:24]
    from raycse.platform.caches import checked_cache_dir

    cache = Path(cache_root) / "fetched" if cache_root else checked_cache_dir("fetched")
    dest = cache / key
    if (dest / MANIFEST).is_file():
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    staging = cache / f".{key}.partial-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    fs, root = _fs(uri)
    try:
        for rel, meta in files.items():
            target = _inside(staging, rel)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                # checked again after mkdir: a directory on the way may have been swapped for a link since
                with fs.open_input_stream(f"{root}/{rel}") as src, open(_inside(staging, rel), "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            except (FileNotFoundError, OSError):
                raise DataError(f"{uri}/{rel} is listed in its manifest but missing or unreadable; write the output "
                                f"again") from None
            if target.stat().st_size != meta["size"] or _sha256(target) != meta["sha256"]:
                raise DataError(f"{uri}/{rel} does not match its manifest (size or checksum); write it again")
        (staging / MANIFEST).write_text(json.dumps(manifest))
        try:
            os.replace(staging, dest)
        except OSError:  # another process fetched it meanwhile
            if not (dest / MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def join(base: str, *parts: str) -> str:
    """``base/part/...`` for a local path or a URI (``os.path.join`` would be wrong on Windows-style
    bases and ``Path`` turns ``s3://b`` into ``s3:/b``)."""
    if is_uri(base):
        return "/".join([str(base).rstrip("/"), *parts])
    return str(Path(base, *parts))


def located(location) -> "Path | str":
    """A location as raycse keeps it: a local path made absolute (a ``Path``), or a URI without its trailing
    slash (a ``str``, which Ray Tune's storage layer takes)."""
    return str(location).rstrip("/") if is_uri(location) else Path(os.path.expanduser(os.fspath(location))).resolve()


def parent(location) -> str:
    """The folder or prefix that holds ``location`` (a path or a URI)."""
    return str(location).rstrip("/").rsplit("/", 1)[0] if is_uri(location) else str(Path(location).parent)


def name(location) -> str:
    """The last part of ``location`` (a path or a URI)."""
    return str(location).rstrip("/").rsplit("/", 1)[1] if is_uri(location) else Path(location).name


def exists(location) -> bool:
    """Whether anything is at ``location``: a local file or folder, or any object under a URI's prefix."""
    return prefix_exists(str(location)) if is_uri(location) else Path(location).exists()


def read_text(uri: str) -> str:
    """One object's text; FileNotFoundError when it is not there."""
    return read_bytes(uri).decode()


def read_bytes(uri: str) -> bytes:
    """One object's (or local file's) bytes; FileNotFoundError when it is not there."""
    if _plain_path(uri):
        return Path(uri).read_bytes()
    fs, path = _fs(uri)
    try:
        with fs.open_input_stream(path) as fh:
            return fh.read()
    except FileNotFoundError:
        raise FileNotFoundError(uri) from None
    except OSError as exc:
        if "NoSuchKey" in str(exc) or "does not exist" in str(exc).lower():
            raise FileNotFoundError(uri) from None
        raise _unreachable(uri, exc) from None


def write_text(uri: str, text: str) -> None:
    """One object or local file, written whole (an object store's PUT is atomic; a local file is
    written beside and renamed over, its folder made where missing)."""
    if _plain_path(uri):
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(uri), text)
        return
    fs, path = _fs(uri)
    try:
        with fs.open_output_stream(path) as fh:
            fh.write(text.encode())
    except OSError as exc:
        raise _unreachable(uri, exc) from None


def upload_file(local: Path, uri: str) -> None:
    fs, path = _fs(uri)
    with open(local, "rb") as src, fs.open_output_stream(path) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


def list_dir(uri: str) -> list[tuple[str, bool]]:
    """(name, is a directory) of the entries right under ``uri`` (a URI or a local folder); [] where there is
    nothing."""
    import pyarrow.fs as pafs

    fs, path = _fs(uri)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted((i.base_name, i.type == pafs.FileType.Directory) for i in infos)


def mirror(uri: str, local: Path, wanted) -> Path:
    """Copy the files right under ``uri`` whose names ``wanted(name)`` accepts, and those of its
    sub-directories, one level down, into ``local`` (the small records of a tune experiment, without
    its models and checkpoints)."""
    local.mkdir(parents=True, exist_ok=True)
    for name, is_dir in list_dir(uri):
        if is_dir:
            for sub, sub_is_dir in list_dir(join(uri, name)):
                if not sub_is_dir and wanted(sub):
                    (local / name).mkdir(exist_ok=True)
                    (local / name / sub).write_text(read_text(join(uri, name, sub)))
        elif wanted(name):
            (local / name).write_text(read_text(join(uri, name)))
    return local
