"""The model a search found best, exported: the best trial's best seed's model (or, for a search of several goals, the
Pareto front's trial the user picks), checked, with a card naming the search, published whole (``--export-best``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from raycse.analysis.trials import TrialRecord
from raycse.errors import ConfigError, RaycseError
from raycse.platform import object_store
from raycse.platform.redact import redact, redact_obj
from raycse.platform.outputs import written_folder


def picked(members: list, pick: Optional[str]) -> TrialRecord:
    """The trial of the Pareto front ``pick`` names (its Tune id, or its directory's name); refused in one
    line, naming the front's trials, where it names none of them."""
    ids = ", ".join(t.trial_id for t in members) or "none yet"
    if not pick:
        raise ConfigError(f"this experiment searched several goals: choose the trial to export with --pick TRIAL, "
                          f"one of its Pareto front: {ids}")
    found = [t for t in members if pick in (t.trial_id, t.short_name, t.name)]
    if len(found) != 1:
        raise ConfigError(f"--pick {pick} is not a trial of the Pareto front; pick one of: {ids}")
    return found[0]


def _export_card(staging: Path, run_dir: Path, dest: Path, best: TrialRecord, seed: int, experiment: str,
                 target: str) -> None:
    from raycse.model.card import model_card
    from raycse.platform import safe_yaml

    m = best.last
    search = {"experiment": experiment, "target": target, "config": best.params, "seeds": m["seeds"],
              "seed_scores": m["seed_scores"], "exported_seed": seed}
    run = safe_yaml.load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    summary = json.loads((run_dir / "metrics.json").read_text())
    (staging / "README.md").write_text(model_card(redact_obj(run), redact_obj(summary), redact(str(dest)),
                                                  redact_obj(search), files=staging))


def check_export_path(dest) -> None:
    if object_store.is_uri(dest):
        if object_store.prefix_exists(str(dest)):
            raise ConfigError(f"--export-best {dest} is not empty; choose another URI")
        return
    dest = Path(os.path.expanduser(dest))
    if dest.is_file():
        raise ConfigError(f"--export-best {dest} is a file; give a directory path for the model")
    if dest.exists() and any(dest.iterdir()):
        raise ConfigError(f"--export-best {dest} exists and is not empty; choose another path")


def export_model(best: Optional[TrialRecord], dest, experiment: str = "", target: str = "mean"):
    """Copy the best trial's best seed's model, with a model card naming the search's best
    configuration and its seeds: staged beside ``dest`` and renamed, or, for a URI, published with
    its manifest last (raycse.platform.object_store), so it appears whole or not at all. Returns ``dest``."""
    from raycse.tune.trial import SEED_MODEL

    if best is None:
        raise ConfigError("no finished trial to export")
    m = best.last
    seed = m["seeds"][max(range(len(m["seed_scores"])), key=lambda i: m["seed_scores"][i])]
    run_dir = _seed_output(best, seed, SEED_MODEL)
    src = run_dir / "model"
    if not (src / "config.json").is_file():
        raise ConfigError(f"the best trial's model is missing ({src}); was the experiment directory moved or pruned?")
    from raycse.model.files import check_model_files
    from raycse.platform.folders import copy_folder, write_manifest

    try:  # (a damaged model is not published as the best one)
        check_model_files(src, "trial's model")
    except RaycseError as err:
        raise ConfigError(f"the best trial's model cannot be exported: {err}") from None
    check_export_path(dest)
    remote = object_store.is_uri(dest)
    dest = str(dest) if remote else Path(os.path.expanduser(dest)).resolve()
    with written_folder(dest, "--export-best") as staging:  # (whole or not at all, a path or a URI)
        # (regular files only, nothing that leads out of the trial's folder, not the staging folder itself)
        copy_folder(src, staging, "trial's model", leave_out=() if remote else (staging, dest))
        _export_card(staging, run_dir, dest, best, seed, experiment, target)
        if not remote:  # (an upload writes its manifest itself)
            write_manifest(staging)
    return dest


def _seed_output(best: TrialRecord, seed: int, seed_model: str) -> Path:
    """The local directory of a seed's saved output (model, metrics.json, config.yaml); one on
    object storage is fetched (checked against its manifest) into the local cache first."""
    location = object_store.join(best.location or str(best.path), f"seed{seed}", seed_model)
    if not object_store.is_uri(location):
        return Path(location)
    from raycse.errors import DataError

    try:
        return object_store.fetch(location)
    except DataError as err:
        raise ConfigError(f"the best trial's model cannot be read: {err}") from None
