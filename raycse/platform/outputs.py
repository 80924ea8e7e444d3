"""An output written whole, in one way for every command that writes one (train's run folder, export's model,
analyze's --export-best and --table, mine's triplets), for local paths and object-store URIs alike.

- A folder (:func:`written_folder`): local, claimed beside its destination (nothing there that is not raycse's own
  output is replaced, and only with ``--overwrite``; another run writing it is refused), filled, and renamed into
  place (raycse.platform.staging); on object storage, filled in a private temporary folder and uploaded with its
  manifest last, so a reader sees all of it or none (raycse.platform.object_store).
- A file (:func:`written_file`): written beside its destination and renamed over it, or uploaded in one PUT.

Either way a failure, an interrupt included, leaves nothing behind: no half-written output, no staging folder.

    >>> import os, tempfile
    >>> dest = os.path.join(tempfile.mkdtemp(), "out")
    >>> with written_folder(dest, "--output") as staging:
    ...     _ = (staging / "a.txt").write_text("whole")
    >>> sorted(os.listdir(dest))
    ['a.txt']
    >>> with written_folder(dest, "--output") as staging:
    ...     pass
    Traceback (most recent call last):
    ...
    raycse.errors.ConfigError: output directory ... already exists and is not empty; choose another --output or pass --overwrite
"""

from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from raycse.errors import ConfigError
from raycse.platform import object_store
from raycse.platform.staging import claim_output, publish_claimed, replaced_whole, temporary_dir


@contextmanager
def written_folder(dest, flag: str, overwrite: bool = False, parts: tuple = ()) -> Iterator[Path]:
    """A local folder to fill, published at ``dest`` (a path or a URI) when the block ends without an error, whole
    or not at all. ``flag``: the setting that named ``dest`` (for its one-line refusals); ``overwrite``: replace an
    output raycse wrote there before (never anything else); ``parts``: sub-folders of an upload that get a manifest
    of their own (``model``, so ``URI/model`` loads alone)."""
    if object_store.is_uri(str(dest)):
        uri = str(dest).rstrip("/")
        if object_store.prefix_exists(uri):  # (before the work, as for a local folder)
            if not overwrite:
                raise ConfigError(f"{flag} {uri} is not empty; choose another URI or pass --overwrite")
            object_store.check_replaceable_prefix(uri)
        with temporary_dir("raycse-output-") as tmp:
            staging = tmp / f"out-{uuid.uuid4().hex[:8]}"  # (a name of its own: a run is keyed by it)
            staging.mkdir()
            yield staging
            object_store.publish(staging, uri, overwrite=overwrite, parts=parts)
        return
    claim = claim_output(Path(os.path.expanduser(str(dest))).resolve(), overwrite, flag)
    try:
        yield claim.staging
        publish_claimed(claim)
    except BaseException:
        shutil.rmtree(claim.staging, ignore_errors=True)
        raise


@contextmanager
def written_file(dest) -> Iterator[Path]:
    """A local path to write, which becomes ``dest`` (a path or a URI) when the block ends without an error: renamed
    over it from beside it, or uploaded in one PUT; on an error nothing is left."""
    if object_store.is_uri(str(dest)):
        with temporary_dir("raycse-file-") as tmp:
            local = tmp / Path(str(dest)).name
            yield local
            object_store.upload_file(local, str(dest))
        return
    with replaced_whole(Path(dest)) as tmp:
        yield tmp
