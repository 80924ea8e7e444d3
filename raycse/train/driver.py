"""The Ray Train driver: validate everything, run ``TorchTrainer.fit``, publish the best model.

The output directory appears only when a run succeeds: everything is written to a hidden
staging directory beside it and renamed at the end, so a failed or interrupted run never
leaves a half-written model behind.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from raycse.config import RunConfig
from raycse.data.batches import steps_per_epoch
from raycse.data.corpus import read_corpus, read_pairs
from raycse.objectives import registry
from raycse.encoder import resolve_model
from raycse.errors import ConfigError, DataError
from raycse.evaluation.sts import read_stsb
from raycse.train.loop import SCORE_METRIC, train_loop_per_worker
from raycse.train.runtime import cluster_cpus, ensure_ray


@dataclass
class TrainResult:
    output_dir: Path
    model_dir: Path
    metrics: dict


def _prepare_output(out: Path, overwrite: bool) -> Path:
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"output directory {out} already exists and is not empty; choose another --output or pass --overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    return staging


def load_examples(run: RunConfig):
    """Sentences or (q, a, score) pairs, as the data config says and the objective accepts."""
    d = run.data
    accepts = registry.get(run.objective.name).accepts
    if d.is_pairs:
        if "pairs" not in accepts:
            raise ConfigError(f"objective '{run.objective.name}' trains on single sentences; drop data.pair_column "
                              f"(or choose a pair objective: bsc)")
        return read_pairs(d.corpus, d.format, d.text_column, d.pair_column, d.label_column, d.score_scale,
                          d.max_chars, d.on_decode_error, d.max_sentences)
    if "single" not in accepts:
        raise ConfigError(f"objective '{run.objective.name}' needs pairs: set data.pair_column (and label_column)")
    return read_corpus(d.corpus, d.format, d.text_column, d.max_chars, d.on_decode_error, d.dedup, d.max_sentences)


def train(run: RunConfig, overwrite: bool = False) -> TrainResult:
    """Train ``run`` on Ray Train and return where the best model was saved."""
    import ray
    from ray.train import CheckpointConfig, RunConfig as TrainRunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    run.validate()
    if not run.data.corpus:
        raise ConfigError("no corpus given: pass --corpus FILE (text, .jsonl or .parquet) or set data.corpus")
    resolve_model(run.model.name_or_path)  # fail before Ray starts
    examples, stats = load_examples(run)
    d = run.data
    print(f"[raycse] corpus {d.corpus}: {stats.summary()}", flush=True)
    if stats.decode_replaced:
        print(f"[raycse] warning: {stats.decode_replaced} line(s) had undecodable bytes, replaced with U+FFFD "
              f"(set data.on_decode_error: error to refuse them)", flush=True)
    if steps_per_epoch(len(examples), run.train.batch_size, run.train.num_workers) == 0:
        raise DataError(f"corpus has {len(examples)} usable examples, fewer than one global batch "
                        f"({run.train.batch_size} x {run.train.num_workers} workers); lower --batch-size or add text")
    dev_path = run.eval.resolved_stsb_dev()
    dev = read_stsb(dev_path, name="stsb_dev") if dev_path else None
    if dev is None:
        print("[raycse] no STS-B dev file found: training without evaluation, keeping the last checkpoint "
              "(set eval.stsb_dev / --stsb-dev)", flush=True)

    out = Path(run.output_dir).resolve()
    staging = _prepare_output(out, overwrite)
    try:
        ensure_ray()
        cpus = run.train.cpus_per_worker or max(1, cluster_cpus() // run.train.num_workers)
        threads = max(1, int(cpus))
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"run": run.to_dict(), "examples": ray.put(examples),
                               "dev": ray.put(dev) if dev is not None else None, "threads": threads},
            scaling_config=ScalingConfig(num_workers=run.train.num_workers, use_gpu=run.train.use_gpu,
                                         resources_per_worker={"CPU": cpus}),
            run_config=TrainRunConfig(
                name="train", storage_path=str(staging / "ray"),
                checkpoint_config=CheckpointConfig(
                    num_to_keep=1, checkpoint_score_attribute=SCORE_METRIC if dev is not None else None,
                    checkpoint_score_order="max"),
            ),
        )
        result = trainer.fit()
        if result.error:
            raise result.error
        best = result.checkpoint
        best_metrics = dict(result.metrics or {})
        if dev is not None and result.best_checkpoints:
            best, best_metrics = max(result.best_checkpoints, key=lambda cm: cm[1].get(SCORE_METRIC, float("-inf")))
        if best is None:
            raise RuntimeError("training finished without a checkpoint")
        with best.as_directory() as ckpt:
            shutil.copytree(ckpt, staging / "model")
        (staging / "model" / "train_state.json").unlink(missing_ok=True)
        summary = {"best": best_metrics, "last": result.metrics, "corpus": stats.__dict__,
                   "num_examples": len(examples)}
        (staging / "metrics.json").write_text(json.dumps(summary, indent=2, default=str))
        (staging / "config.yaml").write_text(yaml.safe_dump(run.to_dict(), sort_keys=False))
        shutil.rmtree(staging / "ray", ignore_errors=True)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return TrainResult(out, out / "model", summary)


def best_score(metrics: dict) -> Optional[float]:
    return (metrics.get("best") or {}).get(SCORE_METRIC)
