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
from pathlib import Path
from typing import Optional


def cache_file() -> str:
    """Where the scores are kept; decided on the driver (its environment) and used by rank 0."""
    return str(_cache_file())


def _cache_file() -> Path:
    from raycse.platform.caches import cache_dir

    return cache_dir() / "initial_scores.json"


def data_digest(selection) -> str:
    """A digest of the selection data's content (STS pairs and gold scores, a BEIR split, or an MTEB task's
    data)."""
    h = hashlib.sha256(selection.key.encode())
    if selection.mteb is not None:
        h.update(selection.mteb.digest().encode())
    elif selection.sts is not None:
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

    from raycse.platform.machine import describe

    if run.model.resolved_mlp_head == "always":
        return None
    from raycse.platform.caches import model_stamp

    parts = {"model": model_stamp(model_path),
             "encoder": run.to_dict()["model"], "objective": run.objective.name,
             "eval": [run.eval.precision, run.eval.batch_size, run.train.precision],
             "data": data_digest(selection), "machine": describe(), "torch": torch.__version__}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def lookup(cache_key: Optional[str], path: str) -> Optional[float]:
    from raycse.platform.caches import read_json_cache

    value = read_json_cache(Path(path)).get(cache_key) if cache_key is not None else None
    return float(value) if isinstance(value, (int, float)) else None


def store(cache_key: Optional[str], score: float, path: str) -> None:
    from raycse.platform.caches import read_json_cache, write_json_cache

    if cache_key is None:
        return
    cache = read_json_cache(Path(path))
    cache[cache_key] = float(score)
    write_json_cache(Path(path), cache)
