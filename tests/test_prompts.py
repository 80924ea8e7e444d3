"""Prompts (issue 68, item 3): instruction prefixes as sentence-transformers applies them. A model
that carries prompts embeds through raycse as ``SentenceTransformer.encode`` / ``encode_query`` /
``encode_document`` do, before and after training; ``data.prompts`` puts each column's prompt before
its sentences in training, and the saved model keeps them; what cannot keep a prompt whole is
refused in one line. The references are sentence-transformers' own code and plain string
concatenation, never raycse's prompt helpers."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import make_sentences, own_lines
from raycse.cli import main
from raycse.config import RunConfig, set_dotted
from raycse.errors import ConfigError
from raycse.model.encoder import Encoder
from test_st_roundtrip import SENTENCES, build_st, nudge

# words of the tiny model's vocabulary ("query: " and "passage: " would both be [UNK]s to it)
PROMPTS = {"query": "king. ", "document": "north. "}


def st_model(path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu")


@pytest.mark.parametrize("default", [None, "query"])
def test_a_prompted_model_embeds_as_sentence_transformers_before_and_after_training(tiny_model_no_dropout, tmp_path,
                                                                                    default):
    base = build_st(tiny_model_no_dropout, tmp_path / "base", "mean", 1, True, {"prompts": PROMPTS})
    cfg_path = base / "config_sentence_transformers.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "default_prompt_name": default}))
    enc = Encoder.from_pretrained(str(base))
    st = st_model(base)
    as_st = {"encode": st.encode(SENTENCES), "query": st.encode_query(SENTENCES),
             "document": st.encode_document(SENTENCES)}
    ours = {"encode": enc.encode(SENTENCES), "query": enc.encode(SENTENCES, prompt_name="query"),
            "document": enc.encode(SENTENCES, prompt_name="document")}
    for kind in as_st:
        np.testing.assert_allclose(ours[kind], as_st[kind], atol=1e-5, err_msg=kind)
    # the prompt changes the embedding (else the comparison above proves nothing)
    assert not np.allclose(ours["query"], ours["document"], atol=1e-3)

    nudge(enc)
    saved = enc.save(tmp_path / "trained")
    st = st_model(saved)
    assert st.prompts == PROMPTS and st.default_prompt_name == default
    for name, st_encode in (("query", st.encode_query), ("document", st.encode_document), (None, st.encode)):
        np.testing.assert_allclose(enc.encode(SENTENCES, prompt_name=name), st_encode(SENTENCES), atol=1e-5)


def test_training_puts_each_columns_prompt_before_its_sentences(tiny_model_no_dropout):
    """The objective's batch is the tokenizer's encoding of prompt + sentence: the text column's
    prompt before the anchors, the pair column's before the positives and the hard negatives."""
    from transformers import AutoTokenizer

    from raycse.objectives import registry
    from raycse.train.module import build_module

    run = RunConfig()
    for key, value in {"model.name_or_path": str(tiny_model_no_dropout), "data.pair_column": "b",
                       "data.negative_column": "n", "data.prompts": '{text: "king. ", pair: "north. "}',
                       "train.num_workers": 1}.items():
        set_dotted(run, key, value)
    run.validate()
    module = build_module(run)
    examples = [("a dog runs", "an animal moves", None, ("a cat sleeps",)), ("rain falls", "it is wet", None, ("sun",))]
    batch = module.objective.collate(examples, module.encoder.tokenizer, 32)
    tok = AutoTokenizer.from_pretrained(str(tiny_model_no_dropout))
    want = ["king. a dog runs", "king. rain falls", "north. an animal moves", "north. it is wet",
            "north. a cat sleeps", "north. sun"]
    expected = tok(want, padding=True, truncation=True, max_length=32, return_tensors="pt")
    assert batch["input_ids"].tolist() == expected["input_ids"].tolist()
    # the model keeps them: the text column's as "query" and the default, the pair column's as "document"
    assert module.encoder.prompts == PROMPTS and module.encoder.st_config["default_prompt_name"] == "query"
    # single sentences take the text column's prompt in both dropout views (bsc's (s, s) too)
    bsc = registry.build("bsc", {"mu": 1.0})
    bsc.prompts = {"text": "king. ", "pair": "north. "}
    got = bsc.collate(["a dog runs", "rain falls"], module.encoder.tokenizer, 32)["input_ids"]
    assert got.tolist() == tok(["king. a dog runs", "king. rain falls"] * 2, padding=True,
                               return_tensors="pt")["input_ids"].tolist()


def test_bad_prompt_settings_are_one_line(tiny_model_no_dropout, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(make_sentences(40, seed=1)) + "\n")
    base = build_st(tiny_model_no_dropout, tmp_path / "base", "mean", 0, False,
                    {"prompts": {"query": "query: "}})
    no_prompt_pooling = tmp_path / "exclude"
    shutil.copytree(base, no_prompt_pooling)
    pooling = no_prompt_pooling / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({**json.loads(pooling.read_text()), "include_prompt": False}))
    common = ["--corpus", str(corpus), "--stsb-dev", "none", "--max-steps", "1", "--batch-size", "8"]
    cases = {
        "laser cuts tokens": (["--model", str(base), "--objective", "laser", "--prompts", '{text: "q: "}'],
                              "would cut or repeat the prompt 'q: '"),
        "a pair prompt without pairs": (["--model", str(base), "--prompts", "pair: 'p: '"],
                                        "pair needs data.pair_column"),
        "an unknown column": (["--model", str(base), "--prompts", "{query: 'q: '}"], "data.prompts has 'query'"),
        "an empty prompt": (["--model", str(base), "--prompts", "{text: ''}"], "must be a non-empty text"),
        "not a mapping": (["--model", str(base), "--prompts", "[a, b]"], "must be a YAML mapping"),
        "pooling leaves prompts out": (["--model", str(no_prompt_pooling), "--prompts", "{text: 'q: '}"],
                                       "include_prompt false"),
    }
    for case, (flags, expected) in cases.items():
        out = tmp_path / case.replace(" ", "_")
        capsys.readouterr()
        assert main(["train", *flags, *common, "--output", str(out)]) == 2, case
        err = own_lines(capsys.readouterr().err)
        assert len(err) == 1 and expected in err[0], (case, err)
        assert not out.exists(), case
    # a model whose default prompt a token-cutting objective would cut: refused before anything starts
    cfg_path = base / "config_sentence_transformers.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "default_prompt_name": "query"}))
    assert main(["train", "--model", str(base), "--objective", "compcse", *common,
                 "--output", str(tmp_path / "cc")]) == 2
    err = own_lines(capsys.readouterr().err)
    assert len(err) == 1 and "'query: '" in err[0] and "default_prompt_name to null" in err[0], err


def test_set_keeps_a_prompts_trailing_space():
    from raycse.cli import build_parser, resolve_train_config

    args = build_parser().parse_args(["train", "--set", "data.prompts.text=query: ", "--set", "data.dedup= true"])
    run = resolve_train_config(args)
    assert run.data.prompts == {"text": "query: "} and run.data.dedup is True
    with pytest.raises(ConfigError, match="YAML mapping"):
        set_dotted(RunConfig(), "data.prompts", "{text: [")


def test_trained_model_keeps_the_runs_prompts(ray_cluster, tiny_model_no_dropout, tmp_path):
    """`raycse train --prompts` on pairs: the output carries the prompts, sentence-transformers'
    encode_query / encode_document embed with them, and raycse's embeddings are theirs."""
    data = tmp_path / "pairs.jsonl"
    rows = make_sentences(64, seed=3)
    data.write_text("".join(json.dumps({"q": a, "p": b}) + "\n" for a, b in zip(rows[::2], rows[1::2])))
    from local_session import fit_in_process, run_of

    out = tmp_path / "out"  # (trained through the worker loop in this process, published as the driver does)
    fit_in_process(run_of(["--model", str(tiny_model_no_dropout), "--corpus", str(data), "--text-column", "q",
                           "--pair-column", "p", "--prompts", '{text: "king. ", pair: "north. "}', "--stsb-dev",
                           "none", "--batch-size", "8", "--max-length", "16", "--max-steps", "2", "--output",
                           str(out)]), tmp_path / "ckpt").publish(out)
    st = st_model(out / "model")
    assert st.prompts == PROMPTS and st.default_prompt_name == "query"
    card = (out / "model" / "README.md").read_text()
    assert "## Prompts" in card and "`king. `: the prompt `query`" in card and "`north. `: the prompt `document`" in card
    enc = Encoder.from_pretrained(str(out / "model"))
    np.testing.assert_allclose(enc.encode(SENTENCES), st.encode(SENTENCES), atol=1e-5)
    np.testing.assert_allclose(enc.encode(SENTENCES, prompt_name="document"), st.encode_document(SENTENCES),
                               atol=1e-5)


def test_retrieval_embeds_queries_and_documents_with_their_prompts(tiny_model_no_dropout, tmp_path, capsys):
    """`raycse eval --beir-dir` scores what sentence-transformers' encode_query / encode_document give."""
    from conftest import make_beir_dir
    from raycse.evaluation.beir import read_beir, retrieval_metrics, search

    base = build_st(tiny_model_no_dropout, tmp_path / "base", "mean", 0, False, {"prompts": PROMPTS})
    beir = make_beir_dir(tmp_path / "beir")
    report = tmp_path / "eval.json"
    assert main(["eval", str(base), "--beir-dir", str(beir), "--json", str(report)]) == 0
    data, st = read_beir(beir), st_model(base)
    want = retrieval_metrics(data.qrels, search(st.encode_document(data.docs), st.encode_query(data.queries), data))
    plain = retrieval_metrics(data.qrels, search(st.encode(data.docs), st.encode(data.queries), data))
    got = json.loads(report.read_text())["beir"]
    assert got == pytest.approx(want, abs=1e-6)
    assert want != pytest.approx(plain, abs=1e-6)  # the prompts change the ranking here


def test_the_actor_pool_embeds_documents_with_their_prompt(ray_cluster, tiny_model_no_dropout, tmp_path):
    from conftest import make_beir_dir
    from raycse.evaluation.beir import embed_documents, read_beir

    base = build_st(tiny_model_no_dropout, tmp_path / "base", "mean", 0, False, {"prompts": PROMPTS})
    data = read_beir(make_beir_dir(tmp_path / "beir"))
    pooled = embed_documents(data, None, str(base), 32, ray_threshold=0)  # never calls the local embed
    np.testing.assert_allclose(pooled, st_model(base).encode_document(data.docs), atol=1e-5)


@pytest.mark.parametrize("by, prompts, want", [
    ("first", {"text": "king. ", "pair": "north. "}, "king. "),
    ("second", {"text": "king. ", "pair": "north. "}, "north. "),
    ("second", {"text": "king. "}, "king. "),  # no pair prompt: the default, which the text prompt became
    ("first", {}, ""),
])
def test_grouping_embeds_each_column_with_the_prompt_training_puts_before_it(tiny_model_no_dropout, by, prompts,
                                                                             want):
    """kNN grouping's vectors (the driver's actor pool before the first epoch, and the workers' regroup
    each later epoch) are of the text training sees: the key column's data.prompts entry, else the
    model's default. The reference: a model without prompts, given prompt + sentence."""
    import pyarrow as pa

    from raycse.grouping.embed import Embedder, grouping_prompt_name
    from raycse.grouping.layout import CorpusTable
    from raycse.train.regroup import embed_share

    firsts, seconds = make_sentences(6, seed=21), make_sentences(6, seed=22)
    texts = firsts if by == "first" else seconds
    want_vectors = Encoder.from_pretrained(str(tiny_model_no_dropout)).encode([want + t for t in texts])
    name = grouping_prompt_name(prompts, by)
    pool = Embedder(str(tiny_model_no_dropout), 32, 4, False, "fp32", name, prompts)
    got = pool({"_id": np.arange(6), "text": np.array(texts, dtype=object)})["emb"]
    np.testing.assert_allclose(got, want_vectors, atol=1e-5)
    worker = Encoder.from_pretrained(str(tiny_model_no_dropout))
    worker.add_prompts(prompts)  # as build_module leaves a worker's encoder
    table = CorpusTable([pa.table({"_id": pa.array(np.arange(6)), "text": firsts, "pair": seconds})])
    share = embed_share(worker, table, by, 0, 1, 32, 4, None, name)
    np.testing.assert_allclose(share, want_vectors, atol=1e-5)
