"""The untrained model's selection score, remembered per machine (``~/.cache/raycse/initial_scores.json``).

Every run scores its starting model before the first step (the "before" of "before -> best", the
model card's first row). That score is a function of the model's files, the selection data and the
evaluation settings, not of the run: the same base model on the same dev set gives the same number
in every run and every Tune trial, and on a 2-core machine it costs 10-20 s of each command. So the
first run computes it and later runs read it back; the log says when a score was read back.

The key holds everything the number depends on: the model's files (path, size, mtime), the
encoder's settings, the selection data's content, the evaluation precision and batch size, and
the machine and torch version (kernels round differently). ``RAYCSE_CACHE`` moves the directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional


def cache_file() -> str:
    """Where the scores are kept; decided on the driver (its environment) and used by rank 0."""
    return str(_cache_file())


def _cache_file() -> Path:
    return Path(os.environ.get("RAYCSE_CACHE", Path.home() / ".cache" / "raycse")) / "initial_scores.json"


def _files_stamp(model_path: str) -> list:
    root = Path(model_path)
    if not root.is_dir():  # a hub name resolved from the HF cache: its name pins the revision in use
        return [model_path]
    return sorted([str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns]
                  for p in root.rglob("*") if p.is_file())


def data_digest(selection) -> str:
    """A digest of the selection data's content (STS pairs and gold scores, or a BEIR split)."""
    h = hashlib.sha256(selection.key.encode())
    if selection.sts is not None:
        sts = selection.sts
        h.update(json.dumps([list(sts.sent1), list(sts.sent2), [float(x) for x in sts.gold]]).encode())
    else:
        b = selection.beir
        h.update(json.dumps([b.doc_ids, b.docs, b.query_ids, b.queries,
                             sorted((q, sorted(d.items())) for q, d in b.qrels.items()), selection.beir_metric]).encode())
    return h.hexdigest()


def key(model_path: str, run, selection) -> Optional[str]:
    """The cache key of ``run``'s starting score, or None where the score depends on the run's seed
    (an MLP head used at evaluation is freshly initialised)."""
    import torch

    from raycse.machine import describe

    if run.model.resolved_mlp_head == "always":
        return None
    parts = {"model": [str(Path(model_path).resolve()) if Path(model_path).exists() else model_path,
                       _files_stamp(model_path)],
             "encoder": run.to_dict()["model"], "objective": run.objective.name,
             "eval": [run.eval.precision, run.eval.batch_size, run.train.precision],
             "data": data_digest(selection), "machine": describe(), "torch": torch.__version__}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def lookup(cache_key: Optional[str], path: str) -> Optional[float]:
    if cache_key is None:
        return None
    try:
        value = json.loads(Path(path).read_text()).get(cache_key)
    except (OSError, ValueError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def store(cache_key: Optional[str], score: float, path: str) -> None:
    if cache_key is None:
        return
    path = Path(path)
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    cache[cache_key] = float(score)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        tmp.replace(path)  # whole or not at all; concurrent writers can only lose an entry
    except OSError:  # a read-only home: the score still serves this run
        pass
