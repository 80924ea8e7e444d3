"""Issue 107 item 3: ``--gradient-checkpointing`` recomputes each layer's activations in the backward pass:
the same loss and gradients as without (dropout on: the recomputed layers draw the same masks), and fewer
activations kept between forward and backward (counted as the bytes autograd saves). On the tiny BERT through
raycse's unpadded layers and HF's padded ones, and on tiny Qwen3 and Llama decoders (last-token pooling)."""

from __future__ import annotations

import pytest
import torch

from conftest import make_sentences, make_tiny_decoder
from raycse.config import RunConfig
from raycse.platform.process_state import seed_everything
from raycse.train.module import build_module

TEXTS = make_sentences(8, seed=4, min_len=4)


@pytest.fixture(autouse=True)
def onednn_chosen(monkeypatch):
    """As on a machine whose kernel probe chose oneDNN's fp32 linears: a checkpointed layer's recomputation ran
    outside their context and failed ("Recomputed values ... have different metadata"), where the probe chose so."""
    monkeypatch.setenv("RAYCSE_ONEDNN", "1")


def _loss_grads_saved(model: str, pooling: str, checkpointing: bool, unpad: bool) -> tuple:
    """One SimCSE step's loss, its gradients and the bytes autograd saved for backward."""
    run = RunConfig()
    run.model.name_or_path, run.model.pooling = model, pooling
    run.train.gradient_checkpointing, run.train.unpad = checkpointing, unpad
    seed_everything(0)
    module = build_module(run.resolved())
    module.train()
    batch = module.objective.collate(TEXTS, module.encoder.tokenizer, 32)
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    seed_everything(1)  # (the dropout masks)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = module(batch).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    return loss.detach(), grads, sum(saved)


@pytest.mark.parametrize("unpad", [True, False])
def test_checkpointing_gives_the_same_gradients_and_keeps_fewer_activations_on_bert(tiny_model, unpad):
    plain = _loss_grads_saved(str(tiny_model), "cls", False, unpad)
    ckpt = _loss_grads_saved(str(tiny_model), "cls", True, unpad)
    torch.testing.assert_close(ckpt[0], plain[0], atol=1e-6, rtol=0)
    assert plain[1].keys() == ckpt[1].keys() and len(plain[1]) > 10
    for name, grad in plain[1].items():
        torch.testing.assert_close(ckpt[1][name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert ckpt[2] < 0.7 * plain[2], (ckpt[2], plain[2])


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_checkpointing_gives_the_same_gradients_on_decoders(tmp_path, kind):
    model = str(make_tiny_decoder(tmp_path / kind, kind))
    plain = _loss_grads_saved(model, "lasttoken", False, True)
    ckpt = _loss_grads_saved(model, "lasttoken", True, True)
    torch.testing.assert_close(ckpt[0], plain[0], atol=1e-6, rtol=0)
    for name, grad in plain[1].items():
        torch.testing.assert_close(ckpt[1][name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert ckpt[2] < 0.7 * plain[2], (ckpt[2], plain[2])


def test_a_model_without_checkpointing_is_refused_in_one_line():
    from raycse.errors import ModelError
    from raycse.model.encoder import check_checkpointing

    with pytest.raises(ModelError, match="--gradient-checkpointing: Linear has no gradient checkpointing"):
        check_checkpointing(torch.nn.Linear(2, 2))
