"""Pre-flight checks, made before Ray starts and shared by ``raycse train`` and ``raycse tune``: anything a
user can fix is refused in one line instead of failing in a worker, or after the training.

- The run's inputs (:func:`check_inputs`): the config, the optional packages it needs, what this machine's
  private Ray could give it, the corpus, the model and the selection data, and where it writes.
- The disks a run writes to: a run that would fill a disk is refused. Each checkpoint holds the model's
  export, every tensor of the module (SG-OPT's frozen copy included) and the optimizer's two moments, about
  ``CHECKPOINT_MODEL_COPIES`` times the model's weights; Ray Train keeps ``train.keep_checkpoints`` of them
  and writes one more before it drops the oldest. The published output holds one copy of the model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import torch

from raycse.config import RunConfig
from raycse.errors import ConfigError, RaycseError
from raycse.evaluation.selection import load_selection
from raycse.model.loading import resolve_model
from raycse.platform import object_store
from raycse.platform.redact import refuse_credentials
from raycse.platform.staging import check_not_inside
from raycse.train import tracking as tracking_mod
from raycse.train.memory import check_fits
from raycse.train.model_checks import check_models, check_source_models, text_sample
from raycse.train.module import check_model_fits_objective

CHECKPOINT_MODEL_COPIES = 5  # model export + module tensors (up to 2 with SG-OPT's copy) + Adam's 2 moments
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
MB = 1 << 20


def model_bytes(model_path: str) -> int:
    """The bytes of a local model's weight files (0 for a hub name: its size is not known here)."""
    root = Path(model_path)
    if not root.is_dir():
        return 0
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def _existing(path: Path) -> Optional[Path]:
    """``path``, or its nearest ancestor that exists: where it is or would be created."""
    return next((c for c in [path, *path.parents] if c.exists()), None)


def free_bytes(path: Path) -> Optional[int]:
    """Free bytes on the filesystem that ``path`` is or would be created on, or None if none can be asked."""
    where = _existing(path)
    try:
        usage = shutil.disk_usage(where) if where is not None else None
    except OSError:
        return None
    return usage.free if usage and usage.total else None  # (a size of 0: /proc and the like, not a disk)


def _device(path: Path):
    where = _existing(path)
    try:
        return os.stat(where).st_dev if where is not None else str(path)
    except OSError:
        return str(where)


def check_free_space(model_path: str, output: Optional[Path], storage_path: Optional[str], keep: int) -> None:
    """Refuse a run whose output or checkpoints would not fit the free space of their filesystems.
    ``output``: the local output directory (None when it goes to object storage); ``storage_path``:
    a local ``--storage-path``, or None for the default (inside the output's staging directory)."""
    size = model_bytes(model_path)
    if not size:
        return
    storage = Path(storage_path) if storage_path and "://" not in storage_path else (None if storage_path else output)
    demands = [(output, size, f"the model {size / MB:.0f} MB"),
               (storage, (keep + 1) * CHECKPOINT_MODEL_COPIES * size,
                f"{keep + 1} checkpoints of {CHECKPOINT_MODEL_COPIES * size / MB:.0f} MB")]
    places: dict = {}  # filesystem -> [its first path, bytes written there, what they are]
    for path, need, what in demands:
        if path is not None:
            place = places.setdefault(_device(path), [path, 0, []])
            place[1] += need
            place[2].append(what)
    for path, need, what in places.values():
        free = free_bytes(path)
        if free is not None and free < need:
            flag = "--output" if path == output else "--storage-path"
            raise ConfigError(f"{flag} {path}: {free / MB:.0f} MB free on its filesystem, and this run writes about "
                              f"{need / MB:.0f} MB there ({' + '.join(what)}); free space, lower "
                              f"train.keep_checkpoints, or choose another {flag}")


def check_local_gpus(t, gpus: float) -> None:
    """A run on this machine's private Ray (no RAY_ADDRESS) gets no more GPUs than ``gpus``, those
    found here (by torch before Ray starts, by Ray after)."""
    need = t.gpus_needed()
    if t.use_gpu and gpus < need:
        share = f" at {t.gpu_share:g} GPU each" if t.gpus_per_worker is not None else ""
        raise ConfigError(f"--use-gpu with {t.num_workers} worker(s){share} needs {need} GPU(s) and this machine "
                          f"has {gpus:g}; drop --use-gpu, lower --num-workers or --gpus-per-worker, or set "
                          f"RAY_ADDRESS to a cluster with GPUs")


def check_local_cpus(t, cpus: int) -> None:
    """A run on this machine's private Ray cannot get more CPUs than the machine has: refused now,
    not after every worker-start attempt has waited out its timeout."""
    if t.cpus_per_worker is not None and t.cpus_per_worker * t.num_workers > cpus:
        raise ConfigError(f"--cpus-per-worker {t.cpus_per_worker:g} x {t.num_workers} worker(s) needs "
                          f"{t.cpus_per_worker * t.num_workers:g} CPUs and this machine has {cpus}; lower "
                          f"--cpus-per-worker or --num-workers, or set RAY_ADDRESS to a larger cluster")


def check_extras(run: RunConfig) -> None:
    """The optional packages this run needs, before anything starts."""
    from raycse.errors import require, require_installed

    from raycse.config.grouping import strategy_requires

    for sub in list(run.source_runs().values()) or [run]:  # (a mixture: each source's grouping)
        for module, installs in strategy_requires(sub.grouping.strategy).items():
            require_installed(module, installs, f"--grouping {sub.grouping.strategy}")
    selection = run.eval.selection()[0]
    if selection == "beir":
        require("faiss", "grouping", "--eval-metric beir:...")
    if selection == "mteb":
        require("mteb", "mteb", "--eval-metric mteb:...")
    if run.data.format == "hf":
        require("datasets", "hf", "--format hf")
    if run.model.lora:
        require("peft", "peft", "--lora")
    if run.model.attention == "flash_attention_2":
        require_installed("flash_attn", "flash-attn", "--attention flash_attention_2")
    tracking_mod.check(run.train.tracking)


def starts_private_ray() -> bool:
    """Whether :func:`ensure_ray` will start a private local Ray (no RAY_ADDRESS, none joined yet)."""
    import ray

    return not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")


def check_data_fits_objective(run: RunConfig) -> None:
    objective = run.build_objective()
    accepts = objective.accepts  # HiCL's depends on its base
    if run.data.is_pairs and "pairs" not in accepts:
        raise ConfigError(f"objective '{run.objective.name}' trains on single sentences; drop data.pair_column "
                          f"(or choose a pair objective: simcse (supervised) or bsc)")
    if not run.data.is_pairs and "single" not in accepts:
        raise ConfigError(f"objective '{run.objective.name}' needs pairs: set data.pair_column (and label_column)")
    if run.data.negative_column and not objective.takes_negatives:
        raise ConfigError(f"objective '{run.objective.name}' does not use hard negatives; drop data.negative_column "
                          f"or choose simcse (supervised) or bsc")


def check_inputs(run: RunConfig, overwrite: bool, storage_path: Optional[str] = None, in_memory: bool = False
                 ) -> tuple[RunConfig, str, object, Optional[str], Optional[list]]:
    """Fail on anything a user can fix before Ray starts; the resolved run (frozen, a local model's path made
    absolute), the resolved model path, the model-selection data (or None), the output URI (None for a local
    output) and the corpus's sources (None for a dataset named by a hub id or handed over as an object,
    ``in_memory``)."""
    run = run.resolved()  # (validated once: the CLI's run comes resolved)
    check_extras(run)
    if starts_private_ray():  # what torch sees here is all a private Ray could get: say so before starting it
        check_local_gpus(run.train, torch.cuda.device_count())
        check_local_cpus(run.train, os.cpu_count() or 1)
    by_source = check_corpora_of(run, in_memory)
    sources = ([f for found in by_source.values() for f in found or []] or None if run.data.is_mixture
               else by_source[None])
    refuse_credentials("--storage-path", storage_path)
    check_apart_from_output(run, storage_path)
    if storage_path and object_store.is_uri(storage_path):
        object_store.check_usable(storage_path)  # else Train's controller fails on it, with a traceback
    model_path = resolve_model(run.model.name_or_path, run.model.trust_remote_code)
    local_model = Path(os.path.expanduser(run.model.name_or_path)).exists()
    # a relative path means nothing in a worker's directory
    run = run.resolved({"model.name_or_path": model_path} if local_model else None)
    dev = load_selection(run.eval)  # the model-selection data (STS-B dev or BEIR)
    first = next(iter(by_source))  # (a mixture: its first source's sentences)
    sample = text_sample(run.source_runs()[first] if first else run, by_source[first], dev)
    run = check_source_models(check_models(run, model_path, sample), model_path, sample)
    for name, sub in (run.source_runs() or {None: run}).items():
        if by_source[name]:
            with said_of(name):
                check_one_global_batch(sub, by_source[name])
    check_model_fits_objective(run, model_path)
    check_fits(run, model_path)  # (each worker's memory, estimated)
    remote = run.output_dir if object_store.is_uri(run.output_dir) else None
    # (an output on object storage is built in the system's temporary directory first)
    local_out = Path(tempfile.gettempdir()) if remote else Path(os.path.expanduser(run.output_dir)).resolve()
    check_free_space(model_path, local_out, storage_path, run.train.keep_checkpoints)
    if remote and object_store.prefix_exists(remote):
        if not overwrite:
            raise ConfigError(f"output {remote} already exists and is not empty; choose another --output or pass "
                              f"--overwrite")
        object_store.check_replaceable_prefix(remote)
    return run, model_path, dev, remote, sources


def check_corpora_of(run: RunConfig, in_memory: bool) -> dict:
    """Each corpus the run reads (a mixture's: each source's) named, there, not empty, and fitting its objective;
    each one's files (None for a dataset named by a hub id or handed over as an object), by source name (None: the
    run's one corpus)."""
    from raycse.config.sources import check_corpora
    from raycse.data.dataset import check_hub_dataset, check_not_empty, resolve_sources

    if not run.data.corpus and not run.data.is_mixture:
        raise ConfigError("no corpus given: pass --corpus FILE (text, .jsonl or .parquet) or set data.corpus")
    if run.data.is_mixture and in_memory:
        raise ConfigError("a corpus handed over as an object goes alone; give data.sources as paths or URIs")
    check_corpora(run.data.sources)
    by_source = {}
    for name, sub in (run.source_runs() or {None: run}).items():
        with said_of(name):
            check_data_fits_objective(sub)
            found = None if sub.data.format == "hf" or in_memory else resolve_sources(sub.data.corpus)  # a missing file
            if found:
                check_not_empty(found)
            elif not in_memory:
                check_hub_dataset(sub.data)
        by_source[name] = found
    return by_source


@contextmanager
def said_of(source: Optional[str]):
    """A refusal about a mixture's source names it (``source {name}: ...``)."""
    try:
        yield
    except RaycseError as exc:
        if source is None:
            raise
        raise type(exc)(f"source {source}: {exc}") from None


def check_one_global_batch(run: RunConfig, sources: list) -> None:
    """Refuse, before Ray starts, a local corpus with fewer usable examples than one global batch
    (batch size x workers): the read stops as soon as it has that many, so a large corpus costs a
    batch's reading. Left to the run where the objective adds rows (CompCSE) or a source is remote."""
    from raycse.data.corpus import CorpusStats, file_examples
    from raycse.data.dataset import columns_of
    from raycse.errors import DataError
    from raycse.train.prepare import row_expander

    t = run.train
    need = t.batch_size * t.num_workers
    if any("://" in s for s in sources) or row_expander(run):
        return
    found, stats = 0, CorpusStats()
    for src in sources:
        for _ in file_examples(src, run.data.format, columns_of(run.data), run.data.max_chars,
                               run.data.on_decode_error, stats):
            found += 1
            if found >= need:
                return
    blank = f" ({stats.empty_dropped} line(s) without text dropped)" if stats.empty_dropped else ""
    raise DataError(f"the corpus has {found} usable example(s){blank}, fewer than one global batch "
                    f"({t.batch_size} x {t.num_workers} worker(s)); lower --batch-size or --num-workers, or add text")


def check_run_name(run_name: str) -> None:
    """``--run-name`` names a folder under ``--storage-path``: one plain name, never a path out of it."""
    if not run_name or not all(ch.isalnum() or ch in "-_." for ch in run_name) or run_name[0] == ".":
        raise ConfigError(f"--run-name must be letters, digits, '-', '_' or '.' (not first), got {run_name!r}")


def resolve_storage_path(storage_path: Optional[str]) -> Optional[str]:
    """``--storage-path`` as Ray Train takes it: a URI as given, a local path absolute (resolved against
    the working directory, as ``--output`` is) and refused now, before Ray starts, if it is a file."""
    if not storage_path or object_store.is_uri(storage_path):
        return storage_path
    path = Path(os.path.expanduser(storage_path)).resolve()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--storage-path {storage_path} is a file; give a directory for the checkpoints")
    return str(path)


def check_apart_from_output(run: RunConfig, storage_path: Optional[str]) -> None:
    """Nothing the run reads, and not its checkpoints, inside the local output directory it publishes."""
    if object_store.is_uri(run.output_dir):
        return
    kind, directory, _ = run.eval.selection()
    if kind == "mteb":
        directory = run.eval.mteb_task().directory
    from raycse.grouping.references import INITIAL

    guide = run.model.guide if run.model.guide != INITIAL else None
    check_not_inside(run.output_dir, "--output",
                     {"--corpus": run.data.corpus, **{f"data.sources.{n}.{k}": s.get(k) for n, s in run.data.sources.items()
                                                      for k in ("corpus", "teacher", "guide") if s.get(k) != INITIAL},
                      "--model": run.model.name_or_path, "--teacher": run.model.teacher,
                      "--guide": guide, "--stsb-dev": run.eval.resolved_stsb_dev(), "--eval-metric": directory},
                     writes={"--storage-path": storage_path})
