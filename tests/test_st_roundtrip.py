"""Sentence-transformers round trip (issue 41, item 6): models built by sentence-transformers itself
with every pooling mode, Dense layers and Normalize give, through raycse, the embeddings that
``SentenceTransformer(path).encode`` gives, before and after training; saving keeps the modules
raycse does not train, the prompts and the similarity function; what raycse cannot reproduce is
refused in one line. The reference is sentence-transformers' own code, not raycse's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import make_sentences, own_lines
from raycse.cli import main
from raycse.model.encoder import Encoder

SENTENCES = ["the city river was built", "a small village", "king", "the old stone bridge over the river",
             "north", "summer music festival in the large city of the south"]
MODES = ["cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]


def build_st(tiny: Path, out: Path, mode: str, dense: int = 0, normalize: bool = False,
             st_extra: dict | None = None) -> Path:
    """A sentence-transformers model over the tiny BERT, written by sentence-transformers."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    torch.manual_seed(len(mode) + dense)
    body = Transformer(str(tiny), max_seq_length=32)
    dim = body.get_embedding_dimension()
    modules = [body, Pooling(dim, pooling_mode=mode)]
    widths = [dim, 24, 16][:dense + 1]
    for a, b in zip(widths, widths[1:]):
        modules.append(Dense(a, b, activation_function=torch.nn.Tanh() if b == 24 else torch.nn.Identity()))
    if normalize:
        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device="cpu")
    if st_extra:
        model.prompts = st_extra.get("prompts", {})
        model.similarity_fn_name = st_extra.get("similarity_fn_name", "cosine")
    model.save(str(out))
    return out


def st_encode(path: Path, sentences=SENTENCES) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu").encode(sentences, convert_to_numpy=True)


def modules_of(path: Path) -> list[str]:
    return [m["type"].rsplit(".", 1)[-1] for m in json.loads((path / "modules.json").read_text())]


def module_files(path: Path) -> dict:
    """modules.json and each module's own config, as written (sentence-transformers' names and keys)."""
    modules = json.loads((path / "modules.json").read_text())
    configs = {m["path"]: json.loads((path / m["path"] / name).read_text())
               for m in modules for name in ("config.json", "sentence_bert_config.json")
               if m["path"] and (path / m["path"] / name).is_file()}
    return {"modules": modules, "configs": configs,
            "body": json.loads((path / "sentence_bert_config.json").read_text())}


def nudge(enc: Encoder) -> None:
    """A few optimizer steps on a contrastive loss (every trainable weight moves)."""
    opt = torch.optim.AdamW([p for p in enc.parameters() if p.requires_grad], lr=1e-2)
    enc.train()
    batch = enc.tokenize(SENTENCES)
    for _ in range(3):
        z = torch.nn.functional.normalize(enc(**batch), dim=-1)
        loss = torch.nn.functional.cross_entropy(z @ z.T / 0.05, torch.arange(len(SENTENCES)))
        loss.backward()
        opt.step()
        opt.zero_grad()
    enc.eval()


@pytest.mark.parametrize("mode, dense, normalize", [(m, 0, False) for m in MODES]
                         + [("mean", 2, True), ("cls", 1, False), ("weightedmean", 0, True), ("lasttoken", 1, True)])
def test_raycse_embeds_as_sentence_transformers_before_and_after_training(tiny_model_no_dropout, tmp_path, mode,
                                                                          dense, normalize):
    base = build_st(tiny_model_no_dropout, tmp_path / "base", mode, dense, normalize)
    enc = Encoder.from_pretrained(str(base))
    np.testing.assert_allclose(enc.encode(SENTENCES), st_encode(base), atol=1e-5)
    frozen = [layer.linear.weight.detach().clone() for layer in enc.dense]
    before = enc.backbone.embeddings.word_embeddings.weight.detach().clone()

    nudge(enc)
    assert not torch.equal(before, enc.backbone.embeddings.word_embeddings.weight)  # it did train
    assert all(torch.equal(w, layer.linear.weight) for w, layer in zip(frozen, enc.dense))  # Dense is not trained
    saved = enc.save(tmp_path / "trained")
    # the installed sentence-transformers' own files (class paths, config keys), as it wrote the base
    assert module_files(saved) == module_files(base)
    assert not [p.name for p in saved.iterdir() if p.name.startswith(".")]  # no staging left
    ours = enc.encode(SENTENCES)
    np.testing.assert_allclose(st_encode(saved), ours, atol=1e-5)
    np.testing.assert_allclose(Encoder.from_pretrained(str(saved)).encode(SENTENCES), ours, atol=1e-5)
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_a_trained_model_keeps_dense_normalize_prompts_and_similarity(ray_cluster, tiny_model_no_dropout, tmp_path,
                                                                     stsb_dev, capsys):
    """`raycse train --matryoshka-dims` (its worker loop in this process) on a sentence-transformers model (weighted mean, two Dense, Normalize,
    prompts, dot similarity), then `raycse eval`: the output loads in sentence-transformers with the same
    modules, prompts and similarity, and eval's score is the one sentence-transformers' embeddings give.
    Matryoshka (issue 68, item 2; one fit for both): the model keeps its sizes, eval scores each prefix (the
    score of sentence-transformers' truncate_dim embeddings), and the card says how to serve them."""
    from scipy.stats import spearmanr
    from sentence_transformers import SentenceTransformer

    from raycse.evaluation.sts import read_stsb

    extra = {"prompts": {"query": "query: "}, "similarity_fn_name": "dot"}
    base = build_st(tiny_model_no_dropout, tmp_path / "base", "weightedmean", 2, True, extra)
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(make_sentences(64, seed=5)) + "\n")
    from local_session import fit_in_process, run_of

    out = tmp_path / "out"  # (trained through the worker loop in this process, published as the driver does)
    fit_in_process(run_of(["--model", str(base), "--pooling", "weightedmean", "--corpus", str(corpus),
                           "--stsb-dev", "none", "--batch-size", "16", "--max-length", "16", "--max-steps", "3",
                           "--matryoshka-dims", "16,8,4", "--output", str(out)]), tmp_path / "ckpt").publish(out)
    model = out / "model"
    assert modules_of(model) == ["Transformer", "Pooling", "Dense", "Dense", "Normalize"]
    cfg = json.loads((model / "config_sentence_transformers.json").read_text())
    assert cfg["prompts"] == extra["prompts"] and cfg["similarity_fn_name"] == "dot"
    for rel in ("2_Dense", "3_Dense"):  # the frozen layers are written back unchanged
        assert (model / rel / "model.safetensors").read_bytes() == (base / rel / "model.safetensors").read_bytes()
    st = SentenceTransformer(str(model), device="cpu")
    assert st.similarity_fn_name == "dot" and st.prompts == SentenceTransformer(str(base), device="cpu").prompts
    np.testing.assert_allclose(Encoder.from_pretrained(str(model)).encode(SENTENCES),
                               st.encode(SENTENCES, convert_to_numpy=True), atol=1e-5)
    assert json.loads((model / "raycse.json").read_text())["matryoshka_dims"] == [16, 8, 4]
    assert "truncate_dim=4" in (model / "README.md").read_text()

    report = tmp_path / "eval.json"
    capsys.readouterr()
    assert main(["eval", str(model), "--stsb-dev", str(stsb_dev), "--json", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "dims" in printed and "8" in printed
    ours = json.loads(report.read_text())
    pairs = read_stsb(stsb_dev)

    def st_score(truncate_dim=None) -> float:
        st_cut = SentenceTransformer(str(model), device="cpu", truncate_dim=truncate_dim)
        a = st_cut.encode(pairs.sent1, convert_to_numpy=True)
        b = st_cut.encode(pairs.sent2, convert_to_numpy=True)
        assert a.shape[1] == (truncate_dim or 16)
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        return 100 * spearmanr(cos, pairs.gold).correlation

    got = [v for k, v in _flatten({k: v for k, v in ours.items() if k != "dims"}) if "STSB-dev" in k]
    assert got and abs(got[0] - st_score()) < 1e-3, (got, st_score())
    for d in (8, 4):
        assert list(ours["dims"][str(d)].values())[0] == pytest.approx(st_score(d), abs=1e-3)
    capsys.readouterr()
    assert main(["eval", str(model), "--stsb-dev", str(stsb_dev), "--dims", "64"]) == 2
    err = own_lines(capsys.readouterr().err)
    assert len(err) == 1 and "--dims must be sizes from 1 to the model's 16" in err[0]


def _flatten(d, prefix=""):
    for k, v in (d.items() if isinstance(d, dict) else enumerate(d)):
        if isinstance(v, (dict, list)):
            yield from _flatten(v, f"{prefix}{k}.")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield f"{prefix}{k}", float(v)


def _edit(path: Path, name: str, change) -> None:
    data = json.loads((path / name).read_text())
    (path / name).write_text(json.dumps(change(data)))


REFUSED = {
    "two pooling modes": ("1_Pooling/config.json", lambda c: {**c, "pooling_mode": ["mean", "max"]},
                          "supports exactly one of"),
    "an unknown module": ("modules.json", lambda m: m + [{"idx": 9, "name": "9", "path": "9_LayerNorm",
                                                           "type": "sentence_transformers.models.LayerNorm"}],
                          "not sentence_transformers.models.LayerNorm"),
    "a default prompt it lacks": ("config_sentence_transformers.json",
                                  lambda c: {**c, "prompts": {"q": "q: "}, "default_prompt_name": "query"},
                                  "which its prompts (q) lack"),
    "prompts that are not texts": ("config_sentence_transformers.json", lambda c: {**c, "prompts": {"q": ["q"]}},
                                   "not a mapping of name to text"),
    "a custom activation": ("2_Dense/config.json", lambda c: {**c, "activation_function": "mypkg.Evil"},
                            "only torch.nn activations"),
    "a module outside the model": ("modules.json", lambda m: [*m[:2], {**m[2], "path": "../elsewhere"}, *m[3:]],
                                   "outside the model directory"),
    "Dense after Normalize": ("modules.json", lambda m: [m[0], m[1], m[3], m[2]], "Dense after Normalize"),
    "lowercasing": ("sentence_bert_config.json", lambda c: {**c, "do_lower_case": True}, "lowercase"),
    "a residual Dense": ("2_Dense/config.json", lambda c: {**c, "use_residual": True}, "use_residual"),
    "a Dense writing another feature": ("2_Dense/config.json", lambda c: {**c, "module_output_name": "extra"},
                                        "module_output_name 'extra'"),
    "a Normalize of the tokens": ("3_Normalize/config.json", lambda c: {**c, "module_input_name": "token_embeddings"},
                                  "module_input_name 'token_embeddings'"),
    "a Dense larger than its weights": ("2_Dense/config.json", lambda c: {**c, "in_features": 10**9},
                                        "but its weights hold [24, 32]"),
}


def test_what_raycse_cannot_reproduce_is_refused_in_one_line(tiny_model_no_dropout, tmp_path, stsb_dev, capsys):
    base = build_st(tiny_model_no_dropout, tmp_path / "base", "mean", 1, True)
    for case, (name, change, expected) in REFUSED.items():
        model = tmp_path / case.replace(" ", "_")
        shutil.copytree(base, model)
        _edit(model, name, change)
        capsys.readouterr()
        assert main(["eval", str(model), "--stsb-dev", str(stsb_dev)]) == 2, case
        err = own_lines(capsys.readouterr().err)
        assert len(err) == 1 and expected in err[0], (case, err)


def test_a_model_saved_in_the_older_layout_still_loads(tiny_model_no_dropout, tmp_path):
    """What raycse wrote before it saved through sentence-transformers' classes (ST 5's module paths,
    the legacy pooling booleans, max_seq_length in sentence_bert_config.json) still loads and embeds as
    the sentence-transformers model it was made from."""
    base = build_st(tiny_model_no_dropout, tmp_path / "base", "weightedmean", 1, True)
    old = tmp_path / "old"
    shutil.copytree(base, old)
    modules = json.loads((old / "modules.json").read_text())
    for m in modules:
        m["type"] = "sentence_transformers.models." + m["type"].rsplit(".", 1)[-1]
    (old / "modules.json").write_text(json.dumps(modules))
    dim = json.loads((old / "1_Pooling" / "config.json").read_text())["embedding_dimension"]
    legacy = {f"pooling_mode_{k}": k == "weightedmean_tokens" for k in
              ("cls_token", "max_tokens", "mean_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")}
    (old / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": dim, **legacy,
                                                               "include_prompt": True}))
    (old / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32, "do_lower_case": False}))
    enc = Encoder.from_pretrained(str(old))
    assert enc.max_seq_length == 32 and enc.pooler.kind == "weightedmean" and enc.normalize
    np.testing.assert_allclose(enc.encode(SENTENCES), st_encode(base), atol=1e-5)
    saved = enc.save(tmp_path / "again")  # and is saved again in today's layout
    assert module_files(saved) == module_files(base)
    np.testing.assert_allclose(st_encode(saved), st_encode(base), atol=1e-5)
