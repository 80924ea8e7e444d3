"""The Optuna study a search keeps, in Optuna's own storage, so that ``optuna.load_study``,
``optuna.visualization`` and ``optuna-dashboard`` open it as they open any study.

Where it lives: ``--optuna-storage URL`` (a shared database), else an SQLite file beside the
experiment (``EXP/optuna.db``), named after the experiment. An experiment on object storage keeps
the file in this machine's cache (``RAYCSE_CACHE/studies/<digest of the URI>/optuna.db``) while its
driver runs, copies it beside the experiment when the fit ends (or fails), and ``--resume`` on
another machine copies it back first. (Tune pickles the searcher with the study's URL: such an experiment resumes on a
machine whose ``RAYCSE_CACHE`` is the same path.)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from raycse.platform import object_store

STUDY_FILE = "optuna.db"


@dataclass(frozen=True)
class StudyPlace:
    url: str  # what Optuna opens
    name: str  # the study's name: the experiment's
    local: Optional[Path] = None  # the SQLite file, where raycse keeps it
    remote: Optional[str] = None  # its copy beside an experiment on object storage

    def storage(self):
        import optuna

        return optuna.storages.RDBStorage(self.url)


def place(exp_dir, name: str, url: Optional[str] = None) -> StudyPlace:
    """Where the study of the experiment at ``exp_dir`` (a Path or a URI) lives."""
    if url:
        return StudyPlace(url, name)
    if not object_store.is_uri(exp_dir):
        local = Path(exp_dir) / STUDY_FILE
        return StudyPlace(f"sqlite:///{local}", name, local)
    from raycse.platform.caches import cache_dir

    digest = hashlib.sha256(str(exp_dir).rstrip("/").encode()).hexdigest()[:16]
    local = cache_dir() / "studies" / digest / STUDY_FILE
    return StudyPlace(f"sqlite:///{local}", name, local, object_store.join(str(exp_dir), STUDY_FILE))


def fetch(where: StudyPlace) -> None:
    """Before a resume: the study's copy on object storage into the local file, unless this machine
    has the file (its own driver's, the freshest: the copy is made only when a fit ends)."""
    if where.remote is None or where.local.exists():
        return
    where.local.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = object_store.read_bytes(where.remote)
    except FileNotFoundError:
        return  # (an experiment from before studies were kept)
    tmp = where.local.with_suffix(".partial")
    tmp.write_bytes(data)
    tmp.replace(where.local)


def sync(where: StudyPlace) -> None:
    """After a fit: the local file beside the experiment on object storage."""
    if where.remote is not None and where.local.is_file():
        object_store.upload_file(where.local, where.remote)


def prepare(where: StudyPlace) -> None:
    """Before a new search: the local file's directory, and no leftover of an earlier experiment of
    the same URI (its name is free on storage, so a file here is stale)."""
    if where.local is None:
        return
    where.local.parent.mkdir(parents=True, exist_ok=True)
    if where.remote is not None and where.local.exists():
        where.local.unlink()


ORPHAN_NOTE = "asked by a driver that was lost before Tune ran it; this configuration never ran"


def close_orphans(where: StudyPlace) -> int:
    """After a fit that ended (not one interrupted): a trial still RUNNING in the study was asked for
    by a driver lost before Tune recorded it, and no resume will tell it; marked FAIL with a note, so
    that optuna-dashboard and ``load_study`` do not show it running for ever. Returns how many."""
    import optuna

    running = optuna.trial.TrialState.RUNNING
    rdb = where.storage()
    try:
        study_id = rdb.get_study_id_from_name(where.name)
    except KeyError:  # no trial was ever asked for
        return 0
    orphans = rdb.get_all_trials(study_id, deepcopy=False, states=(running,))
    for t in orphans:
        trial_id = rdb.get_trial_id_from_study_id_trial_number(study_id, t.number)
        rdb.set_trial_user_attr(trial_id, "raycse_note", ORPHAN_NOTE)
        rdb.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
    return len(orphans)
