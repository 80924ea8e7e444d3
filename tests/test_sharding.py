"""Issue 107: ``--sharding fsdp`` (FSDP2) trains what DDP trains, holding about half of it a worker at 2 workers, and
its checkpoints (PyTorch Distributed Checkpoint) resume on another worker count.

The second way of computing the same thing is DDP (``DistributedDataParallel``, what Ray Train's ``prepare_model``
wraps) on the same 2 gloo processes, seeds and batches; the checkpoint is read back in one process without any
process group, as a 1-worker run resumes it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import make_sentences, make_tiny_model

SPAWNS = pytest.mark.full_tier  # (two spawned torch processes a case: ~20 s each)

STEPS, ROWS = 6, 4  # 6 steps of 4 rows a worker; the checkpoint after 5


def _run(model: str, objective: str, sharding: str = "ddp", workers: int = 1):
    from raycse.config import RunConfig

    run = RunConfig()
    pooling = "lasttoken" if "qwen3" in model else "mean"
    run.model.name_or_path, run.model.pooling, run.objective.name = model, pooling, objective
    run.train.precision, run.train.length_buckets, run.train.unpad = "fp32", 1, False  # (FSDP: padded, as here)
    run.train.sharding, run.train.num_workers = sharding, workers
    if objective == "mixture":  # (issue 108: SimCSE on sentences beside BSC, its tau learned, on scored pairs)
        run.objective.name = "simcse"
        run.data.sources = {"wiki": {"corpus": "wiki.txt"}, "sts": {"corpus": "sts.csv", "format": "stsb",
                                                                   "objective": {"name": "bsc", "trainable_tau": True}}}
    return run.resolved()


def _batch(engine, step: int, rank: int, rows: int):
    from raycse.objectives.base import Pair

    texts = make_sentences(64, seed=3, min_len=4)[step * 8 + rank * rows: step * 8 + rank * rows + rows]
    objective, tokenizer = engine.core.objective, engine.core.encoder.tokenizer
    if not engine.run.data.is_mixture:
        return objective.collate(texts, tokenizer, 32)
    source = step % 2  # (both workers on one source a step, as a mixture's layout has them)
    examples = [Pair(t, t[::-1], 0.25 * i) for i, t in enumerate(texts)] if source else texts
    return objective.collate_source(source, examples, tokenizer, 32)


def _worker(rank: int, world: int, port: int, model: str, objective: str, out: str, from_ddp: bool = False) -> None:
    """DDP, then FSDP, each from the same seed: the losses, the whole weights after 5 and 6 steps, the local bytes;
    FSDP's sharded checkpoint after 5 steps into ``out/rank{r}`` (each worker's own folder, as Ray's are).
    ``from_ddp``: DDP's whole checkpoint after 5 steps too (rank 0's, in ``out/ddp``), loaded into a sharded module
    that takes step 6 (its loss and whole weights after it)."""
    import os

    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.nn.parallel import DistributedDataParallel

    from raycse.platform.process_state import seed_everything
    from raycse.train.checkpoints import files as ckpt
    from raycse.train.module import build_module, export_encoder
    from raycse.train.sharding import local_bytes, shard_from_rank0
    from raycse.train.steps import StepEngine

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    cpu, got = torch.device("cpu"), {}
    whole = StateDictOptions(full_state_dict=True, cpu_offload=True)
    for mode in ("ddp", "fsdp"):
        run = _run(model, objective, mode, world)
        seed_everything(0)
        if mode == "ddp":
            module = build_module(run).train()
            # the same kernels in both (a sharded run's linears are PyTorch's): AdamW turns a gradient's last-bit
            # difference into a whole step of the learning rate on the rows whose gradients are near zero
            module.encoder.onednn = False
            module = DistributedDataParallel(module, find_unused_parameters=run.data.is_mixture)
        else:  # (as the workers do: rank 0 reads the weights, rank 1 builds on the meta device and receives its shards)
            module = shard_from_rank0(lambda weights: build_module(run, weights).train(), cpu, rank, world,
                                      torch.float32)
        seed_everything(1 + rank)
        engine = StepEngine(run, module, cpu, 10)
        losses, weights = [], []
        for step in range(STEPS):
            losses.append(float(engine.step(_batch(engine, step, rank, ROWS), step).loss.detach()))
            # (cloned: a whole module's state dict shares its tensors with the parameters, which move on)
            weights.append({k: v.clone() for k, v in get_model_state_dict(engine.core, options=whole).items()})
            if step == STEPS - 2 and mode == "fsdp":
                root = Path(out) / f"rank{rank}"
                ckpt.write_rng(root, rank)  # (as the checkpointer does: first, so the rank's manifest covers it)
                ckpt.write_sharded(root, engine.core, engine.opt, engine.sched, {"step": step + 1}, rank, world,
                                   export_encoder(run) if rank == 0 else (lambda state: None))
            if step == STEPS - 2 and mode == "ddp" and from_ddp:  # (rank 0's part, as a DDP run's worker writes it)
                ckpt.write_rng(Path(out) / "ddp", rank)
                if rank == 0:
                    ckpt.write(Path(out) / "ddp", engine.core, engine.opt, engine.sched, {"step": step + 1})
                else:
                    ckpt.write_rank_part(Path(out) / "ddp", rank)
                dist.barrier()
        got[mode] = {"losses": losses, "weights": weights, "bytes": local_bytes(engine.core, engine.opt)}
    if from_ddp:  # DDP's checkpoint resumed sharded: step 6 as DDP took it
        run = _run(model, objective, "fsdp", world)
        module = shard_from_rank0(lambda weights: build_module(run, weights).train(), cpu, rank, world, torch.float32)
        engine = StepEngine(run, module, cpu, 10)
        assert ckpt.load(Path(out) / "ddp", engine.core, engine.opt, engine.sched, rank)["step"] == STEPS - 1
        seed_everything(1 + rank)  # (no dropout: the masks do not matter; as each mode's steps began)
        loss = float(engine.step(_batch(engine, STEPS - 1, rank, ROWS), STEPS - 1).loss.detach())
        got["fsdp_from_ddp"] = {"loss": loss, "weights": get_model_state_dict(engine.core, options=whole),
                                "bytes": local_bytes(engine.core, engine.opt)}
    if rank == 0:
        torch.save(got, Path(out) / "got.pt")
    dist.destroy_process_group()


def _spawn(tmp_path: Path, objective: str, decoder: bool = False, from_ddp: bool = False) -> tuple[str, dict]:
    from conftest import _free_port, make_tiny_decoder, spawn_gloo

    # (no dropout: 1 worker draws no 2 workers' masks; the Qwen3's rotary frequencies are a buffer outside the state
    # dict, which rank 1, built on the meta device, receives from rank 0)
    model = str(make_tiny_decoder(tmp_path / "qwen3") if decoder else make_tiny_model(tmp_path / "tiny", dropout=0.0))
    spawn_gloo(_worker, (2, _free_port(), model, objective, str(tmp_path), from_ddp))
    return model, torch.load(tmp_path / "got.pt", weights_only=False)


@SPAWNS
@pytest.mark.parametrize("objective, decoder", [("simcse", False), ("compcse", False), ("sgopt", False),
                                                ("simcse", True), ("mixture", False)])
def test_two_sharded_workers_train_what_two_ddp_workers_train_holding_half(tmp_path, objective, decoder):
    """Item 7: after each of 6 fp32 steps the losses and the gathered weights equal DDP's to 1e-5 (SG-OPT: its
    regularizer sums each shard's part, its frozen copy sharded too; a tiny Qwen3 with last-token pooling; a mixture of
    SimCSE and BSC with a learned tau, one source a step, issue 108); each
    worker holds <= 0.55x DDP's parameter and optimizer bytes. Rank 1 builds on the meta device and receives its
    shards from rank 0 (items 1 and 4)."""
    _, got = _spawn(tmp_path, objective, decoder)
    ddp, fsdp = got["ddp"], got["fsdp"]
    torch.testing.assert_close(torch.tensor(fsdp["losses"]), torch.tensor(ddp["losses"]), atol=1e-5, rtol=0)
    assert len(set(ddp["losses"])) > 1  # (the weights moved)
    for step, (a, b) in enumerate(zip(ddp["weights"], fsdp["weights"])):
        assert a.keys() == b.keys()
        for name in a:
            torch.testing.assert_close(b[name], a[name], atol=1e-5, rtol=0, msg=f"step {step + 1}: {name}")
    assert fsdp["bytes"] <= 0.55 * ddp["bytes"], (fsdp["bytes"], ddp["bytes"])


@SPAWNS
def test_a_two_worker_sharded_checkpoint_resumes_on_one_worker_as_the_run_goes_on(tmp_path, s3_server):
    """Item 2: the checkpoint after step 5 of 2 sharded workers, each worker's files in its own folder as Ray's are,
    merged as Ray Train's storage merges them: whole, on local disk and on S3 (a damaged or missing part is named), its
    model folder the whole weights (sentence-transformers and AutoModel load it), and loaded into one whole module without any
    process group (DCP reshards) it takes step 6 on the 8 rows of the global batch as DDP's 2 workers did. And the
    other way: DDP's whole checkpoint after step 5, loaded by 2 sharded workers, takes step 6 as DDP did."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from raycse.platform.process_state import seed_everything
    from raycse.train.checkpoints import files as ckpt
    from raycse.train.module import build_module
    from raycse.train.steps import StepEngine

    model, got = _spawn(tmp_path, "simcse", from_ddp=True)
    # a whole (DDP) run's checkpoint resumed by 2 sharded workers: step 6 as DDP took it, each holding its half
    resumed = got["fsdp_from_ddp"]
    assert resumed["loss"] == pytest.approx(got["ddp"]["losses"][STEPS - 1], abs=1e-5)
    for name, value in resumed["weights"].items():
        torch.testing.assert_close(value, got["ddp"]["weights"][STEPS - 1][name], atol=1e-5, rtol=0, msg=name)
    assert resumed["bytes"] <= 0.55 * got["ddp"]["bytes"]
    merged = tmp_path / "merged"
    for rank in (0, 1):
        shutil.copytree(tmp_path / f"rank{rank}", merged, dirs_exist_ok=True)
    assert ckpt.verify(merged) is None
    names = sorted(p.name for p in (merged / ckpt.STATE_DIR / ckpt.DCP_DIR).iterdir())
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp"], names

    # the published model: the whole weights after 5 steps, loadable by both libraries
    after5 = got["ddp"]["weights"][STEPS - 2]
    hf = AutoModel.from_pretrained(merged / ckpt.MODEL_DIR)
    for name, value in hf.state_dict().items():
        torch.testing.assert_close(value, after5[f"encoder.backbone.{name}"], atol=1e-5, rtol=0, msg=name)
    assert SentenceTransformer(str(merged / ckpt.MODEL_DIR), device="cpu").encode(["the city river"]).shape == (1, 32)

    # resumed on one worker: the next step on the global batch of 8 rows
    run = _run(model, "simcse")
    seed_everything(0)
    engine = StepEngine(run, build_module(run), torch.device("cpu"), 10)
    state = ckpt.load(merged, engine.core, engine.opt, engine.sched, 0)
    assert state["step"] == STEPS - 1
    for name, value in engine.core.state_dict().items():
        torch.testing.assert_close(value, after5[name], atol=1e-6, rtol=0, msg=name)
    engine.step(_batch(engine, STEPS - 1, 0, 2 * ROWS), STEPS - 1)
    for name, value in engine.core.state_dict().items():
        torch.testing.assert_close(value, got["ddp"]["weights"][STEPS - 1][name], atol=1e-5, rtol=0, msg=name)

    # on object storage (moto's S3 on 127.0.0.1): found whole with both ranks' parts; one without rank 1's manifest
    # (its upload cut short) is passed over, naming the part
    import boto3

    bucket, s3 = s3_server(), boto3.client("s3")
    for name in ("checkpoint_000001", "checkpoint_000002"):
        for f in (p for p in merged.rglob("*") if p.is_file()):
            if not (name.endswith("2") and f.name == "MANIFEST.rank1.json"):
                s3.put_object(Bucket=bucket, Key=f"run/{name}/{f.relative_to(merged)}", Body=f.read_bytes())
    skipped: list = []
    found = ckpt.whole_checkpoints(f"s3://{bucket}/run", skipped)
    assert [path.rsplit("/", 1)[-1] for _, path in found] == ["checkpoint_000001"]
    assert skipped == ["checkpoint_000002: no readable manifest of rank 1's part (the checkpoint was not finished)"]

    # a part missing or changed: the checkpoint is not whole, and says whose part
    shard1 = merged / ckpt.STATE_DIR / ckpt.DCP_DIR / "__1_0.distcp"
    data = shard1.read_bytes()
    shard1.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert "__1_0.distcp" in ckpt.verify(merged)
    (merged / ckpt.STATE_DIR / "MANIFEST.rank1.json").unlink()
    assert "rank 1's part" in ckpt.verify(merged)
    assert json.loads((merged / ckpt.STATE_DIR / ckpt.SHARDING).read_text()) == {"world_size": 2}


def test_a_sharded_fit_of_a_decoder_publishes_a_whole_model_and_resumes_on_one_worker(ray_cluster, corpus, stsb_dev,
                                                                                     tmp_path, capsys, monkeypatch):
    """Items 1-3 through Ray Train: a tiny Qwen3 on 2 workers with --sharding fsdp --gradient-checkpointing, scored
    on STS-B dev (every worker encodes, rank 0 scores), checkpointed by every worker (DCP) into the run's storage;
    the published model is whole (sentence-transformers and AutoModel load it; its weights moved). The same run
    again on 1 unsharded worker with the same global batch resumes from the sharded checkpoint (that worker in the
    test process: tests/local_session.py, what is proven there is the checkpoint's load)."""
    from safetensors.torch import load_file
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from conftest import make_tiny_decoder
    from raycse.cli import main

    model, out, store = make_tiny_decoder(tmp_path / "qwen3"), tmp_path / "out", tmp_path / "store"
    argv = ["train", "--model", str(model), "--pooling", "lasttoken", "--corpus", str(corpus), "--stsb-dev",
            str(stsb_dev), "--output", str(out), "--storage-path", str(store), "--max-length", "16",
            "--eval-steps", "2", "--log-steps", "2", "--set", "train.lr=1e-3"]
    assert main([*argv, "--max-steps", "4", "--num-workers", "2", "--batch-size", "4", "--sharding", "fsdp",
                 "--gradient-checkpointing"]) == 0
    said = capsys.readouterr()
    assert "STS-B dev Spearman" in said.out + said.err
    checkpoints = sorted(p for p in (store / "train").glob("checkpoint_*") if p.is_dir())
    assert checkpoints
    shards = sorted(p.name for p in (checkpoints[-1] / "state" / "dcp").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"], shards
    base, saved = load_file(str(model / "model.safetensors")), load_file(str(out / "model" / "model.safetensors"))
    assert saved.keys() == base.keys() and any(not torch.equal(saved[k], base[k]) for k in saved)
    AutoModel.from_pretrained(out / "model")
    assert SentenceTransformer(str(out / "model"), device="cpu").encode(["the city river"]).shape == (1, 32)
    assert json.loads((out / "metrics.json").read_text())["last"]["step"] == 4

    from local_session import in_process_fits

    in_process_fits(monkeypatch)
    assert main([*argv, "--max-steps", "6", "--num-workers", "1", "--batch-size", "8",
                 "--overwrite"]) == 0
    assert "resumed from step 4" in capsys.readouterr().out
    assert json.loads((out / "metrics.json").read_text())["last"]["step"] == 6


REFUSES = """
from raycse.objectives.simcse import SimCSE


class ReadsWeights(SimCSE):
    name = "reads_weights"

    def sharding_refusal(self):
        return "it reads every weight of the backbone outside the forward"
"""


def test_an_objective_that_cannot_shard_is_refused_in_one_line(tiny_model, tmp_path, monkeypatch):
    """Item 7: an objective saying it cannot train a sharded model (Objective.sharding_refusal; a plug-in's here: every
    built-in shards) is refused before Ray starts, naming the objective and why; under ddp it trains."""
    from raycse.config import RunConfig
    from raycse.errors import ConfigError
    from raycse.train.module import check_model_fits_objective

    (tmp_path / "reads_weights.py").write_text(REFUSES)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = RunConfig()
    run.model.name_or_path, run.objective.name = str(tiny_model), "reads_weights:ReadsWeights"
    run.train.num_workers = 2
    check_model_fits_objective(run.resolved(), str(tiny_model))
    with pytest.raises(ConfigError, match=r"^--sharding fsdp with objective 'reads_weights': it reads every weight of "
                                          r"the backbone outside the forward; use --sharding ddp$"):
        check_model_fits_objective(run.resolved({"train.sharding": "fsdp"}), str(tiny_model))


def test_a_module_built_without_weights_holds_none_of_the_transformers(tmp_path):
    """Item 4: a sharded worker other than rank 0 builds the transformer on the meta device (no weights read, no
    memory), as from_pretrained would shape and type it; the small heads are real and get rank 0's values later."""
    from conftest import make_tiny_decoder
    from raycse.train.module import build_module

    model = str(make_tiny_decoder(tmp_path / "qwen3"))
    for dtype, expected in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        run = _run(model, "simcse", "fsdp", 2).resolved({"model.dtype": dtype, "train.precision": "bf16",
                                                         "model.mlp_head": "train_only"})
        empty, full = build_module(run, weights=False), build_module(run)
        assert all(p.is_meta for p in empty.encoder.backbone.parameters())
        assert {n: (p.shape, p.dtype) for n, p in empty.named_parameters()} == {
            n: (p.shape, p.dtype) for n, p in full.named_parameters()}
        assert {p.dtype for p in empty.parameters()} == {expected}
        assert not any(p.is_meta for p in empty.encoder.mlp.parameters())
