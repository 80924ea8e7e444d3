"""Issue 107 item 6: each worker's memory estimated before Ray starts (raycse.train.memory), a run that will not
fit refused in one line naming what would make it fit, and ``raycse train --dry-run`` printing the plan without
starting Ray or writing anything. The activations are counted on the meta device; the second way here is the
real step on the tiny BERT, whose saved tensors are added up as it runs."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from conftest import WORDS
from raycse.config import RunConfig
from raycse.errors import ConfigError
from raycse.train import memory


def _run(model, **train) -> RunConfig:
    run = RunConfig()
    run.model.name_or_path, run.model.max_length = str(model), 32
    run.train = dataclasses.replace(run.train, **{"batch_size": 8, **train})
    return run.resolved()


def _measured_saved_bytes(run: RunConfig) -> int:
    """What autograd saves in one real SimCSE forward of raycse's module, every sentence at the full length."""
    from raycse.train.module import build_module

    module = build_module(run).train()
    texts = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(60)) for i in range(run.train.batch_size)]
    batch = module.objective.collate(texts, module.encoder.tokenizer, run.model.max_length)
    assert batch["input_ids"].shape[1] == run.model.max_length
    module(batch)  # (a first forward outside the count: the oneDNN kernel probe may run in it, once a machine)
    params = {p.data_ptr() for p in module.parameters()}
    storages: dict = {}

    def pack(t):  # (each storage once, the weights left out: what the step holds, by its real addresses)
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(batch)
    return sum(storages.values())


def test_the_counted_activations_are_what_a_real_step_keeps(tiny_model):
    """The meta-device count of the backbone against the real step's forward (raycse's module: the backbone, the
    pooling, the MLP head, the loss), HF's padded layers."""
    from raycse.model.loading import empty_backbone_of

    run = _run(tiny_model, unpad=False)
    counted = memory._saved_bytes(empty_backbone_of(str(tiny_model)), memory.rows_per_worker(run),
                                  run.model.max_length)
    real = _measured_saved_bytes(run)
    assert 0.8 * real <= counted <= 1.25 * real, (counted, real)


def test_the_fake_tensor_count_is_what_the_same_forward_keeps_on_real_tensors(tmp_path):
    """The estimate's fallback where a model refuses the meta device (transformers 5.0's rotary embeddings, so every
    decoder on the floor release): the forward on fake CPU tensors saves what the same forward on real CPU tensors
    saves, storage by storage, for a tiny Qwen3."""
    from test_decoders import make_decoder
    from transformers import AutoModel

    model = make_decoder(tmp_path / "qwen3", "qwen3")
    backbone = AutoModel.from_pretrained(str(model)).train()
    rows, tokens = 6, 24
    params = {p.data_ptr() for p in backbone.parameters()}
    storages: dict = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        backbone(input_ids=torch.randint(5, 90, (rows, tokens)))
    counted = memory.fake_saved_bytes(backbone.config, rows, tokens)
    assert counted == sum(storages.values()) > 0
    # and the meta device's count, less the attention weights its plain-softmax SDPA keeps (the CPU's SDPA kernel,
    # no dropout in a decoder's attention, keeps none): the same bytes within 5% (the kernels save their own
    # small tensors, a row's log-sum-exp, beside the same inputs)
    from raycse.model.loading import empty_backbone_of

    meta = empty_backbone_of(str(model))
    assert memory._saved_bytes(meta, rows, tokens, attention=False) == pytest.approx(counted, rel=0.05)
    on_meta = memory._forward_saved(meta, torch.zeros(rows, tokens, dtype=torch.long, device="meta"))
    if on_meta is not None:  # (transformers 5.0's decoders refuse the meta device: the fake tensors count then)
        assert on_meta > counted  # (what the weights left out would add)


def test_each_part_follows_the_run(tiny_model):
    plain = memory.estimate(_run(tiny_model), str(tiny_model))
    assert plain.weights == 4 * plain.params
    assert plain.optimizer == (8 + 4 * memory.STEP_COPIES) * plain.trainable  # (moments, the step's temporaries)
    assert plain.rows == 16 and plain.tokens == 32  # (two views of each of 8 sentences)
    two = memory.estimate(_run(tiny_model, num_workers=2), str(tiny_model))
    assert two.gradients == 2 * plain.gradients  # (DDP's buckets)
    ckpt = memory.estimate(_run(tiny_model, gradient_checkpointing=True), str(tiny_model))
    assert ckpt.activations < plain.activations
    cached = memory.estimate(_run(tiny_model, cache_chunk_size=4), str(tiny_model))
    assert cached.rows == 4 and cached.activations < plain.activations
    run = _run(tiny_model)
    run = run.resolved({"objective.name": "sgopt"})
    assert memory.estimate(run, str(tiny_model)).weights == 2 * plain.weights  # (the frozen copy)


def test_a_sharded_worker_holds_its_share_and_what_fsdp_gathers(tiny_model):
    """--sharding fsdp: 1/N of the weights, gradients and AdamW a worker, plus the root group (everything outside the
    blocks) and two blocks' weights and one block's gradients held whole; the same activations as DDP's."""
    from raycse.model.loading import empty_backbone_of

    backbone = empty_backbone_of(str(tiny_model))
    params = sum(p.numel() for p in backbone.parameters())
    # FSDP's groups: BERT names BertEmbeddings and BertLayer in _no_split_modules; the rest (the pooler) is the root's
    units = [backbone.embeddings, *backbone.encoder.layer]
    sizes = [sum(p.numel() for p in unit.parameters()) for unit in units]
    block, root = max(sizes), params - sum(sizes)
    ddp = memory.estimate(_run(tiny_model, num_workers=4), str(tiny_model))
    fsdp = memory.estimate(_run(tiny_model, num_workers=4, sharding="fsdp"), str(tiny_model))
    assert fsdp.weights == 4 * (params // 4) + 4 * (root + 2 * block)
    assert fsdp.gradients == 4 * (ddp.trainable // 4) + 4 * block
    assert fsdp.optimizer == (8 + 4 * memory.STEP_COPIES) * (ddp.trainable // 4)
    assert fsdp.activations == ddp.activations and fsdp.total < ddp.total
    offloaded = memory.estimate(_run(tiny_model, num_workers=4, sharding="fsdp", fsdp_offload="cpu", use_gpu=True),
                                str(tiny_model))
    assert offloaded.optimizer == 0 and offloaded.weights == 4 * (root + 2 * block)  # (the GPU holds what is gathered)


def test_a_run_that_will_not_fit_is_refused_in_one_line_naming_the_fixes(tiny_model, monkeypatch):
    run = _run(tiny_model)
    monkeypatch.setattr(memory, "worker_memory", lambda r: (1 << 16, "64 KB, for this test"))
    with pytest.raises(ConfigError, match=r"each worker needs about .* GB .* and has 0.0 GB \(64 KB, for this test\); "
                                          r"try --sharding fsdp on 2 or more workers, --gradient-checkpointing, LoRA .*GradCache") as err:
        memory.check_fits(run, str(tiny_model))
    assert "\n" not in str(err.value)
    assert memory.check_fits(run.resolved({"train.memory_check": False}), str(tiny_model)) is None
    monkeypatch.undo()
    assert memory.check_fits(run, str(tiny_model)).total < (1 << 30)  # (the tiny BERT fits this machine)


def test_dry_run_prints_the_plan_and_starts_and_writes_nothing(tiny_model, tmp_path, capsys, monkeypatch):
    from conftest import make_sentences
    from raycse.cli import main

    import ray

    from conftest import ray_sessions

    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.txt").write_text("\n".join(make_sentences(100)) + "\n")
    def own():  # (this process's Ray sessions: the suite's other process starts its own meanwhile)
        return {s for s in ray_sessions() if s[1] == os.getpid()}

    joined, sessions = ray.is_initialized(), own()  # (this process may hold the suite's shared Ray)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["train", "--model", str(tiny_model), "--corpus", "c.txt", "--stsb-dev", "none", "--output", "out",
                 "--num-workers", "2", "--batch-size", "16", "--gradient-checkpointing", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "workers: 2" in out and "DDP" in out and "gradient checkpointing" in out
    assert "memory a worker: about" in out and "100 usable examples" in out and "3 steps an epoch" in out
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert ray.is_initialized() == joined and own() == sessions  # no Ray started, none joined
    assert main(["train", "--model", str(tiny_model), "--corpus", "c.txt", "--stsb-dev", "none", "--output", "out",
                 "--num-workers", "2", "--batch-size", "16", "--sharding", "fsdp", "--attention", "eager",
                 "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "sharding: FSDP2 over 2 worker(s) (each holds 1/2" in said and ", attention eager" in said
    assert "attention the model's default (SDPA" in out  # (auto on CPUs)


def test_a_search_whose_runs_will_not_fit_is_refused_before_ray_starts(tiny_model, corpus, stsb_dev, tmp_path, capsys):
    """raycse tune checks the space's run as raycse train does: each worker's estimate against this machine's
    memory (a batch of 2M sentences here), one line naming the fixes as a search sets them, exit 2, nothing
    written, no Ray."""
    import ray
    import yaml

    from conftest import ray_sessions
    from raycse.cli import main

    def own():  # (this process's Ray sessions: the suite's other process starts its own meanwhile)
        return {s for s in ray_sessions() if s[1] == os.getpid()}

    joined, sessions = ray.is_initialized(), own()  # (this process may hold the suite's shared Ray)
    space = tmp_path / "space.yaml"
    run = {"model": {"name_or_path": str(tiny_model), "max_length": 32}, "data": {"corpus": str(corpus)},
           "train": {"batch_size": 2_000_000}, "eval": {"stsb_dev": str(stsb_dev)}}
    space.write_text(yaml.safe_dump({"run": run, "search": {"lr": {"loguniform": [1e-5, 1e-4]}}}))
    before = sorted(tmp_path.iterdir())
    assert main(["tune", "--space", str(space), "--storage-path", str(tmp_path / "exp")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a trial's run will not fit: each worker needs about" in err[0]
    assert "--set run.train.sharding=fsdp" in err[0] and "--gradient-checkpointing" in err[0]
    assert sorted(tmp_path.iterdir()) == before
    assert ray.is_initialized() == joined and own() == sessions  # no Ray started, none joined
