"""The trials as tables: the one ``raycse analyze`` prints, and every trial's every rung and seed as a file for pandas
(``--table``: CSV, Parquet or JSON), written whole."""

from __future__ import annotations

from pathlib import Path

from raycse.analysis.trials import TrialRecord
from raycse.errors import ConfigError
from raycse.platform import object_store
from raycse.platform.outputs import written_file


def fmt(v) -> str:
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
                    + [fmt(t.params.get(k, "-")) for k in knobs]
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
    with written_file(dest) as local:  # (renamed over it from beside it, or uploaded: a reader never sees half)
        if suffix == ".csv":
            frame.to_csv(local, index=False)
        elif suffix == ".parquet":
            frame.to_parquet(local, index=False)
        else:
            frame.to_json(local, orient="records", indent=1)
    return dest
