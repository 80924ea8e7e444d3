"""An experiment's trials as Tune wrote them (``<trial>/params.json``, ``result.json``, ``error.txt``), read as plain
JSON (never unpickled), from a folder or from a local copy of an experiment on object storage's small records; and
Ray's own ``ExperimentAnalysis`` for an experiment one trusts."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from raycse.errors import ConfigError
from raycse.platform import object_store
from raycse.platform.redact import redact
from raycse.platform.staging import private_tempdir

# what analysis reads of an experiment: Tune's records, not the models and checkpoints beside them
RECORDS = ("params.json", "result.json", "error.txt", "space.yaml", "raycse_tune.json")


@dataclass
class TrialRecord:
    name: str
    path: Path
    params: dict
    results: list[dict]
    error: Optional[str] = None
    tune_status: Optional[str] = None  # from Tune's experiment state: TERMINATED, RUNNING, PENDING, ERROR
    location: str = ""  # where the trial's directory really is: path or URI (``path`` may be a local copy)

    @property
    def short_name(self) -> str:
        """Tune's directory name without the parameter string and date: ``<trial id>_<number>``."""
        m = re.match(r"^\w+?_([0-9a-f]{5,}_\d+)", self.name)
        return m.group(1) if m else self.name

    @property
    def trial_id(self) -> str:
        """Tune's trial id (``trial_<id>_<knobs>``, raycse's directory names), else :attr:`short_name`."""
        m = re.match(r"^trial_([0-9a-f]{8})(_|$)", self.name)
        return m.group(1) if m else self.short_name

    @property
    def last(self) -> dict:
        return self.results[-1] if self.results else {}

    @property
    def complete(self) -> bool:
        from raycse.tune.trial import is_final

        return bool(self.results) and is_final(self.last)

    def status(self, finished: bool = False) -> str:
        ended = self.tune_status == "TERMINATED" or (self.tune_status is None and finished)
        if self.error or self.tune_status == "ERROR":
            return f"error: {self.error}" if self.error else "error"
        if not self.results:
            return "stopped before its first rung" if ended else "pending"
        if self.complete:
            return "complete"
        rung = f"rung {self.last['rung']}/{self.last['final_rung']}"
        return f"stopped at {rung}" if ended else f"incomplete ({rung})"


def tune_statuses(exp_dir: Path) -> dict:
    """Trial directory name -> Tune's status, from the newest experiment state file (if readable)."""
    files = sorted(exp_dir.glob("experiment_state-*.json"))
    if not files:
        return {}
    try:
        state = json.loads(files[-1].read_text())
        out = {}
        for entry in state.get("trial_data", []):
            trial = json.loads(entry[0] if isinstance(entry, list) else entry)
            out[trial.get("relative_logdir")] = trial.get("status")
        return out
    except (ValueError, KeyError, TypeError, IndexError):
        return {}


def local_records(exp_dir: str) -> Path:
    """A local copy of the records of an experiment on object storage (never its models)."""
    import atexit

    wanted = lambda name: name in RECORDS or name.startswith("experiment_state")  # noqa: E731
    local = private_tempdir("raycse-exp-")
    atexit.register(shutil.rmtree, local, True)
    return object_store.mirror(exp_dir, local, wanted)


def read_results(path: Path) -> list[dict]:
    """A trial's reports, one per rung: a rung told again after a resume (its driver was lost
    before Tune recorded it) keeps its first row."""
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError
        except ValueError:
            if i == len(lines) - 1:  # a write cut short by a killed driver: that rung is reported again
                print(f"[raycse] warning: {path}: its last line is cut short; ignored", flush=True)
                break
            raise ConfigError(f"{path} is damaged at line {i + 1} (not a JSON record); restore it or analyze "
                              f"another experiment") from None
        rows.append(row)
    seen = set()
    kept = []
    for row in rows:
        if row.get("rung") is None or row["rung"] not in seen:
            kept.append(row)
            seen.add(row.get("rung"))
    return kept


def load_trials(exp_dir) -> list[TrialRecord]:
    """The trials of an experiment directory or URI, oldest first."""
    if object_store.is_uri(exp_dir):
        trials = load_trials(local_records(str(exp_dir)))
        for t in trials:
            t.location = object_store.join(str(exp_dir), t.name)
        return trials
    exp_dir = Path(exp_dir)
    statuses = tune_statuses(exp_dir)
    trials = []
    for d in sorted(p for p in exp_dir.iterdir() if p.is_dir() and (p / "params.json").is_file()):
        results = read_results(d / "result.json") if (d / "result.json").is_file() else []
        err = (d / "error.txt").read_text().strip().splitlines()[-1] if (d / "error.txt").is_file() else None
        try:
            params = json.loads((d / "params.json").read_text())
        except ValueError:
            raise ConfigError(f"{d / 'params.json'} is damaged (not JSON); restore it or analyze another "
                              f"experiment") from None
        trials.append(TrialRecord(d.name, d, params, results, err, statuses.get(d.name), str(d)))
    trials.sort(key=lambda t: t.results[0].get("timestamp", 0) if t.results else float("inf"))
    return trials


def ray_analysis(exp_dir, trusted: bool = False):
    """Ray Tune's own ``ExperimentAnalysis`` of an experiment (a path or URI): Ray's and pandas users'
    API (``.dataframe()``, ``.trial_dataframes``, ``.get_best_config("target", "max")``, ``.trials``).

    Ray reads an experiment's state with cloudpickle (a raycse experiment holds dozens of pickled
    objects), which runs whatever code the experiment's author put there: ``trusted=True`` says the
    experiment is yours or your team's. ``analyze`` reads the same records as plain JSON, so it is
    safe on anyone's experiment."""
    if not trusted:
        raise ConfigError(f"Ray's ExperimentAnalysis unpickles {redact(str(exp_dir))}'s Tune state, which runs code its "
                          f"author can put there; pass trusted=True for an experiment you trust, or use analyze()")
    from ray.tune import ExperimentAnalysis

    fs, path = object_store.filesystem(str(object_store.located(exp_dir)))  # (a folder's is pyarrow's local one)
    return ExperimentAnalysis(path, storage_filesystem=fs, default_metric="target", default_mode="max")
