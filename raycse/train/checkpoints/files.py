"""Training checkpoints: what a run needs to continue exactly where it stopped.

Layout of one checkpoint directory (Ray Train merges the files every worker reports):

    model/                 the encoder as a loadable HF + sentence-transformers directory (export)
    state/module.safetensors   every tensor of encoder + objective (heads, tau, SG-OPT's frozen copy)
    state/optim.pt         optimizer + LR scheduler state dicts (tensors and numbers only)
    state/train.json       step, epoch, loss history, scores
    state/rng_rank{r}.pt   each worker's torch RNG state (dropout masks continue, not repeat)
    state/MANIFEST.json    sizes and BLAKE2 digests of rank 0's files, written last
    state/MANIFEST.rank{r}.json   rank r's (r >= 1): its RNG state, and its shards in a sharded run

``train.json`` names the worker count (``world_size``): a checkpoint is whole only with every rank's part, so a
run restarted after a worker died mid-checkpoint never resumes from one whose other ranks' random state is missing
(that worker's dropout masks would not continue as they were).

A sharded run (``--sharding fsdp``) writes, instead of ``module.safetensors`` and the optimizer's state:

    state/dcp/             PyTorch Distributed Checkpoint of the module and the optimizer: each worker's shards
                           (``__{r}_0.distcp``, written by rank r) and the plan (``.metadata``, rank 0's)
    state/sharding.json    the worker count that wrote it

and ``model/`` from the whole state, gathered to rank 0 on the CPU. A DCP checkpoint loads into a sharded or a
whole module on any number of workers (DCP reshards it), so a run can resume on fewer or more workers; a whole
run's checkpoint loads into a sharded module too (each worker keeps its shards of the whole tensors).

Safety: weights are safetensors; ``optim.pt`` and the RNG files load with
``torch.load(weights_only=True)``, which refuses to unpickle arbitrary objects. A checkpoint
whose manifest is missing or does not match its files (a copy cut short) is rejected with a
warning instead of being loaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Optional

import torch

from raycse.platform import object_store

MODEL_DIR, STATE_DIR, MANIFEST = "model", "state", "MANIFEST.json"
DCP_DIR, SHARDING = "dcp", "sharding.json"
log = logging.getLogger("raycse.train")


def _digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write(root: Path, module, optimizer, scheduler, state: dict) -> None:
    """Rank 0's part: model export, full module tensors, optimizer/scheduler, counters, manifest."""
    from safetensors.torch import save_model

    module.encoder.save(root / MODEL_DIR)
    sdir = root / STATE_DIR
    sdir.mkdir(parents=True, exist_ok=True)
    save_model(module, str(sdir / "module.safetensors"))
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, sdir / "optim.pt")
    (sdir / "train.json").write_text(json.dumps(state, default=float))
    _write_manifest(root, sdir / MANIFEST)


def _write_manifest(root: Path, path: Path) -> None:
    """Sizes and digests of this process's files under ``root`` (its random state included: written first), last."""
    files = [p for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith("MANIFEST")]
    manifest = {str(p.relative_to(root)): {"bytes": p.stat().st_size, "blake2b": _digest(p)} for p in files}
    path.write_text(json.dumps(manifest, indent=1))


def write_sharded(root: Path, module, optimizer, scheduler, state: dict, rank: int, world_size: int,
                  export) -> None:
    """Every rank's part of a sharded module's checkpoint (a collective): its shards of the module and optimizer
    (Distributed Checkpoint) and their manifest; rank 0 also the model exported from the whole state (``export``:
    the whole state dict -> an Encoder to save), the schedule, the counters and the worker count."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    sdir = root / STATE_DIR
    sdir.mkdir(parents=True, exist_ok=True)
    model_state, optim_state = get_state_dict(module, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(sdir / DCP_DIR))
    whole = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:  # (rank 0 alone received the whole state)
        _write_manifest(root, sdir / f"MANIFEST.rank{rank}.json")
        return
    export(whole).save(root / MODEL_DIR)
    del whole
    torch.save({"scheduler": scheduler.state_dict()}, sdir / "optim.pt")
    (sdir / "train.json").write_text(json.dumps(state, default=float))
    (sdir / SHARDING).write_text(json.dumps({"world_size": world_size}))
    _write_manifest(root, sdir / MANIFEST)


def write_rank_part(root: Path, rank: int) -> None:
    """A whole (unsharded) run's rank ``rank`` >= 1: the manifest of its part (its random state, written before)."""
    _write_manifest(root, root / STATE_DIR / f"MANIFEST.rank{rank}.json")


def write_rng(root: Path, rank: int) -> None:
    """This rank's torch (and CUDA) random state; written before the rank's manifest, which covers it."""
    sdir = root / STATE_DIR
    sdir.mkdir(parents=True, exist_ok=True)
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    torch.save(state, sdir / f"rng_rank{rank}.pt")


def verify(root: Path) -> Optional[str]:
    """None if the checkpoint is whole (a sharded one: every rank's part), else what is wrong with it."""
    problem = _verify_manifest(root, root / STATE_DIR / MANIFEST)
    if problem is not None:
        return problem
    sharding = root / STATE_DIR / SHARDING
    train = json.loads((root / STATE_DIR / "train.json").read_text())
    for r in range(1, _world_size(train, json.loads(sharding.read_text()) if sharding.is_file() else None)):
        problem = _verify_manifest(root, root / STATE_DIR / f"MANIFEST.rank{r}.json", f"rank {r}'s part")
        if problem is not None:
            return problem
    return None


def _world_size(train: dict, sharding: Optional[dict]) -> int:
    """The workers that wrote a checkpoint: its counters say (since the RNG files joined the ranks' manifests),
    else a sharded one's sharding.json, else 1 (an older whole run's: rank 0's manifest alone)."""
    return int(train.get("world_size") or (sharding or {}).get("world_size") or 1)


def _verify_manifest(root: Path, mpath: Path, part: str = "the checkpoint") -> Optional[str]:
    if not mpath.is_file():
        return f"no manifest of {part} (the checkpoint was not finished)"
    try:
        manifest = json.loads(mpath.read_text())
    except (ValueError, OSError) as exc:
        return f"unreadable manifest ({exc})"
    for rel, meta in manifest.items():
        p = root / rel
        if not p.is_file():
            return f"{rel} is missing"
        if p.stat().st_size != meta["bytes"]:
            return f"{rel} has {p.stat().st_size} bytes, expected {meta['bytes']}"
        if _digest(p) != meta["blake2b"]:
            return f"{rel} does not match its digest"
    return None


def shape_state_as_parameters(optimizer) -> None:
    """AdamW's moments saved for a parameter of the same size in another shape (BSC's learned scale, 0-d in
    checkpoints of earlier releases, is 1-d) take their parameter's shape; the step counter is left as it is."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            for key, value in optimizer.state.get(param, {}).items():
                if (key != "step" and torch.is_tensor(value) and value.shape != param.shape
                        and value.numel() == param.numel()):
                    optimizer.state[param][key] = value.reshape(param.shape)


def load(root: Path, module, optimizer, scheduler, rank: int) -> dict:
    """Restore module tensors, optimizer, scheduler and this rank's RNG; return the counters. A sharded
    checkpoint loads into a sharded or whole ``module`` of any worker count (every rank calls it: a collective)."""
    from safetensors.torch import load_model

    from raycse.train.sharding import is_sharded

    sdir = root / STATE_DIR
    opt = torch.load(sdir / "optim.pt", weights_only=True, map_location="cpu")
    if (sdir / DCP_DIR).is_dir():
        _load_sharded(sdir / DCP_DIR, module, optimizer)
    elif is_sharded(module):  # (a whole run's checkpoint, resumed with --sharding fsdp)
        _load_whole_into_sharded(sdir, module, optimizer, opt.get("optimizer"))
    else:
        load_model(module, str(sdir / "module.safetensors"))
        if "optimizer" in opt:
            optimizer.load_state_dict(opt["optimizer"])
            shape_state_as_parameters(optimizer)
    scheduler.load_state_dict(opt["scheduler"])
    rng = sdir / f"rng_rank{rank}.pt"
    if rng.is_file():
        state = torch.load(rng, weights_only=True)
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])
    else:
        log.warning(f"[raycse] checkpoint has no RNG state for rank {rank}; continuing with a fresh seed")
    return json.loads((sdir / "train.json").read_text())


def _load_sharded(path: Path, module, optimizer) -> None:
    """The module's and optimizer's state from a Distributed Checkpoint, resharded to this run's workers."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(module, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _load_whole_into_sharded(sdir: Path, module, optimizer, saved: Optional[dict]) -> None:
    """A whole run's state (``module.safetensors``, the optimizer's ``saved`` state dict) into a sharded module and
    its optimizer: every rank reads the whole tensors and keeps its shards. The saved optimizer numbers its
    parameters in the order the same optimizer, built the same way on the same module, holds them in its groups: a
    number is named by the parameter at its place, as ``set_optimizer_state_dict`` takes whole states."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    whole = StateDictOptions(full_state_dict=True)
    set_model_state_dict(module, load_file(str(sdir / "module.safetensors")), options=whole)
    if saved is None:
        return
    names = {id(p): name for name, p in module.named_parameters()}
    named = {}
    for saved_group, group in zip(saved["param_groups"], optimizer.param_groups, strict=True):
        named.update({number: names[id(p)] for number, p in zip(saved_group["params"], group["params"], strict=True)})
    state = {"state": {named[number]: value for number, value in saved["state"].items()},
             "param_groups": [{**g, "params": [named[n] for n in g["params"]]} for g in saved["param_groups"]]}
    set_optimizer_state_dict(module, optimizer, state, options=whole)


def step_of(root: Path) -> int:
    return int(json.loads((root / STATE_DIR / "train.json").read_text())["step"])


def _whole_local(run_dir: Path, skipped: Optional[list]) -> list[tuple[int, str]]:
    found = []
    for d in sorted(p for p in run_dir.glob("checkpoint_*") if p.is_dir()) if run_dir.is_dir() else []:
        problem = verify(d)
        if problem is not None:
            log.warning(f"[raycse] skipping checkpoint {d}: {problem}")
            print(f"[raycse] warning: skipping checkpoint {d.name}: {problem}", flush=True)
            if skipped is not None:
                skipped.append(f"{d.name}: {problem}")
            continue
        found.append((step_of(d), str(d)))
    return found


def _verify_remote(fs, root: str) -> tuple[Optional[str], Optional[int]]:
    """(problem or None, step) of a checkpoint on object storage: manifest, presence and sizes (the
    digests are checked where it is loaded, after the download)."""
    import pyarrow.fs as pafs

    try:
        with fs.open_input_stream(f"{root}/{STATE_DIR}/{MANIFEST}") as fh:
            manifest = json.loads(fh.read())
        with fs.open_input_stream(f"{root}/{STATE_DIR}/train.json") as fh:
            train = json.loads(fh.read())
        step = int(train["step"])
    except (OSError, ValueError, KeyError):
        return "no readable manifest (the checkpoint was not finished)", None
    try:  # every rank's manifest too
        with fs.open_input_stream(f"{root}/{STATE_DIR}/{SHARDING}") as fh:
            sharding = json.loads(fh.read())
    except (OSError, ValueError):
        sharding = None
    for r in range(1, _world_size(train, sharding)):
        try:
            with fs.open_input_stream(f"{root}/{STATE_DIR}/MANIFEST.rank{r}.json") as fh:
                manifest = {**manifest, **json.loads(fh.read())}
        except (OSError, ValueError):
            return f"no readable manifest of rank {r}'s part (the checkpoint was not finished)", None
    infos = {i.path: i for i in fs.get_file_info([f"{root}/{rel}" for rel in manifest])}
    for rel, meta in manifest.items():
        info = infos.get(f"{root}/{rel}")
        if info is None or info.type != pafs.FileType.File:
            return f"{rel} is missing", None
        if info.size != meta["bytes"]:
            return f"{rel} has {info.size} bytes, expected {meta['bytes']}", None
    return None, step


def _whole_remote(run_uri: str, skipped: Optional[list]) -> list[tuple[int, str]]:
    import pyarrow.fs as pafs

    fs, root = pafs.FileSystem.from_uri(run_uri)
    scheme = run_uri.split("://", 1)[0]
    infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    found = []
    for d in sorted(i.path for i in infos if i.type == pafs.FileType.Directory
                    and i.base_name.startswith("checkpoint_")):
        problem, step = _verify_remote(fs, d)
        if problem is not None:
            print(f"[raycse] warning: skipping checkpoint {d.rsplit('/', 1)[-1]}: {problem}", flush=True)
            if skipped is not None:
                skipped.append(f"{d.rsplit('/', 1)[-1]}: {problem}")
            continue
        found.append((step, f"{scheme}://{d}"))
    return found


def whole_checkpoints(run_dir, skipped: Optional[list] = None) -> list[tuple[int, str]]:
    """(step, path) of every whole checkpoint under a Ray Train run directory, local or on object
    storage (``s3://bucket/ckpt/train``); one that fails :func:`verify` is reported (and added to
    ``skipped`` as "name: problem") and skipped, never loaded."""
    if object_store.is_uri(str(run_dir)):
        return _whole_remote(str(run_dir), skipped)
    return _whole_local(Path(run_dir), skipped)


def latest_valid(run_dir, skipped: Optional[list] = None) -> Optional[tuple[int, str]]:
    """(step, path) of the furthest whole checkpoint under a run directory (:func:`whole_checkpoints`)."""
    return max(whole_checkpoints(run_dir, skipped), default=None)
