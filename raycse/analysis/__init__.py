"""Analysis of a tune experiment: a table of trials, the best configuration, PNG plots, model export.

Reads the experiment directory as Tune wrote it (``<trial>/params.json`` and ``result.json``,
one JSON line per reported rung), so it works on finished, stopped or interrupted experiments
and needs no running cluster. An experiment on object storage (``s3://...``) is read the same way
from a local copy of those small records; plots and ``export_best`` may be URIs too.

    from raycse.analysis import analyze
    report = analyze("outputs/tune/simcse-20261121-120000", plots=True, export_best="best_model")
    print(report.table)
"""

from __future__ import annotations

import json
import re
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from raycse.analysis import pareto
from raycse.errors import ConfigError, RaycseError
from raycse.platform import object_store
from raycse.platform.redact import redact, redact_obj
from raycse.platform.staging import claim_output, private_tempdir, publish_claimed, temporary_dir

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


@dataclass
class Report:
    trials: list[TrialRecord]
    table: str
    best: Optional[TrialRecord]
    best_text: str
    plots: list = field(default_factory=list)  # Paths, or URIs when written to object storage
    front: list = field(default_factory=list)  # a search for several goals: its Pareto front (TrialRecords)
    exported: Optional[Path | str] = None
    table_file: Optional[str] = None  # --table: every trial's every rung and seed, for pandas


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


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def format_table(trials: list[TrialRecord], knobs: list[str], finished: bool, front: tuple = ()) -> str:
    """Every trial's knobs, score over seeds and status; a trial of the Pareto front (``front``) marked *."""
    head = ["#", "trial"] + knobs + ["mean +- std", "worst", "seeds", "status"]
    rows = []
    for i, t in enumerate(trials, 1):
        m = t.last
        score = f"{m['mean']:.2f} +- {m['std']:.2f}" if "mean" in m else "-"
        rows.append([str(i), t.short_name + (" *" if any(t is f for f in front) else "")]
                    + [_fmt(t.params.get(k, "-")) for k in knobs]
                    + [score, f"{m['worst']:.2f}" if "worst" in m else "-",
                       " ".join(f"{s:.2f}" for s in m.get("seed_scores", [])) or "-", t.status(finished)])
    widths = [max(len(r[c]) for r in [head] + rows) for c in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


TABLE_FORMATS = (".csv", ".parquet", ".json")


def seed_rows(trials: list[TrialRecord], finished: bool) -> list[dict]:
    """One row per trial, rung and seed: the trial's knobs, status and rung aggregate beside the
    seed's own score (long format, as pandas users group it)."""
    rows = []
    for t in trials:
        for r in t.results or [{}]:
            common = {"trial": t.short_name, "status": t.status(finished), "location": t.location,
                      **{f"knob_{k}": v for k, v in sorted(t.params.items())},
                      **{k: r.get(k) for k in ("rung", "step", "target", "mean", "std", "worst")}}
            scores = list(zip(r.get("seeds", []), r.get("seed_scores", []))) or [(None, None)]
            rows += [{**common, "seed": seed, "score": score} for seed, score in scores]
    return rows


def check_table_path(dest: str) -> None:
    """A --table file raycse can write: a known format, a directory that is there, nothing it would replace."""
    suffix = Path(dest).suffix.lower()
    if suffix not in TABLE_FORMATS:
        raise ConfigError(f"--table {dest}: give a file ending in {', '.join(TABLE_FORMATS)}")
    if object_store.is_uri(dest):
        return
    if not Path(dest).parent.is_dir():
        raise ConfigError(f"--table {dest}: its directory {Path(dest).parent} does not exist")
    if Path(dest).exists():
        raise ConfigError(f"--table {dest} already exists; choose another file")


def write_table(rows: list[dict], dest: str) -> str:
    """The rows as CSV, Parquet or JSON (records) at ``dest``, written whole (beside, then renamed; or uploaded)."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    suffix = Path(dest).suffix.lower()
    with temporary_dir("raycse-table-") as tmp:
        local = tmp / f"table{suffix}"
        if suffix == ".csv":
            frame.to_csv(local, index=False)
        elif suffix == ".parquet":
            frame.to_parquet(local, index=False)
        else:
            frame.to_json(local, orient="records", indent=1)
        if object_store.is_uri(dest):
            object_store.upload_file(local, dest)
        else:  # copied beside the destination, then renamed: a reader never sees half a table
            beside = Path(dest).with_name(f".{Path(dest).name}.partial-{os.getpid()}")
            try:
                shutil.copyfile(local, beside)
                os.replace(beside, dest)
            finally:
                beside.unlink(missing_ok=True)
    return dest


def analyze(exp_dir: str, plots: bool = True, plot_dir: Optional[str] = None, export_best: Optional[str] = None,
            top: int = 5, table: Optional[str] = None, pick: Optional[str] = None) -> Report:
    """Table, best configuration, PNG plots (in ``plot_dir``, default EXP_DIR/plots), optional export
    and, with ``table``, every trial's every rung and seed as a CSV/Parquet/JSON file, as ``raycse
    analyze`` does (``raycse.analyze``): a :class:`Report` (``.table``, ``.best_text``, ``.plots``...).
    A search for several goals: its Pareto front (``.front``; its table is ``.best_text``; ``pareto.png``), and
    ``export_best`` exports the trial ``pick`` names (its Tune id, e.g. ``c33649c4``), one of the front.

    >>> import raycse
    >>> raycse.analyze("no-such-experiment")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    raycse.errors.ConfigError: experiment directory not found: ...no-such-experiment
    """
    from raycse.tune.search import load_settings

    remote = object_store.is_uri(exp_dir)
    exp = str(exp_dir).rstrip("/") if remote else Path(exp_dir).resolve()
    if not remote and not exp.is_dir():
        raise ConfigError(f"experiment directory not found: {exp}")
    if export_best:
        check_export_path(export_best)  # before any plot is written
    if table:
        check_table_path(table)
    settings, _ = load_settings(exp)
    trials = load_trials(exp)
    if not trials:
        raise ConfigError(f"{exp} has no trials yet; run or resume the experiment first")
    knobs = sorted({k for t in trials for k in t.params})
    finished = all(t.results or t.error for t in trials) and len(trials) >= settings.num_samples
    goals = settings.goals()
    members = pareto.front(trials, goals) if goals else []
    text = format_table(trials, knobs, finished, tuple(members))
    scored = [t for t in trials if "target" in t.last]
    complete = [t for t in scored if t.complete] or scored
    best = max(complete, key=lambda t: t.last["target"]) if complete else None
    if goals and (export_best or pick):
        best = picked(members, pick)
    elif pick:
        raise ConfigError(f"--pick {pick}: this experiment searched one goal; --export-best exports its best trial")
    best_text = "no trial has reported a score yet"
    if best is not None:
        m = best.last
        best_text = (f"best: {best.short_name} ({best.location})\n  target ({settings.target}) {m['target']:.2f}  mean {m['mean']:.2f} +- "
                     f"{m['std']:.2f}  worst {m['worst']:.2f}\n  config: "
                     + ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(best.params.items()))
                     + "\n  seeds: " + ", ".join(f"{s}: {v:.2f}" for s, v in zip(m["seeds"], m["seed_scores"])))
    if goals:
        best_text = (pareto.format_front(members, goals, knobs) + "\n  (* in the table; raycse analyze --export-best "
                     "DIR --pick TRIAL exports one)") if members else "no trial has completed every goal yet"
    report = Report(trials, text, best, best_text, front=members)
    if table:
        report.table_file = write_table(seed_rows(trials, finished), table)
    if plots:
        report.plots = _write_plots(trials, knobs, plot_dir or object_store.join(str(exp), "plots"), settings.target, top,
                                    (members, goals))
    if export_best:
        report.exported = export_model(best, export_best, str(exp).rstrip("/").rsplit("/", 1)[-1], settings.target)
    return report


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

    if object_store.is_uri(exp_dir):
        fs, path = object_store.filesystem(str(exp_dir).rstrip("/"))
        return ExperimentAnalysis(path, storage_filesystem=fs, default_metric="target", default_mode="max")
    return ExperimentAnalysis(str(Path(exp_dir).resolve()), default_metric="target", default_mode="max")


def picked(members: list, pick: Optional[str]) -> TrialRecord:
    """The trial of the Pareto front ``pick`` names (its Tune id, or its directory's name); refused in one
    line, naming the front's trials, where it names none of them."""
    ids = ", ".join(t.trial_id for t in members) or "none yet"
    if not pick:
        raise ConfigError(f"this experiment searched several goals: choose the trial to export with --pick TRIAL, "
                          f"one of its Pareto front: {ids}")
    found = [t for t in members if pick in (t.trial_id, t.short_name, t.name)]
    if len(found) != 1:
        raise ConfigError(f"--pick {pick} is not a trial of the Pareto front; pick one of: {ids}")
    return found[0]


def _write_plots(trials, knobs, out: str, target: str, top: int, front: tuple = ([], [])) -> list:
    """PNGs into ``out``; on object storage each is drawn locally, then uploaded (one PUT: whole)."""
    from raycse.analysis.plots import write_plots

    if not object_store.is_uri(out):
        Path(out).mkdir(parents=True, exist_ok=True)
        return write_plots(trials, knobs, Path(out), target, top, front)
    with temporary_dir("raycse-plots-") as tmp:
        uploaded = []
        for png in write_plots(trials, knobs, tmp, target, top, front):
            object_store.upload_file(png, object_store.join(out, png.name))
            uploaded.append(object_store.join(out, png.name))
        return uploaded


def _export_card(staging: Path, run_dir: Path, dest: Path, best: TrialRecord, seed: int, experiment: str,
                 target: str) -> None:
    from raycse.model.card import model_card
    from raycse.platform import safe_yaml

    m = best.last
    search = {"experiment": experiment, "target": target, "config": best.params, "seeds": m["seeds"],
              "seed_scores": m["seed_scores"], "exported_seed": seed}
    run = safe_yaml.load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    summary = json.loads((run_dir / "metrics.json").read_text())
    (staging / "README.md").write_text(model_card(redact_obj(run), redact_obj(summary), redact(str(dest)),
                                                  redact_obj(search), files=staging))


def check_export_path(dest) -> None:
    if object_store.is_uri(dest):
        if object_store.prefix_exists(str(dest)):
            raise ConfigError(f"--export-best {dest} is not empty; choose another URI")
        return
    dest = Path(os.path.expanduser(dest))
    if dest.is_file():
        raise ConfigError(f"--export-best {dest} is a file; give a directory path for the model")
    if dest.exists() and any(dest.iterdir()):
        raise ConfigError(f"--export-best {dest} exists and is not empty; choose another path")


def export_model(best: Optional[TrialRecord], dest, experiment: str = "", target: str = "mean"):
    """Copy the best trial's best seed's model, with a model card naming the search's best
    configuration and its seeds: staged beside ``dest`` and renamed, or, for a URI, published with
    its manifest last (raycse.platform.object_store), so it appears whole or not at all. Returns ``dest``."""
    from raycse.tune.trial import SEED_MODEL

    if best is None:
        raise ConfigError("no finished trial to export")
    m = best.last
    seed = m["seeds"][max(range(len(m["seed_scores"])), key=lambda i: m["seed_scores"][i])]
    run_dir = _seed_output(best, seed, SEED_MODEL)
    src = run_dir / "model"
    if not (src / "config.json").is_file():
        raise ConfigError(f"the best trial's model is missing ({src}); was the experiment directory moved or pruned?")
    from raycse.model.files import check_model_files
    from raycse.platform.folders import copy_folder, write_manifest

    try:  # (a damaged model is not published as the best one)
        check_model_files(src, "trial's model")
    except RaycseError as err:
        raise ConfigError(f"the best trial's model cannot be exported: {err}") from None
    check_export_path(dest)
    if object_store.is_uri(dest):
        with temporary_dir("raycse-export-") as tmp:
            staging = tmp / "model"
            copy_folder(src, staging, "trial's model")
            _export_card(staging, run_dir, str(dest), best, seed, experiment, target)
            object_store.publish(staging, str(dest))
        return str(dest)
    dest = Path(os.path.expanduser(dest)).resolve()
    claim = claim_output(dest, overwrite=False, flag="--export-best")
    try:  # (regular files only, nothing that leads out of the trial's folder, not the staging folder itself)
        copy_folder(src, claim.staging, "trial's model", leave_out=(claim.staging, dest))
        _export_card(claim.staging, run_dir, dest, best, seed, experiment, target)
        write_manifest(claim.staging)
        publish_claimed(claim)
    except BaseException:
        shutil.rmtree(claim.staging, ignore_errors=True)
        raise
    return dest


def _seed_output(best: TrialRecord, seed: int, seed_model: str) -> Path:
    """The local directory of a seed's saved output (model, metrics.json, config.yaml); one on
    object storage is fetched (checked against its manifest) into the local cache first."""
    location = object_store.join(best.location or str(best.path), f"seed{seed}", seed_model)
    if not object_store.is_uri(location):
        return Path(location)
    from raycse.errors import DataError

    try:
        return object_store.fetch(location)
    except DataError as err:
        raise ConfigError(f"the best trial's model cannot be read: {err}") from None


__all__ = ["analyze", "export_model", "load_trials", "Report", "TrialRecord"]
