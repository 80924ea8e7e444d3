"""The Ray Train driver: validate, read the corpus, lay out batches, run ``TorchTrainer.fit``, publish.

Data path: the corpus is read and cleaned by Ray Data (:mod:`raycse.data.dataset`) and numbered;
the batch order of each epoch is grouped and packed into batches of row ids (:mod:`raycse.grouping`)
and handed to the workers with the corpus's blocks, which every worker reads once from the object
store and takes its batches' rows from (one route: :mod:`raycse.grouping.layout`). Strategies that
group by the model's embeddings (knn, cluster) with ``grouping.regroup_every_epoch`` leave the ids
to the workers: they regroup before every epoch with the weights they hold, inside the one running
fit (:mod:`raycse.train.regroup`).

The output directory appears only when a run succeeds: everything is written to a hidden
staging directory beside it and renamed at the end, so a failed or interrupted run never
leaves a half-written model behind.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import yaml

from raycse import storage as objstore  # "storage" is Ray Train's checkpoint path below
from raycse.card import model_card
from raycse.config import RunConfig
from raycse.encoder import probe_tokenizer, resolve_model
from raycse.errors import ConfigError
from raycse.interrupts import Interrupted
from raycse.evaluation import initial_scores
from raycse.evaluation.selection import load_selection
from raycse.objectives import registry
from raycse.outputs import OutputClaim, check_not_inside, claim_output, private_tempdir, publish_claimed
from raycse.redact import redact, redact_obj, refuse_credentials
from raycse.train import checkpoint as ckpt
from raycse.train import identity
from raycse.train import release
from raycse.train import tracking as tracking_mod
from raycse.train.checkpointer import CHECKPOINT_RANK
from raycse.train.loop import train_loop_per_worker
from raycse.train.module import check_model_fits_objective
from raycse.train.plan import FitPlan, TuneHooks, planned_epochs, plan_steps
from raycse.train.preflight import check_free_space
from raycse.train.reporter import SCORE_METRIC
from raycse.train.runtime import cluster_cpus, ensure_ray, setup_ray_data, train_worker_env


@dataclass
class TrainResult:
    output_dir: str  # a local directory or a URI
    model_dir: str
    metrics: dict


def check_local_gpus(t, gpus: float) -> None:
    """A run on this machine's private Ray (no RAY_ADDRESS) gets no more GPUs than ``gpus``, those
    found here (by torch before Ray starts, by Ray after)."""
    need = t.gpus_needed()
    if t.use_gpu and gpus < need:
        share = f" at {t.gpu_share:g} GPU each" if t.gpus_per_worker is not None else ""
        raise ConfigError(f"--use-gpu with {t.num_workers} worker(s){share} needs {need} GPU(s) and this machine "
                          f"has {gpus:g}; drop --use-gpu, lower --num-workers or --gpus-per-worker, or set "
                          f"RAY_ADDRESS to a cluster with GPUs")


def collective_backend(t) -> str:
    """torch.distributed's backend for the run: NCCL for whole GPUs per worker, gloo on CPUs and for
    fractional GPUs (NCCL refuses two ranks on one device; gloo all-reduces CUDA tensors, and the
    contrastive gather routes its all-gather through host memory, raycse.objectives.contrastive)."""
    return "nccl" if t.use_gpu and not t.shares_gpus else "gloo"


def say_devices(t) -> None:
    """One line at start: what each worker holds and which backend its collectives use."""
    if not t.use_gpu:
        return
    backend = collective_backend(t)
    why = (" (workers hold a fraction of a GPU, so two may share a device, which NCCL refuses)"
           if backend == "gloo" else "")
    print(f"[raycse] {t.num_workers} worker(s) x {t.gpu_share:g} GPU; collectives: {backend}{why}", flush=True)


def worker_resources(t, cpus: float) -> dict:
    """What each Train worker reserves."""
    return {"CPU": cpus, **({"GPU": t.gpu_share} if t.use_gpu else {})}


def check_local_cpus(t, cpus: int) -> None:
    """A run on this machine's private Ray cannot get more CPUs than the machine has: refused now,
    not after every worker-start attempt has waited out its timeout."""
    if t.cpus_per_worker is not None and t.cpus_per_worker * t.num_workers > cpus:
        raise ConfigError(f"--cpus-per-worker {t.cpus_per_worker:g} x {t.num_workers} worker(s) needs "
                          f"{t.cpus_per_worker * t.num_workers:g} CPUs and this machine has {cpus}; lower "
                          f"--cpus-per-worker or --num-workers, or set RAY_ADDRESS to a larger cluster")


def check_extras(run: RunConfig) -> None:
    """The optional packages this run needs, before anything starts."""
    from raycse.errors import require

    if run.grouping.strategy in ("knn", "cluster"):
        require("faiss", "grouping", f"--grouping {run.grouping.strategy}")
    if run.eval.selection()[0] == "beir":
        require("faiss", "grouping", "--eval-metric beir:...")
    if run.eval.selection()[0] == "mteb":
        require("mteb", "mteb", "--eval-metric mteb:...")
    if run.data.format == "hf":
        require("datasets", "hf", "--format hf")
    if run.model.lora:
        require("peft", "peft", "--lora")
    tracking_mod.check(run.train.tracking)


def starts_private_ray() -> bool:
    """Whether :func:`ensure_ray` will start a private local Ray (no RAY_ADDRESS, none joined yet)."""
    import ray

    return not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")


def check_data_fits_objective(run: RunConfig) -> None:
    objective = run.objective.build()
    accepts = objective.accepts  # HiCL's depends on its base
    if run.data.is_pairs and "pairs" not in accepts:
        raise ConfigError(f"objective '{run.objective.name}' trains on single sentences; drop data.pair_column "
                          f"(or choose a pair objective: simcse (supervised) or bsc)")
    if not run.data.is_pairs and "single" not in accepts:
        raise ConfigError(f"objective '{run.objective.name}' needs pairs: set data.pair_column (and label_column)")
    if run.data.negative_column and not objective.takes_negatives:
        raise ConfigError(f"objective '{run.objective.name}' does not use hard negatives; drop data.negative_column "
                          f"or choose simcse (supervised) or bsc")


def lay_out_epochs(run: RunConfig, corpus, spe: int, total: int, embed_from: str) -> tuple[list, list]:
    """The fit's epochs as layouts of row ids (raycse.grouping.layout) and each epoch's grouping log.
    Strategies that group by embeddings embed the corpus once, with ``embed_from``."""
    from raycse.grouping import layouts, plan_epoch
    from raycse.grouping.embed import embed_corpus, grouping_prompt_name

    t, prompts = run.train, run.data.prompts
    vectors = functools.lru_cache(maxsize=1)(
        lambda: embed_corpus(corpus, embed_from, run.model.max_length, run.grouping.embed_actors,
                             run.grouping.embed_batch_size, t.use_gpu, t.precision, run.grouping.by,
                             t.gpu_share or 1.0, grouping_prompt_name(prompts, run.grouping.by), prompts))
    plans = []
    for epoch in planned_epochs(run, spe, total):
        first = epoch * spe
        plan = plan_epoch(corpus, run.grouping, t.batch_size, t.num_workers, t.seed, epoch, first,
                          vectors=vectors, max_steps=total - first)
        plans.append(plan)
        if run.grouping.strategy not in ("random", "none"):
            print(f"[raycse] epoch {epoch}: {run.grouping.strategy} grouping: {plan.info['groups']} groups, "
                  f"mean size {plan.info['mean_group_size']:.2f}, {plan.info['split_groups']} split"
                  + (f", kNN {plan.info['knn_method']} recall {plan.info['knn_recall']:.3f}"
                     if plan.info.get("knn_recall") is not None else ""), flush=True)
    return layouts(plans), [{"epoch": p.epoch, **p.info} for p in plans]


def fit_data(run: RunConfig, corpus, prepared, spe: int, total: int, model_path: str) -> tuple:
    """(the numbered corpus's Arrow blocks, the epochs' layouts or None, the grouping log so far): read
    and laid out before this run (``prepared``), left for the workers to regroup epoch by epoch
    (None), or laid out now with the starting model."""
    if prepared is not None:
        return prepared.blocks, prepared.layouts, list(prepared.grouping_log)
    if run.grouping.regroups_in_fit:
        return corpus.blocks, None, []
    return (corpus.blocks, *lay_out_epochs(run, corpus, spe, total, model_path))


def report_resume(resumed: Optional[dict]) -> None:
    """Say where the fit's last (re)start took its state from and which damaged checkpoints it passed over."""
    if not resumed:
        return
    for item in resumed.get("skipped") or []:
        print(f"[raycse] warning: skipped damaged checkpoint {item}", flush=True)
    print(f"[raycse] resumed from step {resumed['step']} ({resumed['path']})", flush=True)


def row_expander(run: RunConfig):
    """The objective's extra rows per corpus row (CompCSE's subsampling), or None."""
    cls = registry.get(run.objective.name)
    return cls.row_expander(run.objective.typed())


def objective_knobs(run: RunConfig) -> dict:
    """Every knob of the run's objective, its defaults included (for the record and the model card)."""
    return {**registry.knobs(run.objective.name), **run.objective.params}


def load_run_corpus(run: RunConfig, source=None, paths: Optional[list] = None):
    """``run``'s corpus as the train loop sees it: read, cleaned, expanded by the objective, numbered.
    The read waits for a free CPU as long as the run's workers would wait to start. ``source``: a
    dataset object read instead of ``run.data.corpus``; ``paths``: its files, resolved by check_inputs."""
    from raycse.data.dataset import load_corpus

    t = run.train
    return load_corpus(run.data, t.seed, expand=row_expander(run),
                       cpu_wait_s=t.worker_start_timeout_s * t.worker_start_attempts,
                       cpu_wait_knob="train.worker_start_timeout_s", shuffle=run.grouping.strategy != "none",
                       source=source, paths=paths)


def data_key(run: RunConfig) -> str:
    """Everything a run's batch rows depend on: two runs with equal keys train on the same batches."""
    d = run.to_dict()
    train = {k: d["train"][k] for k in ("seed", "batch_size", "num_workers", "epochs", "max_steps", "use_gpu",
                                         "precision")}
    expand = row_expander(run)
    rows = None if expand is None else sorted(expand.keywords.items())
    return json.dumps({"data": d["data"], "grouping": d["grouping"], "model": d["model"], "train": train,
                       "rows": rows}, sort_keys=True, default=str)


@dataclass
class PreparedData:
    """A run's corpus read and its batches laid out once, for runs that differ only in knobs that do
    not touch the data (a Tune experiment's trials of one seed). Holds the corpus's blocks in the
    object store: the process that built it owns them and must outlive the runs that use it."""

    key: str
    stats: object  # raycse.data.dataset.CorpusStats
    num_examples: int
    blocks: list  # the numbered corpus's Arrow blocks (ObjectRefs)
    layouts: list  # raycse.grouping.layout.Layout per epoch
    grouping_log: list


def prepare_data(run: RunConfig) -> Optional[PreparedData]:
    """Read and lay out ``run``'s data for :func:`train` (``prepared=``); None when the run needs more
    than one fit (groupings re-embedded every epoch depend on the model being trained)."""
    run.validate()
    ensure_ray()
    setup_ray_data()
    corpus = load_run_corpus(run)
    spe, total = plan_steps(run, corpus.num_examples)
    if run.grouping.regroups_in_fit:
        return None  # every trial's workers group with their own weights
    layouts, logs = lay_out_epochs(run, corpus, spe, total, resolve_model(run.model.name_or_path))
    return PreparedData(data_key(run), corpus.stats, corpus.num_examples, corpus.blocks, layouts, logs)


def train(run: RunConfig, overwrite: bool = False, storage_path: Optional[str] = None,
          run_name: str = "train", hooks: Optional[TuneHooks] = None, source=None) -> TrainResult:
    """Train ``run`` on Ray Train and return where the best model was saved.

    ``source``: the corpus as an object (a ``ray.data.Dataset`` or ``datasets.Dataset``) instead of
    ``run.data.corpus``, which then only names it in the log and the model card.

    ``storage_path``: where Ray Train keeps checkpoints (default: inside the staging directory,
    removed on success); a fixed path plus ``run_name`` lets a restarted driver resume from the
    latest whole checkpoint there. ``hooks``: a Tune trial's needs (:class:`raycse.train.plan.TuneHooks`:
    a rung's last step, extra scored steps, the score sink, the experiment's prepared data, and the
    registry of live runs, by default this driver process's, :func:`raycse.train.release.driver_registry`).
    Every fit's workers and placement group are released before this returns or raises.
    """
    import ray

    hooks = hooks or TuneHooks()

    if source is not None:
        run.data.corpus = run.data.corpus or f"<{type(source).__name__}>"
    storage_path = resolve_storage_path(storage_path)
    model_path, dev, remote, sources = check_inputs(run, overwrite, storage_path, source is not None)
    if storage_path:  # before Ray starts: these checkpoints are this run's, or there are none yet
        definition = identity.definition(run, sources)
        identity.check(storage_path, run_name, definition)
    # an output on object storage is built in a local directory and published at the end
    local_root = private_tempdir("raycse-output-") if remote else None
    out = local_root / "out" if remote else Path(os.path.expanduser(run.output_dir)).resolve()
    claim = claim_output(out, overwrite)
    staging = claim.staging
    final = remote or str(out)
    tracking: tuple = ()
    registry, run_key = None, None  # (known once Ray is up: what an interruption names its step from)
    try:
        tracking = tracking_mod.open_runs(run.train.tracking, out.name, run.to_dict())  # unreachable: fails now
        from raycse.machine import describe

        print(f"[raycse] driver on {describe()}", flush=True)  # the first line of the log names the machine
        if ensure_ray():
            check_local_gpus(run.train, ray.cluster_resources().get("GPU", 0))  # not after the workers' start timeout
        setup_ray_data()
        registry = hooks.registry or release.driver_registry()
        run_key = hooks.run_key or f"train-{staging.name}"
        prepared = hooks.prepared if hooks.prepared is not None and hooks.prepared.key == data_key(run) else None
        corpus, stats, num_examples = read_corpus(run, prepared, source, sources)  # (files resolved once)
        spe, total = plan_steps(run, num_examples)
        say_when_unscored(run, dev)
        say_devices(run.train)
        blocks, layouts, grouping_log = fit_data(run, corpus, prepared, spe, total, model_path)
        cpus = run.train.cpus_per_worker or max(1, cluster_cpus() // run.train.num_workers)
        storage = storage_path or str(staging / "ray")
        if storage_path:
            identity.record(storage_path, run_name, definition)
        plan = FitPlan(run=run, total_steps=total, stop_at=min(total, hooks.stop_at or total), steps_per_epoch=spe,
                       regroup_in_fit=run.grouping.regroups_in_fit, checkpoint_dir=objstore.join(storage, run_name),
                       threads=max(1, round(cpus)), dev=ray.put(dev) if dev is not None else None,
                       initial_key=initial_scores.key(model_path, run, dev) if dev is not None else None,
                       initial_file=initial_scores.cache_file(), eval_at=tuple(int(s) for s in hooks.eval_at),
                       score_sink=hooks.score_sink, tracking=tracking, corpus=tuple(blocks),
                       layouts=ray.put(layouts) if layouts is not None else None, progress=(registry, run_key))
        trainer = build_trainer(plan, cpus, storage, run_name, release.RegisterRun(registry, run_key),
                                dev is not None)
        t_fit = time.perf_counter()
        result = _fit_and_release(trainer, run.train, registry, run_key, worker_resources(run.train, cpus))
        fit_seconds = [time.perf_counter() - t_fit]
        grouping_log += (result.metrics or {}).get("grouping") or []  # (the in-fit regroups' record)
        report_resume((result.metrics or {}).get("resumed"))
        best, best_metrics = best_checkpoint(result, dev)
        summary = {"best": best_metrics, "last": result.metrics, "corpus": stats.__dict__,
                   "num_examples": num_examples, "steps_per_epoch": spe, "grouping": grouping_log,
                   "data_prepared_before": prepared is not None,
                   "fit_seconds": fit_seconds,
                   "objective_knobs": objective_knobs(run), "score_key": run.eval.score_key()}
        write_output(staging, run, best, summary, final)
        _log_model(tracking, staging / "model")
        publish(claim, remote, overwrite)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        _close_tracking(tracking, ok=False)
        if isinstance(exc, Interrupted) and not exc.detail:
            exc.detail = interrupted_detail(run, storage_path, run_name, registry, run_key, final)
        raise
    finally:
        if local_root is not None:
            shutil.rmtree(local_root, ignore_errors=True)
    _close_tracking(tracking, ok=True, final={f"best_{k}": v for k, v in best_metrics.items()
                                              if k == run.eval.score_key()})
    return TrainResult(final, f"{final}/model", redact_obj(summary))


def interrupted_detail(run: RunConfig, storage_path: Optional[str], run_name: str, registry, run_key: Optional[str],
                       out: str) -> str:
    """What an interrupted run reached and how to go on: the last logged step, and the step a rerun
    resumes from (checkpoints in a --storage-path), or that there is none to resume."""
    import ray

    step = None
    if registry is not None and run_key is not None:
        try:
            step = ray.get(registry.last_step.remote(run_key), timeout=5)
        except Exception:  # noqa: BLE001 - the line is said without it
            step = None
    at = f" at step {step}" if step else ""
    if not storage_path:
        return (f"stopped{at}; nothing was written to {out}; pass --storage-path DIR to make a run resumable after "
                f"an interruption")
    found = None
    try:
        found = ckpt.latest_valid(objstore.join(storage_path, run_name))
    except Exception:  # noqa: BLE001 - unreadable storage: no step to name
        found = None
    resume = f"resume from step {found[0]}" if found else "start again (no whole checkpoint was saved yet)"
    return f"stopped{at}; nothing was written to {out}; rerun the same command to {resume}"


def check_inputs(run: RunConfig, overwrite: bool, storage_path: Optional[str] = None, in_memory: bool = False
                 ) -> tuple[str, object, Optional[str], Optional[list]]:
    """Fail on anything a user can fix before Ray starts; the resolved model path, the model-selection
    data (or None), the output URI (None for a local output) and the corpus's sources (None for a
    dataset named by a hub id or handed over as an object, ``in_memory``)."""
    from raycse.data.dataset import check_hub_dataset, check_not_empty, resolve_sources

    run.validate()
    check_extras(run)
    if starts_private_ray():  # what torch sees here is all a private Ray could get: say so before starting it
        check_local_gpus(run.train, torch.cuda.device_count())
        check_local_cpus(run.train, os.cpu_count() or 1)
    if not run.data.corpus:
        raise ConfigError("no corpus given: pass --corpus FILE (text, .jsonl or .parquet) or set data.corpus")
    check_data_fits_objective(run)
    sources = None if run.data.format == "hf" or in_memory else resolve_sources(run.data.corpus)  # a missing file
    if sources:
        check_not_empty(sources)
    elif not in_memory:
        check_hub_dataset(run.data)
    refuse_credentials("--storage-path", storage_path)
    check_apart_from_output(run, storage_path)
    if storage_path and objstore.is_uri(storage_path):
        objstore.check_usable(storage_path)  # else Train's controller fails on it, with a traceback
    model_path = resolve_model(run.model.name_or_path)
    if Path(os.path.expanduser(run.model.name_or_path)).exists():
        run.model.name_or_path = model_path  # a relative path means nothing in a worker's directory
    dev = load_selection(run.eval)  # the model-selection data (STS-B dev or BEIR)
    probe_tokenizer(model_path, text_sample(run, sources, dev))
    check_model_fits_objective(run, model_path)
    remote = run.output_dir if objstore.is_uri(run.output_dir) else None
    # (an output on object storage is built in the system's temporary directory first)
    local_out = Path(tempfile.gettempdir()) if remote else Path(os.path.expanduser(run.output_dir)).resolve()
    check_free_space(model_path, local_out, storage_path, run.train.keep_checkpoints)
    if remote and objstore.prefix_exists(remote):
        if not overwrite:
            raise ConfigError(f"output {remote} already exists and is not empty; choose another --output or pass "
                              f"--overwrite")
        objstore.check_replaceable_prefix(remote)
    return model_path, dev, remote, sources


TOKENIZER_SAMPLE = 64  # sentences of the corpus (and as many of the dev set) the tokenizer is checked on


def text_sample(run: RunConfig, sources: Optional[list], dev) -> list[str]:
    """A few sentences of the run's data, for checks before Ray starts: the first of the corpus's first
    local file, and of the STS-B dev set."""
    from raycse.data.corpus import read_examples
    from raycse.data.dataset import columns_of

    sample: list[str] = []
    if sources and "://" not in sources[0]:
        rows, _ = read_examples(sources[0], run.data.format, columns_of(run.data), run.data.max_chars,
                                run.data.on_decode_error, False, TOKENIZER_SAMPLE)
        sample += [text for row in rows for text in ([row] if isinstance(row, str) else row[:2])]
    if dev is not None and dev.sts is not None:
        sample += list(dev.sts.sent1[:TOKENIZER_SAMPLE])
    return sample


def read_corpus(run: RunConfig, prepared: Optional[PreparedData], source=None, paths: Optional[list] = None):
    """(corpus, its stats, its example count): read now, or from ``prepared`` (corpus None); said in the log."""
    corpus = None if prepared is not None else load_run_corpus(run, source, paths)
    stats = prepared.stats if prepared is not None else corpus.stats
    num_examples = prepared.num_examples if prepared is not None else corpus.num_examples
    print(f"[raycse] corpus {run.data.corpus}: {stats.summary()}"
          + (" (read and laid out once for this experiment)" if prepared is not None else ""), flush=True)
    repeated = stats.repetition_warning(run.data.dedup)
    if repeated:
        print(f"[raycse] warning: {repeated}", flush=True)
    if stats.decode_replaced:
        print(f"[raycse] warning: {stats.decode_replaced} line(s) had undecodable bytes, replaced with U+FFFD "
              f"(set data.on_decode_error: error to refuse them)", flush=True)
    return corpus, stats, num_examples


def say_when_unscored(run: RunConfig, dev) -> None:
    if dev is None:
        why = ("eval.stsb_dev is none" if run.eval.stsb_dev is None or run.eval.stsb_dev.lower() == "none"
               else "no STS-B dev file found (set eval.stsb_dev / --stsb-dev)")
        print(f"[raycse] {why}: training without evaluation, keeping the last checkpoint", flush=True)


def build_trainer(plan: FitPlan, cpus: float, storage: str, run_name: str, register,
                  scored: bool):
    """One ``TorchTrainer`` for every epoch. A restarted driver (same storage and run name) resumes
    inside it: the workers load the furthest whole checkpoint under ``plan.checkpoint_dir``
    (train.resume.latest_in_storage)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig as TrainRunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    t = plan.run.train
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"plan": plan},
        torch_config=TorchConfig(backend=collective_backend(t)),
        scaling_config=ScalingConfig(num_workers=t.num_workers, use_gpu=t.use_gpu,
                                     resources_per_worker=worker_resources(t, cpus)),
        run_config=TrainRunConfig(
            name=run_name, storage_path=storage,
            worker_runtime_env={"env_vars": train_worker_env()},
            # a run that cannot get its workers fails after worker_start_attempts tries
            failure_config=FailureConfig(max_failures=t.max_failures,
                                         controller_failure_limit=t.worker_start_attempts - 1),
            callbacks=[register],
            checkpoint_config=CheckpointConfig(
                num_to_keep=t.keep_checkpoints,
                checkpoint_score_attribute=CHECKPOINT_RANK if scored else None,
                checkpoint_score_order="max"),
        ),
    )


def best_checkpoint(result, dev) -> tuple:
    """(checkpoint, its metrics) of the best-scored checkpoint Ray kept (a resumed run's include the
    earlier fits': Ray restores them from the run's storage), else the last one; a tie goes to the
    earlier step, as Ray's ranking does (:func:`raycse.train.checkpointer.checkpoint_rank`)."""
    best, best_metrics = result.checkpoint, dict(result.metrics or {})
    if dev is not None and result.best_checkpoints:
        scored = [cm for cm in result.best_checkpoints if dev.key in cm[1]]
        if scored:
            best, best_metrics = max(scored, key=lambda cm: (cm[1][dev.key], -int(cm[1].get("step", 0))))
    if best is None:
        raise RuntimeError("training finished without a checkpoint")
    return best, best_metrics


def write_output(staging: Path, run: RunConfig, best, summary: dict, final: str) -> None:
    """The model of ``best``, its card, metrics.json and config.yaml into ``staging``."""
    with best.as_directory() as d:
        shutil.copytree(Path(d) / ckpt.MODEL_DIR, staging / "model")
    summary = redact_obj(json.loads(json.dumps(summary, default=str)))  # no credential of a URI is saved
    config = redact_obj(run.to_dict())
    (staging / "metrics.json").write_text(json.dumps(summary, indent=2))
    (staging / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (staging / "model" / "README.md").write_text(model_card(config, summary, redact(f"{final}/model"),
                                                            files=staging / "model"))
    shutil.rmtree(staging / "ray", ignore_errors=True)


def publish(claim: OutputClaim, remote: Optional[str], overwrite: bool) -> None:
    """The staging directory becomes the output by renames that remove nothing this run did not check
    (raycse.outputs.publish_claimed); then, for an output on object storage, it is uploaded (objects
    under a staging prefix, the manifest last)."""
    publish_claimed(claim)
    if remote:
        objstore.publish(claim.dest, remote, overwrite, parts=("model",))


def resolve_storage_path(storage_path: Optional[str]) -> Optional[str]:
    """``--storage-path`` as Ray Train takes it: a URI as given, a local path absolute (resolved against
    the working directory, as ``--output`` is) and refused now, before Ray starts, if it is a file."""
    if not storage_path or objstore.is_uri(storage_path):
        return storage_path
    path = Path(os.path.expanduser(storage_path)).resolve()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--storage-path {storage_path} is a file; give a directory for the checkpoints")
    return str(path)


def check_apart_from_output(run: RunConfig, storage_path: Optional[str]) -> None:
    """Nothing the run reads, and not its checkpoints, inside the local output directory it publishes."""
    if objstore.is_uri(run.output_dir):
        return
    kind, directory, _ = run.eval.selection()
    if kind == "mteb":
        directory = run.eval.mteb_task().directory
    check_not_inside(run.output_dir, "--output",
                     {"--corpus": run.data.corpus, "--model": run.model.name_or_path, "--stsb-dev": run.eval.resolved_stsb_dev(),
                      "--eval-metric": directory},
                     writes={"--storage-path": storage_path})


def _log_model(tracking: tuple, model_dir: Path) -> None:
    for t in tracking:
        try:
            tracking_mod.log_model(t, model_dir)
        except Exception as exc:  # the model is saved all the same: say so, go on
            print(f"[raycse] warning: could not log the model to the {t.kind} run "
                  f"({redact(str(exc).splitlines()[0][:160])})", flush=True)


def _close_tracking(tracking: tuple, ok: bool, final: Optional[dict] = None) -> None:
    for t in tracking:  # (each one: a tracker that fails to close does not keep the others open)
        try:
            tracking_mod.close_run(t, ok, final)
        except Exception as exc:  # the run itself is done (or failing for its own reason): say so, go on
            print(f"[raycse] warning: could not close the {t.kind} run "
                  f"({redact(str(exc).splitlines()[0][:160])})", flush=True)


@contextlib.contextmanager
def _environ(**values: str):
    """Variables set for the duration of a ``fit``: Ray Train's controller reads RAY_TRAIN_* ones from
    the environment of the process that calls it."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# How often Ray Train's controller polls its workers (Ray's default: 2 s). Reports, the end of the
# run and a dead worker are all seen at a poll: at 2 s a fit ended ~1.5 s after its last step on
# average. 0.5 s costs the controller a few ms a second; it took 2.4 and 4.4 s off a 2-step run in two
# paired runs on 2 CPUs (BENCHMARKS.md, fixed cost, has it with the shuffle setting of
# runtime.setup_ray_data). A value set in the environment wins.
HEALTH_CHECK_INTERVAL_S = "0.5"


def _fit_and_release(trainer, t, registry, run_key: str, per_worker: dict):
    """One ``fit`` whose workers and placement group are gone when it returns or raises.

    Waiting for workers is bounded: Ray Train gives up after ``worker_start_attempts`` tries of
    ``worker_start_timeout_s`` each, and the error then names what holds the cluster."""
    import ray

    if ray.get(registry.is_closed.remote(run_key), timeout=60):
        raise RuntimeError(f"Train run {run_key} was ended (its Tune trial stopped) before this fit started")
    release_s = t.worker_start_timeout_s + release.RELEASE_MARGIN_S
    try:
        with _environ(RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S=str(t.worker_start_timeout_s),
                      RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S",
                                                                       HEALTH_CHECK_INTERVAL_S)):
            result = _fit_in_thread(trainer, registry, run_key, release_s)
        if result.error:
            raise result.error
    except Exception as err:
        clear = release.worker_start_error(err, t.num_workers, per_worker, t.worker_start_timeout_s,
                                           t.worker_start_attempts)
        try:
            release.release(registry, run_key, release_s)
        except release.ReleaseError as leak:
            print(f"[raycse] warning: {leak}", flush=True)
        if clear is not None:
            raise clear from err
        raise
    release.release(registry, run_key, release_s)
    return result


def _fit_in_thread(trainer, registry, run_key: str, release_s: float):
    """``trainer.fit()`` in a thread of its own, the main thread waiting for it. Why: in the main thread
    Ray Train replaces the SIGINT handler with its own, whose abort ended the command with exit 1 and
    no word; here raycse's handler raises :class:`Interrupted` in the main thread, the run is
    released (its controller aborted, its workers and placement group gone), and the interruption
    goes on up."""
    import threading

    box: dict = {}

    def fit() -> None:
        try:
            box["result"] = trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            box["error"] = exc

    thread = threading.Thread(target=fit, name="raycse-fit", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.2)  # (short waits: the main thread handles signals between them)
    except Interrupted:
        try:
            release.release(registry, run_key, release_s)
        except Exception as leak:  # noqa: BLE001 - the command still ends; its Ray is shut down after
            print(f"[raycse] warning: {redact(str(leak))[:300]}", flush=True)
        thread.join(release_s)
        raise
    if "error" in box:
        raise box["error"]
    return box["result"]


def best_score(metrics: dict) -> Optional[float]:
    """The best checkpoint's model-selection score (STS-B dev Spearman or the BEIR metric, x100)."""
    return (metrics.get("best") or {}).get(metrics.get("score_key", SCORE_METRIC))

