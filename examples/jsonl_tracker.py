"""An experiment tracker of your own, outside raycse: each training run's metrics as JSON lines in a
local folder, one file per run (``DIR/<run name>.jsonl``), readable with pandas or ``jq``:

    {"event": "open", "name": "my-run", "params": {...the resolved config...}}
    {"event": "log", "step": 10, "loss": 2.31, "lr": 4.9e-05, ...}
    {"event": "close", "ok": true, "final": {"best_stsb_dev_spearman": 81.2}}

Register it under a kind from your own package's pyproject.toml, then name that kind in ``--tracking``:

    [project.entry-points."raycse.trackers"]
    jsonl = "my_pkg.jsonl_tracker:JsonlTracker"

    raycse train --tracking jsonl:runs/metrics ...

What a tracker is: ``check``, ``open``, ``sink`` (rank 0's ``log(scalars, step)`` and ``close()``),
``log_model``, ``close`` and ``tune_callback``, on ``raycse.api.Tracker`` (each but ``sink``
has a default). ``sink`` runs in the training worker: the folder must be one every node can write (a
shared file system), as TensorBoard's is.
"""

from __future__ import annotations

import json
import os

from raycse.api import Tracker


def _append(path: str, record: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


class JsonlTracker(Tracker):
    kind = "jsonl"

    def open(self, target, name, params):
        tracking = super().open(target, name, params)
        _append(os.path.join(target, f"{name}.jsonl"), {"event": "open", "name": name, "params": params})
        return tracking

    def sink(self, tracking):
        return _Sink(os.path.join(tracking.target, f"{tracking.name}.jsonl"))

    def close(self, tracking, ok, final=None):
        _append(os.path.join(tracking.target, f"{tracking.name}.jsonl"),
                {"event": "close", "ok": ok, "final": final or {}})


class _Sink:
    def __init__(self, path: str):
        self.path = path

    def log(self, scalars: dict, step: int) -> None:
        _append(self.path, {"event": "log", "step": step, **scalars})

    def close(self) -> None:
        pass
