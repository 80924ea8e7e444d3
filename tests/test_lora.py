"""LoRA adapters (issue 68, item 4): only the adapters (and the objective's training heads) change, the
frozen weights stay bit for bit; the adapted layer is W x + (alpha / r) B A x (Hu et al. 2021, Sec. 4.1),
written here as its own loop over the formula, on raycse's unpadded path too; the saved model is the
merged one sentence-transformers loads, with the adapter beside it for peft; a checkpoint restores
the adapters and the optimizer; a run (its worker loop in the test process) trains, publishes and resumes it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import make_sentences
from raycse.cli import main
from raycse.config import RunConfig
from raycse.errors import ConfigError
from raycse.platform.process_state import seed_everything
from raycse.train.module import build_module, build_optimizer

TEXTS = make_sentences(8, seed=11, min_len=6)
LORA = {"r": 4, "alpha": 8, "target_modules": ["query", "value", "dense"]}


def _run(model, lora=LORA, objective="simcse", **params) -> RunConfig:
    run = RunConfig()
    run.model.name_or_path, run.model.pooling, run.model.lora = str(model), "cls", dict(lora)
    run.objective.name, run.objective.params = objective, dict(params)
    run.train.lr = 1e-2  # big steps: a few must move every adapter
    run.validate()
    return run


def _train(module, run, steps=3):
    opt, sched = build_optimizer(module, run, total_steps=10)
    for _ in range(steps):
        loss = module(module.objective.collate(TEXTS, module.encoder.tokenizer, 24)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return opt, sched


def _frozen(module) -> dict:
    return {n: p.detach().clone() for n, p in module.encoder.backbone.named_parameters() if "lora_" not in n}


def test_only_the_adapters_train_and_the_frozen_weights_stay_bit_for_bit(tiny_model):
    from raycse.model.adapters import trainable_line

    run = _run(tiny_model)
    seed_everything(0)
    module = build_module(run).train()
    before, adapters = _frozen(module), {n: p.detach().clone() for n, p in module.named_parameters()
                                          if "lora_" in n}
    assert adapters and all(not p.requires_grad for n, p in module.encoder.backbone.named_parameters()
                            if "lora_" not in n)
    _train(module, run)
    after = _frozen(module)
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)
    moved = {n for n, p in module.named_parameters() if "lora_" in n and not torch.equal(p, adapters[n])}
    assert moved == set(adapters)  # every A and B moved (B starts at zero)
    line = trainable_line(module, module.encoder.backbone)
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    assert f"trainable parameters: {trainable:,} of " in line and "LoRA r=4 alpha=8" in line
    assert f"{sum(p.numel() for p in adapters.values()):,} in the adapters" in line
    assert "in the training heads" in line  # SimCSE's MLP head (cls pooling, train_only) trains in full


def _lora_layer_by_hand(layer, x):
    """W x + b + (alpha / r) B A x for one adapted linear map, from its tensors (Sec. 4.1)."""
    w, b = layer.base_layer.weight.detach(), layer.base_layer.bias.detach()
    a, bb = layer.lora_A["default"].weight.detach(), layer.lora_B["default"].weight.detach()
    scale = layer.scaling["default"]
    out = torch.empty(x.shape[0], w.shape[0], dtype=torch.float64)
    for i in range(x.shape[0]):
        xi = x[i].double()
        out[i] = w.double() @ xi + b.double() + scale * (bb.double() @ (a.double() @ xi))
    return out


@pytest.mark.parametrize("unpad", [True, False])
def test_the_adapted_layers_compute_w_x_plus_scaled_b_a_x_on_either_path(tiny_model_no_dropout, unpad):
    """After training (B non-zero), the query map inside a forward pass equals the formula, and the
    unpadded path (one fused QKV product for plain layers) gives the padded path's embeddings: it must
    not read W alone from a wrapped layer."""
    run = _run(tiny_model_no_dropout)
    seed_everything(0)
    module = build_module(run).train()
    _train(module, run)
    enc = module.encoder.eval()
    enc.unpad = unpad
    layer = enc.backbone.base_model.model.encoder.layer[0].attention.self.query
    seen = []
    handle = layer.register_forward_hook(lambda m, args, out: seen.append((args[0].detach(), out.detach())))
    with torch.no_grad():
        got = enc.encode(TEXTS)
    handle.remove()
    x, out = seen[0]
    x2, out2 = x.reshape(-1, x.shape[-1]), out.reshape(-1, out.shape[-1])
    np.testing.assert_allclose(out2.double().numpy(), _lora_layer_by_hand(layer, x2).numpy(), atol=1e-5)
    enc.unpad = not unpad
    with torch.no_grad():
        other = enc.encode(TEXTS)
    np.testing.assert_allclose(got, other, atol=1e-5)
    assert enc.can_unpad  # (the BERT layers keep the unpadded path under LoRA)


def test_saved_model_is_merged_for_sentence_transformers_and_the_adapter_loads_with_peft(tiny_model, tmp_path):
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from raycse.model.adapters import ADAPTER_DIR
    from raycse.model.encoder import Encoder

    run = _run(tiny_model)
    seed_everything(0)
    module = build_module(run).train()
    _train(module, run)
    enc = module.encoder.eval()
    frozen = _frozen(module)
    enc.save(tmp_path / "m")
    assert all(torch.equal(frozen[n], p) for n, p in module.encoder.backbone.named_parameters() if "lora_" not in n)
    with torch.no_grad():
        ours = enc.encode(TEXTS)
    theirs = SentenceTransformer(str(tmp_path / "m"), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(theirs, ours, atol=1e-5)
    reloaded = Encoder.from_pretrained(str(tmp_path / "m")).eval()
    np.testing.assert_allclose(reloaded.encode(TEXTS), ours, atol=1e-5)
    assert (tmp_path / "m" / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "m" / "adapter_config.json").exists()  # the model directory is a plain model
    peft_model = PeftModel.from_pretrained(AutoModel.from_pretrained(str(tiny_model)), str(tmp_path / "m" / ADAPTER_DIR))
    batch = enc.tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        cls = peft_model.eval()(**batch).last_hidden_state[:, 0]
        merged = AutoModel.from_pretrained(str(tmp_path / "m")).eval()(**batch).last_hidden_state[:, 0]
    np.testing.assert_allclose(cls.numpy(), merged.numpy(), atol=1e-5)


def test_a_checkpoint_restores_the_adapters_and_the_optimizer(tiny_model_no_dropout, tmp_path):
    """Train 2 steps, checkpoint, 1 more step; a fresh module loading the checkpoint takes the same
    third step to the same weights (what a resumed worker does)."""
    from raycse.train.checkpoints import files as checkpoint

    run = _run(tiny_model_no_dropout)
    seed_everything(0)
    module = build_module(run).train()
    opt, sched = _train(module, run, steps=2)
    checkpoint.write_rng(tmp_path / "c", 0)  # (first, as the checkpointer writes them)
    checkpoint.write(tmp_path / "c", module, opt, sched, {"step": 2})
    _step(module, opt, sched)
    seed_everything(5)  # another start: the checkpoint must bring back everything that matters
    again = build_module(run).train()
    opt2, sched2 = build_optimizer(again, run, total_steps=10)
    assert checkpoint.load(tmp_path / "c", again, opt2, sched2, rank=0)["step"] == 2
    _step(again, opt2, sched2)
    want = dict(module.named_parameters())
    assert all(torch.equal(p, want[n]) for n, p in again.named_parameters())


def _step(module, opt, sched):
    loss = module(module.objective.collate(TEXTS, module.encoder.tokenizer, 24)).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()


@pytest.mark.parametrize("lora, message", [
    ({"rank": 4}, "model.lora has 'rank'; its keys are r, alpha, dropout, target_modules"),
    ({"r": 0}, "model.lora.r must be a whole number >= 1"),
    ({"r": 4, "alpha": -1}, "model.lora.alpha must be a number > 0"),
    ({"dropout": 1.5}, "model.lora.dropout must be in [0, 1)"),
    ({"target_modules": []}, "model.lora.target_modules must name modules"),
])
def test_bad_lora_settings_are_one_line(lora, message):
    run = RunConfig()
    run.model.lora = lora
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        run.validate()


def test_set_reads_numbers_and_lists_and_sgopt_with_its_regularizer_is_refused(tiny_model, corpus, tmp_path, capsys):
    from raycse.config import set_dotted

    run = RunConfig()
    set_dotted(run, "model.lora.r", "16")
    set_dotted(run, "model.lora.target_modules", "[query, key]")
    assert run.model.lora == {"r": 16, "target_modules": ["query", "key"]}
    out = tmp_path / "out"
    argv = ["train", "--model", str(tiny_model), "--corpus", str(corpus), "--stsb-dev", "none", "--output", str(out),
            "--objective", "sgopt", "--lora", "{r: 4}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["raycse: error: model.lora with objective 'sgopt': its regularizer lam * sum ||theta_T - theta_F||^2 "
                   "compares every backbone weight with the frozen copy's, and LoRA trains none of them; set "
                   "objective.lam=0 or drop model.lora"], err
    assert not out.exists()
    run = _run(tiny_model, objective="sgopt", lam=0.0)  # without the regularizer SG-OPT trains adapters
    module = build_module(run)
    assert not any(p.requires_grad for p in module.objective.frozen.parameters())
    assert not any("lora_" in n for n, _ in module.objective.frozen.named_parameters())  # F: the plain copy


def test_a_run_trains_the_adapters_publishes_the_merged_model_and_resumes(ray_cluster, tiny_model, corpus, stsb_dev,
                                                                          tmp_path, capsys, caplog):
    """`raycse train --lora ...` as its worker loop runs it (in this process: tests/local_session.py): the run says
    what trains, the published output is the merged model and its adapter, and the same run again resumes from its
    last checkpoint."""
    from sentence_transformers import SentenceTransformer
    from safetensors.torch import load_file

    from local_session import fit_in_process, run_of
    from raycse.train.fit import report_resume

    out, store = tmp_path / "out", tmp_path / "store"
    argv = ["--model", str(tiny_model), "--corpus", str(corpus), "--stsb-dev", str(stsb_dev), "--output", str(out),
            "--batch-size", "8", "--max-length", "16", "--max-steps", "4", "--eval-steps", "2", "--log-steps", "2",
            "--lora", "{r: 4, alpha: 8}", "--set", "train.lr=1e-2"]
    fit = fit_in_process(run_of(argv), store)
    said = [r.getMessage() for r in caplog.records if "trainable parameters:" in r.getMessage()]  # (rank 0's log)
    assert len(said) == 1 and "LoRA r=4 alpha=8 on query, value" in said[0], said
    fit.publish(out)
    base = load_file(str(tiny_model / "model.safetensors"))
    saved = load_file(str(out / "model" / "model.safetensors"))
    assert saved.keys() == base.keys()
    changed = {k for k in saved if not torch.equal(saved[k], base[k])}
    assert changed and all(k.endswith(("query.weight", "value.weight")) for k in changed), changed
    adapter = load_file(str(out / "model" / "adapter" / "adapter_model.safetensors"))
    assert any("lora_B" in k and adapter[k].abs().sum() > 0 for k in adapter)
    SentenceTransformer(str(out / "model"), device="cpu").encode(["a village by the river"])
    card = (out / "model" / "README.md").read_text()
    assert "## LoRA adapter" in card and "r=4, alpha=8" in card
    assert json.loads((out / "metrics.json").read_text())["last"]["step"] == 4
    capsys.readouterr()
    again = fit_in_process(run_of(argv), store)
    report_resume(again.last["resumed"])  # (what the driver says after the fit)
    assert "resumed from step 4" in capsys.readouterr().out
    assert again.last["step"] == 4 and load_file(str(again.model_dir() / "model.safetensors")).keys() == saved.keys()


def test_targets_the_model_lacks_are_refused_before_anything_starts(tiny_model, corpus, tmp_path, capsys):
    """peft's own check of target_modules, run on the driver over the weightless architecture: one line
    and exit 2, not a traceback from every worker."""
    out = tmp_path / "out"
    argv = ["train", "--model", str(tiny_model), "--corpus", str(corpus), "--stsb-dev", "none", "--output", str(out),
            "--lora", "{target_modules: [nosuch]}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("raycse: error: model.lora: No modules were targeted"), err
    assert not out.exists()
    assert main([*argv[:-1], "{r: 4", "--print-config"]) == 2  # bad YAML: one line naming an example
    assert capsys.readouterr().err.strip() == ("raycse: error: model.lora must be a YAML mapping such as "
                                               "'{r: 8, alpha: 16}', got '{r: 4'")
