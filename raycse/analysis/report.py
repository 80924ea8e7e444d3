"""``raycse analyze``: the table of trials, the best configuration (or a Pareto front), PNG plots, an optional table
file and export, as one :class:`Report`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from raycse.analysis import pareto
from raycse.analysis.best_model import check_export_path, export_model, picked
from raycse.analysis.tables import check_table_path, fmt, format_table, seed_rows, write_table
from raycse.analysis.trials import TrialRecord, load_trials
from raycse.errors import ConfigError
from raycse.platform import object_store
from raycse.platform.staging import temporary_dir


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


def analyze(exp_dir: str, plots: bool = True, plot_dir: Optional[str] = None, export_best: Optional[str] = None,
            top: int = 5, table: Optional[str] = None, pick: Optional[str] = None) -> Report:
    """An experiment's table, best configuration, PNG plots and optional exports, as ``raycse analyze`` does
    (``raycse.analyze``). A search for several goals: its Pareto front (``.front``; its table is ``.best_text``;
    ``pareto.png``).

    Args:
        exp_dir: the experiment's folder or URI (what :func:`raycse.tune` returned).
        plots: write the plots (optimization history, knob importances, score against each knob, the seeds'
            spread).
        plot_dir: where the plots go (default: EXP_DIR/plots).
        export_best: a folder (or URI) to export the best trial's model into, with its card.
        top: how many trials the table ranks.
        table: a CSV, Parquet or JSON file to write every trial's every rung and seed into (for pandas).
        pick: with several goals, the trial of the front to export (its Tune id, e.g. ``c33649c4``).

    Returns:
        A :class:`Report`: ``trials``, ``table`` (the text the CLI prints), ``best``, ``best_text``, ``plots``,
        ``front``, ``exported`` and ``table_file``.

    Raises:
        raycse.errors.ConfigError: no experiment there, no trial yet, or an export or table path it cannot
            write, in one line, before anything is written.

    >>> import os, pathlib, tempfile, raycse
    >>> raycse.analyze("no-such-experiment")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    raycse.errors.ConfigError: experiment directory not found: ...no-such-experiment

    A search of two configurations (a learning rate each), one step of the shipped all-MiniLM-L6-v2 apiece, read
    back:

    >>> work = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (work / "wiki.txt").write_text("\\n".join(f"The river {i} flows past town {i % 5}." for i in range(48)))
    >>> rows = [(4.5, "A dog runs on grass."), (0.5, "Prices rose in May."), (2.5, "A dog sits on grass.")]
    >>> _ = (work / "dev.tsv").write_text("".join(
    ...     f"main-captions\\tMSRvid\\t2012test\\t{n:04d}\\t{s}\\tA dog is running on the grass.\\t{b}\\n"
    ...     for n, (s, b) in enumerate(rows)))
    >>> _ = (work / "lr.yaml").write_text(f"run:\\n  data: {{corpus: {work / 'wiki.txt'}}}\\n  train: {{batch_size: 8, "
    ...     f"max_steps: 1}}\\n  eval: {{stsb_dev: {work / 'dev.tsv'}}}\\nsearch:\\n  lr: {{choice: [1.0e-5, 5.0e-5]}}\\n")
    >>> exp, _ = raycse.tune(raycse.TuneSettings(space=str(work / "lr.yaml"), num_samples=2, seeds=[0], rungs=1),
    ...                      str(work / "tune"), "lr")  # (starts Ray)
    [raycse] ...
    >>> report = raycse.analyze(exp, plots=False)
    >>> len(report.trials), report.best.last["target"] == max(t.last["target"] for t in report.trials)
    (2, True)
    """
    from raycse.tune.experiment import load_settings

    exp = object_store.located(exp_dir)
    if not object_store.is_uri(exp) and not exp.is_dir():
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
                     + ", ".join(f"{k}={fmt(v)}" for k, v in sorted(best.params.items()))
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
