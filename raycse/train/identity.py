"""A run resumes only itself.

Ray Train resumes whatever checkpoints it finds under ``STORAGE/RUN_NAME``, so two different commands
given the same ``--storage-path`` (and the default run name) were one run to it: the second resumed
the first's weights and published them under its own config. Before a fit starts, what defines the
run (its resolved config, less the settings that change how it is carried out rather than what it
trains, and the corpus's identity: each source file with its size and modification time) is
compared with the record beside the checkpoints, ``raycse_run.json``. A different run is refused
before Ray starts, naming the keys that differ; the same one resumes. The record is written before
the first checkpoint and holds no credential (:mod:`raycse.platform.redact`).

Torch-free.
"""

from __future__ import annotations

import json
import os
from typing import Optional

from raycse.errors import ConfigError
from raycse.platform import object_store
from raycse.platform.redact import redact, redact_obj

RECORD = "raycse_run.json"
# Keys a rerun may change and still resume: where results go, logging, resources and waits, how
# often and how checkpoints are taken and travel (none changes a batch, a loss or a weight), and the
# run's length: more steps or epochs continue the same run (each epoch's batch order is seeded by
# its own number, so the steps already taken stay what they were).
OPERATIONAL = frozenset({
    "output_dir", "train.tracking", "train.log_steps", "train.profile_steps", "train.record_batches",
    "train.worker_start_timeout_s", "train.worker_start_attempts", "train.checkpoint_upload",
    "train.checkpoint_upload_timeout_s", "train.collate_ahead", "train.cpus_per_worker", "train.max_failures",
    "train.keep_checkpoints", "train.checkpoint_steps", "eval.eval_steps", "eval.before_training",
    "eval.batch_size", "train.max_steps", "train.epochs",
    # how the model is held (whole or sharded, offloaded), whether activations are recomputed and which attention
    # kernels run: the same gradients either way, and a checkpoint of either kind loads into any of them
    "train.sharding", "train.fsdp_offload", "train.gradient_checkpointing", "model.attention",
})
# A run may resume on another worker count with the same global batch (workers x batch per worker): its steps
# take the same rows in the same order (batch b goes to worker b % N at step b // N).
GLOBAL_BATCH = ("train.num_workers", "train.batch_size")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _file_identity(path: str) -> list:
    if object_store.is_uri(path):
        import pyarrow.fs as pafs

        fs, root = object_store.filesystem(path)
        info = fs.get_file_info(root)
        infos = ([info] if info.type == pafs.FileType.File
                 else fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)))
        return sorted([redact(f"{path.split('://', 1)[0]}://{i.path}"), i.size, i.mtime_ns]
                      for i in infos if i.type == pafs.FileType.File)
    st = os.stat(path)
    return [[path, st.st_size, st.st_mtime_ns]]


def definition(run, sources: Optional[list]) -> dict:
    """What defines ``run``: its config keys (flat, dotted, redacted) and its corpus files' identity
    (``sources``: the resolved files or URIs; None for a dataset named by a hub id)."""
    keys = {k: v for k, v in _flat(redact_obj(run.to_dict())).items() if k not in OPERATIONAL}
    files = [item for src in sources or [] for item in _file_identity(src)]
    return {**keys, "corpus.files": json.loads(json.dumps(files))}


def _has_checkpoints(run_dir: str) -> bool:
    return any(is_dir and name.startswith("checkpoint_") for name, is_dir in object_store.list_dir(run_dir))


def _read(run_dir: str) -> Optional[dict]:
    try:
        text = object_store.read_text(object_store.join(run_dir, RECORD))
    except FileNotFoundError:
        return None
    try:
        return json.loads(text)["definition"]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{redact(object_store.join(run_dir, RECORD))} is damaged; start this run under a new "
                          f"--storage-path or --run-name NAME") from None


def check(storage_path: str, run_name: str, current: dict) -> None:
    """Refuse, before Ray starts, to resume checkpoints under ``storage_path/run_name`` that another
    run wrote (or a run that did not record itself)."""
    run_dir = object_store.join(storage_path, run_name)
    if not _has_checkpoints(run_dir):
        return  # nothing to take over: this run starts afresh (and records itself)
    saved = _read(run_dir)
    where = f"--storage-path {redact(storage_path)} (run name {run_name!r})"
    ways_out = "start this run under a new --storage-path, or name it with --run-name NAME"
    if saved is None:
        raise ConfigError(f"{where} holds checkpoints of a run that did not record what it trains (an older "
                          f"raycse or another tool); {ways_out}")
    differ = sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))
    if set(differ) & set(GLOBAL_BATCH) and _global_batch(saved) == _global_batch(current):
        differ = [k for k in differ if k not in GLOBAL_BATCH]
    if differ:
        shown = ", ".join(differ[:8]) + (f" and {len(differ) - 8} more" if len(differ) > 8 else "")
        raise ConfigError(f"{where} holds checkpoints of another run (different: {shown}); resume it with its "
                          f"own settings, or {ways_out}")


def _global_batch(definition: dict) -> Optional[int]:
    try:
        return int(definition["train.num_workers"]) * int(definition["train.batch_size"])
    except (KeyError, TypeError, ValueError):
        return None


def record(storage_path: str, run_name: str, current: dict) -> None:
    """Write the run's definition beside its checkpoints (before the first one)."""
    run_dir = object_store.join(storage_path, run_name)
    object_store.write_text(object_store.join(run_dir, RECORD), json.dumps({"definition": current}, indent=1, sort_keys=True))
