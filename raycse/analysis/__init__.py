"""Analysis of a tune experiment: a table of trials, the best configuration, PNG plots, model export (the package's
face: trials.py reads the experiment, tables.py and plots.py show it, pareto.py finds a front, best_model.py exports,
report.py puts them together).

Reads the experiment directory as Tune wrote it (``<trial>/params.json`` and ``result.json``,
one JSON line per reported rung), so it works on finished, stopped or interrupted experiments
and needs no running cluster. An experiment on object storage (``s3://...``) is read the same way
from a local copy of those small records; plots and ``export_best`` may be URIs too.

    from raycse.analysis import analyze
    report = analyze("outputs/tune/simcse-20261121-120000", plots=True, export_best="best_model")
    print(report.table)
"""

from raycse.analysis.best_model import export_model
from raycse.analysis.report import Report, analyze
from raycse.analysis.trials import TrialRecord, load_trials, ray_analysis

__all__ = ["analyze", "export_model", "load_trials", "ray_analysis", "Report", "TrialRecord"]
