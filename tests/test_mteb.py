"""MTEB through the mteb package (issue 68, item 1): `raycse eval --mteb / --mteb-local`, and eval.metric
mteb:... for model selection (its Tune use: tests/test_tune.py, the BEIR-layout selection test).

mteb's scores are checked against raycse's own evaluators on the same files and the same embeddings of
the real model (all-MiniLM-L6-v2: a random tiny BERT's cosines all lie within 2e-5 of 1, so float32
rounding in mteb's cosine against raycse's reorders them and Spearman moves by up to 6 points):
Spearman x100 within 1e-6, and nDCG@10, MRR@10, Recall@100 within 1e-5 (mteb rounds retrieval metrics to
5 decimals). Measured on this data: STS 0.0 apart on all 7 tasks; nDCG@10 2.7e-6 apart, MRR@10 and
Recall@100 0.0."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from conftest import make_sentences, seed_hf_datasets_cache, write_stsb
from test_sts import write_senteval

from raycse.cli import main
from raycse.errors import ConfigError

MODEL = "default"  # the embedded all-MiniLM-L6-v2


def write_beir(root: Path, seed: int = 0) -> Path:
    """40 documents, 12 queries with 1-3 graded relevant documents each (not all findable by a random
    model: the metrics land strictly between 0 and 1), and one query sharing a document's id."""
    rng = random.Random(seed)
    (root / "qrels").mkdir(parents=True)
    texts = make_sentences(52, seed=seed + 1)
    docs = [{"_id": f"d{i}", "title": texts[i].split()[0], "text": texts[i]} for i in range(40)]
    docs.append({"_id": "q0", "title": "", "text": texts[40]})  # the query's own id: left out, as BEIR does
    (root / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    (root / "queries.jsonl").write_text("\n".join(json.dumps({"_id": f"q{i}", "text": texts[40 + i]})
                                                  for i in range(12)) + "\n")
    rows = ["query-id\tcorpus-id\tscore"]
    for q in range(12):
        for d in rng.sample(range(40), rng.randint(1, 3)):
            rows.append(f"q{q}\td{d}\t{rng.randint(1, 2)}")
    (root / "qrels" / "test.tsv").write_text("\n".join(rows) + "\n")
    return root


def test_mteb_scores_on_local_data_equal_raycse_own(tmp_path, capsys):
    from raycse.evaluation.sts import TASKS

    senteval, beir = tmp_path / "senteval", write_beir(tmp_path / "beir")
    write_senteval(senteval)
    dev = write_stsb(tmp_path / "dev.csv")
    out = tmp_path / "scores.json"
    assert main(["eval", MODEL, "--senteval-dir", str(senteval), "--beir-dir", str(beir), "--stsb-dev", str(dev),
                 "--mteb-local", f"senteval:{senteval}", "--mteb-local", f"beir:{beir}", "--mteb-local", f"stsb:{dev}",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    mteb = result["mteb"]
    assert sorted(mteb) == sorted([f"mteb_local_{t}" for t in TASKS] + ["mteb_local_beir", "mteb_local_stsb"])
    assert mteb["mteb_local_stsb"]["score"] == pytest.approx(result["scores"]["STSB-dev"], abs=1e-6)
    for task in TASKS:
        row = mteb[f"mteb_local_{task}"]
        assert row["main_score"] == "cosine_spearman" and row["task"] == f"{task}-local"
        assert row["score"] == pytest.approx(result["scores"][task], abs=1e-6)
    retrieval = mteb["mteb_local_beir"]
    assert retrieval["main_score"] == "ndcg_at_10" and list(retrieval["scores"]) == ["test"]
    metrics = retrieval["scores"]["test"]["default"]
    for ours, theirs in (("nDCG@10", "ndcg_at_10"), ("MRR@10", "mrr_at_10"), ("Recall@100", "recall_at_100")):
        assert metrics[theirs] == pytest.approx(result["beir"][ours], abs=1e-5)
    assert 0.0 < result["beir"]["nDCG@10"] < 1.0  # a comparison that could have differed
    assert retrieval["score"] == pytest.approx(100 * metrics["ndcg_at_10"])
    printed = capsys.readouterr().out
    assert "STS12-local (mteb cosine_spearman)" in printed and "BEIR-local (mteb ndcg_at_10)" in printed
    assert printed.index("avg") < printed.index("STS12-local")  # one table: raycse's rows, then mteb's


def test_a_registered_task_runs_from_the_cache_with_the_hub_off(tmp_path, monkeypatch, hub_off):
    """--mteb STSBenchmark with the hub switched off: mteb's registered task reads the cached data, and
    scores what raycse scores on the same pairs. No MTEB result cache is written."""
    import mteb

    from raycse.evaluation.sts import read_stsb

    dev = write_stsb(tmp_path / "pairs.csv")
    pairs = read_stsb(dev)
    task = mteb.get_task("STSBenchmark")
    seed_hf_datasets_cache(hub_off, task.metadata.dataset["path"], "test",
                           {"sentence1": pairs.sent1, "sentence2": pairs.sent2, "score": [float(g) for g in pairs.gold]},
                           revision=task.metadata.dataset["revision"])
    monkeypatch.setenv("MTEB_CACHE", str(tmp_path / "mteb-results"))
    out = tmp_path / "scores.json"
    assert main(["eval", MODEL, "--stsb-dev", str(dev), "--mteb", "STSBenchmark", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    row = result["mteb"]["mteb_STSBenchmark"]
    assert row["task"] == "STSBenchmark" and row["main_score"] == "cosine_spearman"
    assert row["score"] == pytest.approx(result["scores"]["STSB-dev"], abs=1e-6)
    assert not (tmp_path / "mteb-results").exists()


def test_eval_metric_mteb_forms_and_their_keys(tmp_path):
    from raycse.config import EvalConfig

    beir = write_beir(tmp_path / "beir")
    cases = {"mteb:STS12": "mteb_STS12", f"mteb:beir:{beir}": "mteb_local_beir",
             f"mteb:senteval:{tmp_path}:sts-b": "mteb_local_STSBenchmark", "mteb:stsb:dev.csv": "mteb_local_stsb"}
    for metric, key in cases.items():
        cfg = EvalConfig(metric=metric)
        cfg.validate()
        assert cfg.selection()[0] == "mteb" and cfg.score_key() == key
    for bad in ("mteb:", "mteb:a:b", "mteb:senteval:x", "mteb:senteval::STS12"):
        with pytest.raises(ConfigError, match="eval.metric"):
            EvalConfig(metric=bad).validate()


def test_a_selection_by_mteb_scores_as_raycse_eval_does(tiny_model, tmp_path):
    """The model-selection score (what a run's best checkpoint and Tune's rungs use) is mteb's main score x100,
    the number `raycse eval --mteb-local` prints for the same model; its data survives pickling (it
    travels to rank 0)."""
    import pickle

    from raycse.config import EvalConfig
    from raycse.evaluation.selection import load_selection
    from raycse.model.encoder import Encoder

    beir = write_beir(tmp_path / "beir")
    cfg = EvalConfig(metric=f"mteb:beir:{beir}")
    selection = pickle.loads(pickle.dumps(load_selection(cfg)))
    assert selection.key == "mteb_local_beir"
    encoder = Encoder.from_pretrained(str(tiny_model))
    score = selection.score(lambda xs, prompt_name=None: encoder.encode(xs, prompt_name=prompt_name))
    out = tmp_path / "scores.json"
    assert main(["eval", str(tiny_model), "--mteb-local", f"beir:{beir}", "--json", str(out)]) == 0
    assert score == pytest.approx(json.loads(out.read_text())["mteb"]["mteb_local_beir"]["score"], abs=1e-9)
    # the key of the remembered "before training" score follows the data's content
    from raycse.evaluation.initial_scores import data_digest

    same = load_selection(EvalConfig(metric=f"mteb:beir:{beir}"))
    assert data_digest(same) == data_digest(selection)
    qrels = beir / "qrels" / "test.tsv"
    qrels.write_text(qrels.read_text().replace("\t2\n", "\t1\n", 1))
    assert data_digest(load_selection(EvalConfig(metric=f"mteb:beir:{beir}"))) != data_digest(selection)


def test_the_model_card_names_an_mteb_selection():
    from raycse.model.card import _scores

    lines = _scores({"score_key": "mteb_local_stsb", "best": {"step": 4, "mteb_local_stsb": 81.5},
                     "last": {"step": 8, "mteb_local_stsb": 80.0}})
    assert "| MTEB local_stsb x100 (model selection) | value |" in lines
    assert "| this model (step 4) | 81.50 |" in lines


def test_the_task_data_digest_hashes_rows_as_arrow_whatever_their_layout(tmp_path):
    """Issue 68: the digest that keys a remembered MTEB score (raycse.evaluation.initial_scores) is the same for the
    same rows however the dataset holds them (in memory, mapped from disk, a selection of a larger table, in
    several chunks), differs for one changed cell, and hashes Arrow batches: no Python copy of the whole data."""
    import hashlib
    import tracemalloc

    import datasets

    from raycse.evaluation.mteb_eval import _digest_data

    def digest(data) -> str:
        h = hashlib.sha256()
        _digest_data(data, h)
        return h.hexdigest()

    rows = {"text": [f"sentence number {i} of the corpus, padded to some length" for i in range(200_000)],
            "score": [float(i % 5) for i in range(200_000)]}
    plain = datasets.Dataset.from_dict(rows)
    plain.save_to_disk(str(tmp_path / "saved"))
    wider = datasets.concatenate_datasets([datasets.Dataset.from_dict({"text": ["x"], "score": [9.0]}),
                                           plain.select(range(100_000)), plain.select(range(100_000, 200_000))])
    layouts = {"mapped": datasets.load_from_disk(str(tmp_path / "saved")), "selected": wider.select(range(1, 200_001)),
               "chunked": datasets.concatenate_datasets([plain.select(range(7)), plain.select(range(7, 200_000))])}
    want = digest({"test": plain})
    assert {name: digest({"test": d}) for name, d in layouts.items()} == {name: want for name in layouts}
    changed = plain.map(lambda row, i: {"score": 4.5 if i == 123_456 else row["score"]}, with_indices=True)
    assert digest({"test": changed}) != want
    assert digest({"dev": plain}) != want  # the split's name counts too

    tracemalloc.start()
    digest({"test": layouts["mapped"]})
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * 2**20, peak  # the rows as Python objects and JSON text would take ~40 MB
