"""Training speed parts: the unpadded (packed) BERT forward equals the padded Hugging Face forward (values
and gradients), the cheaper CPU dropout, and the Train workers' malloc settings."""

import pytest
import torch

from raycse.model.encoder import Encoder
from raycse.model.unpad import supports_unpadding, unpadded_forward

SENTENCES = ["the city", "a small village was built on the river", "king", "the old stone bridge",
             "north", "summer music festival in the large city"]


def test_matches_the_padded_forward_on_every_real_token(tiny_model_no_dropout):
    enc = Encoder.from_pretrained(str(tiny_model_no_dropout), pooling="mean")
    backbone = enc.backbone.train()  # training mode, dropout 0: the path used in training, deterministic
    batch = enc.tokenize(SENTENCES)
    ref = backbone(**batch, output_hidden_states=True)
    got = unpadded_forward(backbone, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                           output_hidden_states=True)
    real = batch["attention_mask"].bool()
    assert got.last_hidden_state.shape == ref.last_hidden_state.shape
    assert len(got.hidden_states) == len(ref.hidden_states) == backbone.config.num_hidden_layers + 1
    for a, b in zip(got.hidden_states, ref.hidden_states):
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)
    assert float(got.last_hidden_state.detach()[~real].abs().sum()) == 0.0  # padded positions are zeros


def test_same_gradients_as_the_padded_forward(tiny_model_no_dropout):
    enc = Encoder.from_pretrained(str(tiny_model_no_dropout), pooling="mean").train()
    batch = enc.tokenize(SENTENCES)
    assert enc.can_unpad
    results = []
    for unpad in (False, True):
        enc.unpad, enc.length_buckets = unpad, 1
        enc.zero_grad()
        z = enc(**batch)
        z.pow(2).sum().backward()
        grads = {n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None}
        results.append((z.detach(), grads))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-5)
    assert results[0][1].keys() == results[1][1].keys() and len(results[0][1]) > 10
    for name, g in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_dropout_still_applies_when_training(tiny_model):
    enc = Encoder.from_pretrained(str(tiny_model), pooling="mean").train()
    enc.unpad = True
    batch = enc.tokenize(SENTENCES)
    with torch.no_grad():
        a, b = enc(**batch), enc(**batch)
        enc.eval()  # inference (unpadded too) never drops out
        c, d = enc(**batch), enc(**batch)
    assert not torch.allclose(a, b)  # two dropout masks: SimCSE's two views
    torch.testing.assert_close(c, d)


def test_inference_embeddings_match_the_padded_forward(tiny_model):
    enc = Encoder.from_pretrained(str(tiny_model), pooling="mean")
    assert enc.unpad and enc.can_unpad  # the default for BERT-family encoders
    texts = SENTENCES * 3
    unpadded = enc.encode(texts, batch_size=4)
    enc.unpad, enc.onednn = False, False  # the plain Hugging Face forward
    padded = enc.encode(texts, batch_size=4)
    assert abs(padded).sum() > 0
    torch.testing.assert_close(torch.from_numpy(unpadded), torch.from_numpy(padded), atol=1e-5, rtol=1e-5)


def test_only_bert_family_encoders_unpad(tiny_model):
    from transformers import BertConfig, BertModel, DistilBertConfig, DistilBertModel

    assert supports_unpadding(Encoder.from_pretrained(str(tiny_model)).backbone)
    small = dict(hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=50)
    assert not supports_unpadding(BertModel(BertConfig(num_hidden_layers=1, is_decoder=True, **small)))
    assert not supports_unpadding(DistilBertModel(DistilBertConfig(n_layers=1, dim=32, n_heads=2, hidden_dim=64,
                                                                   vocab_size=50)))


@pytest.mark.parametrize("objective", ["simcse", "sgopt"])
def test_objectives_train_the_same_with_unpadding(tiny_model_no_dropout, objective):
    """A loss computed through the objective is the same with and without unpadding (no dropout)."""
    from raycse.objectives import registry

    losses = []
    for unpad in (False, True):
        enc = Encoder.from_pretrained(str(tiny_model_no_dropout), pooling="mean").train()
        enc.unpad = unpad
        torch.manual_seed(0)  # the same random projection head both times
        obj = registry.build(objective, {})
        obj.setup(enc)
        batch = obj.collate(SENTENCES, enc.tokenizer, 16)
        losses.append(float(obj(enc, batch).loss.detach()))
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)


def test_fast_dropout_keeps_each_value_with_probability_1_minus_p_and_scales_it():
    from raycse.model.unpad import dropout

    torch.manual_seed(0)
    x = torch.full((400, 500), 2.0, requires_grad=True)
    y = dropout(x, 0.1)
    kept = y.detach() != 0
    rate = float(kept.float().mean())
    p_eff = round(0.1 * 32768) / 32768
    assert abs(rate - (1 - p_eff)) < 4 * (p_eff * (1 - p_eff) / x.numel()) ** 0.5  # 4 sigma
    torch.testing.assert_close(y.detach()[kept], torch.full((int(kept.sum()),), 2.0 / (1 - p_eff)))
    y.sum().backward()  # d y / d x = keep / (1 - p)
    torch.testing.assert_close(x.grad, kept.float() / (1 - p_eff))
    # neighbouring draws are independent (four come from one random word)
    k = kept.view(-1).float()
    assert abs(float(torch.corrcoef(torch.stack([k[:-1], k[1:]]))[0, 1])) < 0.01
    assert abs(float(torch.corrcoef(torch.stack([k[:-4], k[4:]]))[0, 1])) < 0.01
    torch.testing.assert_close(dropout(x, 0.1, training=False), x)
    assert float(dropout(x, 1.0).abs().sum()) == 0.0


def test_fast_dropout_swaps_every_dropout_module_and_saved_models_stay_plain(tiny_model, tmp_path):
    from torch import nn
    from transformers import AutoModel

    from raycse.model.unpad import FastDropout, use_fast_dropout

    enc = Encoder.from_pretrained(str(tiny_model), pooling="mean")
    plain = sum(type(m) is nn.Dropout for m in enc.backbone.modules())
    assert use_fast_dropout(enc.backbone) == plain > 0
    assert not any(type(m) is nn.Dropout for m in enc.backbone.modules())
    assert all(m.p == 0.1 for m in enc.backbone.modules() if isinstance(m, FastDropout))
    enc.save(tmp_path / "m")
    reloaded = AutoModel.from_pretrained(tmp_path / "m")
    assert sum(type(m) is nn.Dropout for m in reloaded.modules()) == plain


def test_train_workers_get_the_malloc_settings_unless_already_set(monkeypatch):
    from raycse.platform.process_state import TRAIN_WORKER_MALLOC, train_worker_env

    for key in TRAIN_WORKER_MALLOC:
        monkeypatch.delenv(key, raising=False)
    assert train_worker_env() == TRAIN_WORKER_MALLOC
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")  # the user's choice is inherited, not overridden
    assert "MALLOC_ARENA_MAX" not in train_worker_env() and len(train_worker_env()) == len(TRAIN_WORKER_MALLOC) - 1


def test_sgopt_frozen_views_unpadded_equal_padded(tiny_model):
    from raycse.objectives import registry

    enc = Encoder.from_pretrained(str(tiny_model), pooling="mean").train()
    obj = registry.build("sgopt", {})
    obj.setup(enc)
    batch = obj.collate(SENTENCES, enc.tokenizer, 16)
    padded, unpadded = obj.views(batch), obj.views(batch, unpad=True)
    assert padded.shape[1] == enc.backbone.config.num_hidden_layers + 1  # every layer incl. embeddings
    torch.testing.assert_close(unpadded, padded, atol=1e-5, rtol=1e-5)
