"""The Ray Train driver: one run from its config to its published model, in four steps that each live in
a module of their own: the pre-flight checks (:mod:`raycse.train.preflight`, shared with Tune), the data
made ready (:mod:`raycse.train.prepare`), the fit (:mod:`raycse.train.fit`) and the output
(:mod:`raycse.train.publishing`).

Data path: the corpus is read and cleaned by Ray Data (:mod:`raycse.data.dataset`) and numbered;
the batch order of each epoch is grouped and packed into batches of row ids (:mod:`raycse.grouping`)
and handed to the workers with the corpus's blocks, which every worker reads once from the object
store and takes its batches' rows from (one route: :mod:`raycse.grouping.layout`). Strategies that
group by the model's embeddings (knn, cluster) with ``grouping.regroup_every_epoch`` leave the ids
to the workers: they regroup before every epoch with the weights they hold, inside the one running
fit (:mod:`raycse.train.regroup`).

The output directory appears only when a run succeeds: everything is written to a hidden
staging directory beside it and renamed at the end, or uploaded with its manifest last
(raycse.platform.outputs), so a failed or interrupted run never leaves a half-written model behind.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from raycse.config import RunConfig
from raycse.evaluation import initial_scores
from raycse.evaluation.targets import load_targets
from raycse.platform import object_store
from raycse.platform import release
from raycse.platform.capacity import cluster_ceiling, default_cpus_per_worker
from raycse.platform.interrupts import interrupted
from raycse.platform.ray_session import ensure_ray, setup_ray_data
from raycse.platform.redact import redact_obj
from raycse.platform.outputs import written_folder
from raycse.train import callbacks as user_callbacks
from raycse.train import identity
from raycse.train import tracking as tracking_mod
from raycse.train.checkpoints import files as ckpt
from raycse.train.fit import build_trainer, fit_and_release, report_resume, say_devices, worker_resources
from raycse.train.plan import FitPlan, TuneHooks, plan_steps
from raycse.train.preflight import check_inputs, check_local_gpus, check_run_name, resolve_storage_path
from raycse.train.prepare import (data_key, fit_data, fixed_sources, objective_knobs, prepare_references,
                                  read_corpus, source_specs)
from raycse.train.publishing import best_checkpoint, close_tracking, log_model, write_output


@dataclass
class TrainResult:
    output_dir: str  # a local directory or a URI
    model_dir: str
    metrics: dict


def train(run: RunConfig, overwrite: bool = False, storage_path: Optional[str] = None,
          run_name: str = "train", hooks: Optional[TuneHooks] = None, source=None, callbacks=()) -> TrainResult:
    """Train ``run`` on Ray Train and return where the best model was saved.

    ``source``: the corpus as an object (a ``ray.data.Dataset`` or ``datasets.Dataset``) instead of
    ``run.data.corpus``, which then only names it in the log and the model card.

    ``storage_path``: where Ray Train keeps checkpoints (default: inside the staging directory,
    removed on success); a fixed path plus ``run_name`` lets a restarted driver resume from the
    latest whole checkpoint there. ``hooks``: a Tune trial's needs (:class:`raycse.train.plan.TuneHooks`:
    a rung's last step, extra scored steps, the score sink, the experiment's prepared data, and the
    registry of live runs, by default this driver process's, :func:`raycse.platform.release.driver_registry`).
    ``callbacks``: :class:`raycse.train.callbacks.Callback` objects, called on rank 0 at each logged step,
    evaluation and checkpoint. Every fit's workers and placement group are released before this returns or raises.
    """
    hooks = hooks or TuneHooks()
    if source is not None and not run.data.corpus:
        run = run.resolved({"data.corpus": f"<{type(source).__name__}>"})
    inputs = checked_inputs(run, overwrite, storage_path, run_name, source is not None, callbacks)
    run = inputs.run  # resolved and frozen: nothing below changes it
    final = inputs.remote or str(Path(os.path.expanduser(run.output_dir)).resolve())
    tracking: tuple = ()
    live = (None, None)  # (the registry of live runs, this run's key: known once Ray is up)
    try:
        # whole or not at all (raycse.platform.outputs): staged beside the output, or locally for one on object
        # storage, and published at the end
        with written_folder(final, "--output", overwrite, parts=("model",)) as staging:
            # (a tracking server that cannot be reached fails here, before Ray starts)
            tracking = tracking_mod.open_runs(run.train.tracking, Path(final).name, run.to_dict())
            live = _start_ray(run, hooks, staging)
            best, summary = _fit(run, inputs, hooks, source, staging, tracking, live)
            write_output(staging, run, best, summary, final)
            log_model(tracking, staging / "model")
    except BaseException as exc:
        close_tracking(tracking, ok=False)
        if isinstance(exc, KeyboardInterrupt):
            stop = interrupted(exc)
            if not stop.detail:
                stop.detail = interrupted_detail(run, inputs.storage_path, run_name, *live, final)
            if stop is not exc:
                raise stop from None
        raise
    close_tracking(tracking, ok=True, final={f"best_{k}": v for k, v in summary["best"].items()
                                             if k == run.eval.score_key()})
    return TrainResult(final, f"{final}/model", redact_obj(summary))


@dataclass
class _Inputs:
    """What the pre-flight checks resolved (raycse.train.preflight.check_inputs), and the checkpoints' home."""

    run: RunConfig  # the resolved run, frozen
    model_path: str
    dev: object  # raycse.evaluation.selection.Selection, or None
    remote: Optional[str]  # the output's URI, or None for a local output
    sources: Optional[list]  # the corpus's files, resolved once
    storage_path: Optional[str]
    run_name: str
    definition: Optional[dict]  # what the checkpoints under storage_path/run_name were made by
    callbacks: tuple  # the user's (raycse.train.callbacks), each checked to pickle


def checked_inputs(run: RunConfig, overwrite: bool, storage_path: Optional[str], run_name: str,
                   in_memory: bool, callbacks=()) -> _Inputs:
    """The pre-flight checks (raycse.train.preflight) and what they resolved: the first step of a run, before Ray."""
    callbacks = user_callbacks.checked(callbacks)
    check_run_name(run_name)
    storage_path = resolve_storage_path(storage_path)
    run, model_path, dev, remote, sources = check_inputs(run, overwrite, storage_path, in_memory)
    definition = None
    if storage_path:  # before Ray starts: these checkpoints are this run's, or there are none yet
        definition = identity.definition(run, sources)
        identity.check(storage_path, run_name, definition)
    return _Inputs(run, model_path, dev, remote, sources, storage_path, run_name, definition, callbacks)


def _start_ray(run: RunConfig, hooks: TuneHooks, staging: Path) -> tuple:
    """Ray up (a private one checked against the GPUs Ray found), Ray Data set; (the registry of live runs,
    this run's key in it)."""
    import ray

    from raycse.platform.machine import describe

    print(f"[raycse] driver on {describe()}", flush=True)  # the first line of the log names the machine
    if ensure_ray():
        check_local_gpus(run.train, ray.cluster_resources().get("GPU", 0))  # not after the workers' start timeout
    setup_ray_data()
    return hooks.registry or release.driver_registry(), hooks.run_key or f"train-{staging.name}"


def _fit(run: RunConfig, inputs: _Inputs, hooks: TuneHooks, source, staging: Path, tracking: tuple,
         live: tuple) -> tuple:
    """The corpus read (or the experiment's prepared data taken), its batches laid out, the fit run and its
    best checkpoint picked: (that checkpoint, the run's summary for metrics.json)."""
    registry, run_key = live
    planned = plan_fit(run, inputs, hooks, source, staging, tracking, live)
    plan = planned.plan
    trainer = build_trainer(plan, planned.cpus, planned.storage, inputs.run_name,
                            release.register_run(registry, run_key), inputs.dev is not None)
    started = time.perf_counter()
    result = fit_and_release(trainer, run.train, registry, run_key, worker_resources(run.train, planned.cpus))
    fit_seconds = [time.perf_counter() - started]
    report_resume((result.metrics or {}).get("resumed"))
    best, best_metrics = best_checkpoint(result, inputs.dev)
    return best, planned.summary(result.metrics, best_metrics, fit_seconds)


@dataclass
class PlannedFit:
    """A fit made ready (:func:`plan_fit`): the plan every worker gets, and what the run's summary reports of it."""

    plan: FitPlan
    cpus: float  # each worker's
    storage: str  # where the fit's checkpoints go
    stats: object  # the corpus's (or the sources') statistics
    num_examples: object
    grouping_log: list
    prepared: bool  # the data came laid out from a search's preparation

    def summary(self, last: Optional[dict], best: dict, fit_seconds: list) -> dict:
        """metrics.json's record of the run: the best and last checkpoints' metrics, the data and its grouping."""
        run, sources = self.plan.run, self.plan.sources
        grouping_log = self.grouping_log + ((last or {}).get("grouping") or [])  # (the in-fit regroups' record)
        mixture = {"sources": sources_record(run, sources, last)} if sources else {}
        return {**mixture, "best": best, "last": last, "corpus": self.stats.record(),
                "num_examples": self.num_examples, "steps_per_epoch": self.plan.steps_per_epoch,
                "grouping": grouping_log, "data_prepared_before": self.prepared, "fit_seconds": fit_seconds,
                "objective_knobs": objective_knobs(run), "score_key": run.eval.score_key()}


def plan_fit(run: RunConfig, inputs: _Inputs, hooks: TuneHooks, source, staging: Path, tracking: tuple,
             live: tuple) -> PlannedFit:
    """The corpus read (or the experiment's prepared data taken) and its batches laid out, into the plan every
    worker of the fit gets (raycse.train.plan.FitPlan)."""
    import ray

    dev = inputs.dev
    prepared = hooks.prepared if hooks.prepared is not None and hooks.prepared.key == data_key(run) else None
    corpus, stats, num_examples = read_corpus(run, prepared, source, inputs.sources)  # (files resolved once)
    spe, total = plan_steps(run, num_examples)
    say_when_unscored(run, dev)
    say_devices(run.train)
    blocks, layouts, grouping_log = fit_data(run, corpus, prepared, spe, total, inputs.model_path)
    references = prepared.references if prepared is not None else prepare_references(run, corpus, inputs.model_path)
    sources = prepared.sources if prepared is not None else source_specs(run, corpus)
    fixed = fixed_sources(run, corpus, spe, total, inputs.model_path) if prepared is None else None
    cpus = run.train.cpus_per_worker or default_cpus_per_worker(run.train.num_workers, run.train.gpu_share,
                                                                cluster_ceiling(), ray.cluster_resources().get("CPU", 1))
    storage = inputs.storage_path or str(staging / "ray")
    if inputs.storage_path:
        identity.record(inputs.storage_path, inputs.run_name, inputs.definition)
    plan = FitPlan(run=run, total_steps=total, stop_at=min(total, hooks.stop_at or total), steps_per_epoch=spe,
                   regroup_in_fit=run.regroups_in_fit, checkpoint_dir=object_store.join(storage, inputs.run_name),
                   threads=max(1, round(cpus)), dev=ray.put(dev) if dev is not None else None,
                   targets=ray.put(load_targets(hooks.targets, run.eval, dev)) if hooks.targets else None,
                   initial_key=initial_scores.key(inputs.model_path, run, dev) if dev is not None else None,
                   initial_file=initial_scores.cache_file(), eval_at=tuple(int(s) for s in hooks.eval_at),
                   score_sink=hooks.score_sink, tracking=tracking, corpus=tuple(blocks),
                   layouts=ray.put(layouts) if layouts is not None else None, references=references, progress=live,
                   callbacks=inputs.callbacks, sources=sources,
                   fixed_sources=ray.put(fixed) if fixed is not None else None)
    return PlannedFit(plan, cpus, storage, stats, num_examples, grouping_log, prepared is not None)


def sources_record(run: RunConfig, sources: tuple, last: Optional[dict]) -> list:
    """A mixture's sources for metrics.json and the model card: each one's corpus, rows, objective, share of an
    epoch's steps and the steps it got."""
    from raycse.train.mixture import epoch_steps

    subs, steps = run.source_runs(), ((last or {}).get("source_steps") or {})
    planned = epoch_steps(run, [s.rows for s in sources])
    total = int(planned.sum()) or 1
    return [{"name": s.name, "corpus": subs[s.name].data.corpus, "rows": s.rows,
             "objective": subs[s.name].objective.name, "share": int(k) / total,
             "steps": int(steps.get(s.name, 0))} for s, k in zip(sources, planned)]


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
        found = ckpt.latest_valid(object_store.join(storage_path, run_name))
    except Exception:  # noqa: BLE001 - unreadable storage: no step to name
        found = None
    resume = f"resume from step {found[0]}" if found else "start again (no whole checkpoint was saved yet)"
    return f"stopped{at}; nothing was written to {out}; rerun the same command to {resume}"


def say_when_unscored(run: RunConfig, dev) -> None:
    if dev is None:
        why = ("eval.stsb_dev is none" if run.eval.stsb_dev is None or run.eval.stsb_dev.lower() == "none"
               else "no STS-B dev set found (neither $RAYCSE_DATA/stsbenchmark/sts-dev.csv nor the Hugging Face "
                    "dataset sentence-transformers/stsb; set eval.stsb_dev / --stsb-dev)")
        print(f"[raycse] {why}: training without evaluation, keeping the last checkpoint", flush=True)
