"""What a finished fit leaves: the best checkpoint's model with its card, metrics.json and config.yaml,
written into the run's staging directory (published whole by raycse.platform.outputs); the model logged to the
run's trackers, which are then closed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

import yaml

from raycse.config import RunConfig
from raycse.model.card import model_card
from raycse.platform.redact import redact, redact_obj
from raycse.train import tracking as tracking_mod
from raycse.train.checkpoints import files as ckpt
from raycse.train.reporter import SCORE_METRIC


def best_checkpoint(result, dev) -> tuple:
    """(checkpoint, its metrics) of the best-scored checkpoint Ray kept (a resumed run's include the
    earlier fits': Ray restores them from the run's storage), else the last one; a tie goes to the
    earlier step, as Ray's ranking does (:func:`raycse.train.checkpoints.in_fit.checkpoint_rank`)."""
    best, best_metrics = result.checkpoint, dict(result.metrics or {})
    if dev is not None and result.best_checkpoints:
        scored = [cm for cm in result.best_checkpoints if dev.key in cm[1]]
        if scored:
            best, best_metrics = max(scored, key=lambda cm: (cm[1][dev.key], -int(cm[1].get("step", 0))))
    if best is None:
        raise RuntimeError("training finished without a checkpoint")
    return best, best_metrics


def write_output(staging: Path, run: RunConfig, best, summary: dict, final: str) -> None:
    """The model of ``best``, its card and digests, metrics.json and config.yaml into ``staging``."""
    from raycse.platform.folders import write_manifest

    with best.as_directory() as d:
        shutil.copytree(Path(d) / ckpt.MODEL_DIR, staging / "model")
    summary = redact_obj(json.loads(json.dumps(summary, default=str)))  # no credential of a URI is saved
    config = redact_obj(run.to_dict())
    (staging / "metrics.json").write_text(json.dumps(summary, indent=2))
    (staging / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (staging / "model" / "README.md").write_text(model_card(config, summary, redact(f"{final}/model"),
                                                            files=staging / "model"))
    write_manifest(staging / "model")  # last: every file's digest, checked by each later load of the model
    shutil.rmtree(staging / "ray", ignore_errors=True)


def log_model(tracking: tuple, model_dir: Path) -> None:
    for t in tracking:
        try:
            tracking_mod.log_model(t, model_dir)
        except Exception as exc:  # the model is saved all the same: say so, go on
            print(f"[raycse] warning: could not log the model to the {t.kind} run "
                  f"({redact(str(exc).splitlines()[0][:160])})", flush=True)


def close_tracking(tracking: tuple, ok: bool, final: Optional[dict] = None) -> None:
    for t in tracking:  # (each one: a tracker that fails to close does not keep the others open)
        try:
            tracking_mod.close_run(t, ok, final)
        except Exception as exc:  # the run itself is done (or failing for its own reason): say so, go on
            print(f"[raycse] warning: could not close the {t.kind} run "
                  f"({redact(str(exc).splitlines()[0][:160])})", flush=True)


def best_score(metrics: dict) -> Optional[float]:
    """The best checkpoint's model-selection score (STS-B dev Spearman or the BEIR metric, x100)."""
    return (metrics.get("best") or {}).get(metrics.get("score_key", SCORE_METRIC))
