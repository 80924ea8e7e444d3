"""BEIR retrieval evaluation: metrics worked out by hand, agreement with pytrec_eval (trec_eval's own
code) on the same run, and `raycse eval --beir-dir` end to end on a layout made here."""

import json
import math

import numpy as np
import pytest

from raycse.cli import main
from raycse.errors import DataError
from raycse.evaluation.beir import read_beir, retrieval_metrics

from conftest import own_lines


def test_metrics_worked_out_by_hand():
    # q1: ranking d3 (score .9), d1 (.8), d2 (.7), d4 (.1); relevant d1 (grade 2), d2 (grade 1)
    # nDCG@10 = (0/log2 2 + 2/log2 3 + 1/log2 4) / (2/log2 2 + 1/log2 3)
    #         = (1.26186 + 0.5) / (2 + 0.63093) = 0.66967
    # MRR@10 = 1/2 (d1 at rank 2); Recall@100 = 2/2
    # q2: ranking d2, d1; relevant d4 (grade 1) never retrieved -> nDCG 0, MRR 0, Recall 0
    qrels = {"q1": {"d1": 2, "d2": 1}, "q2": {"d4": 1}}
    run = {"q1": {"d1": 0.8, "d2": 0.7, "d3": 0.9, "d4": 0.1}, "q2": {"d2": 0.5, "d1": 0.4}}
    got = retrieval_metrics(qrels, run)
    ndcg_q1 = (2 / math.log2(3) + 1 / math.log2(4)) / (2 + 1 / math.log2(3))
    assert ndcg_q1 == pytest.approx(0.669672, abs=1e-6)
    assert got["nDCG@10"] == pytest.approx(ndcg_q1 / 2, abs=1e-9)
    assert got["MRR@10"] == pytest.approx(0.25)
    assert got["Recall@100"] == pytest.approx(0.5)
    # a relevant document at rank 11 counts for Recall@100 but not for MRR@10 or nDCG@10
    run3 = {"q": {f"n{i:02d}": 1.0 - i / 100 for i in range(10)} | {"r": 0.5}}
    assert retrieval_metrics({"q": {"r": 1}}, run3) == {"nDCG@10": 0.0, "MRR@10": 0.0, "Recall@100": 1.0}


def test_agrees_with_pytrec_eval_on_the_same_run():
    pytrec_eval = pytest.importorskip("pytrec_eval")
    rng = np.random.default_rng(0)
    docs = [f"d{i}" for i in range(300)]
    qrels, run = {}, {}
    for q in range(40):
        rel = rng.choice(docs, size=int(rng.integers(1, 12)), replace=False)
        qrels[f"q{q}"] = {d: int(rng.integers(1, 3)) for d in rel}
        cand = rng.choice(docs, size=150, replace=False)
        scores = np.round(rng.random(150), 2)  # rounded: ties, broken as trec_eval breaks them
        run[f"q{q}"] = {d: float(s) for d, s in zip(cand, scores)}
    ours = retrieval_metrics(qrels, run)
    top100 = {q: dict(sorted(r.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)[:100]) for q, r in run.items()}
    top10 = {q: dict(sorted(r.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)[:10]) for q, r in run.items()}
    per = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(top100)
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    assert ours["nDCG@10"] == pytest.approx(np.mean([v["ndcg_cut_10"] for v in per.values()]), abs=1e-6)
    assert ours["Recall@100"] == pytest.approx(np.mean([v["recall_100"] for v in per.values()]), abs=1e-6)
    assert ours["MRR@10"] == pytest.approx(np.mean([v["recip_rank"] for v in rr.values()]), abs=1e-6)
    assert 0.0 < ours["nDCG@10"] < 1.0


def _beir_dir(tmp_path):
    from conftest import make_beir_dir

    return make_beir_dir(tmp_path / "beir")


def test_eval_beir_end_to_end(tiny_model, tmp_path, capsys):
    root = _beir_dir(tmp_path)
    data = read_beir(root)
    assert data.query_ids == ["q0", "q1", "q2", "q3", "q4"] and data.qrels["q1"] == {"d1": 2}
    assert data.docs[0] == "city the city river was there" and data.docs[-1] == "the road village"
    out = tmp_path / "scores.json"
    assert main(["eval", str(tiny_model), "--beir-dir", str(root), "--json", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["nDCG@10", "MRR@10", "Recall@100"]
    printed = {line.split()[0]: line.split()[1] for line in lines}
    assert all(len(v.split(".")[1]) == 4 and 0.0 <= float(v) <= 1.0 for v in printed.values())
    saved = json.loads(out.read_text())["beir"]
    assert {k: f"{v:.4f}" for k, v in saved.items()} == printed
    assert saved["Recall@100"] == 1.0  # 7 documents: every relevant one is in the top 100

    from raycse.evaluation.beir import search
    from raycse.model.encoder import Encoder

    enc = Encoder.from_pretrained(str(tiny_model))
    run = search(enc.encode(data.docs), enc.encode(data.queries), data)
    assert "q3" not in run["q3"] and len(run["q3"]) == 6  # its own id dropped, the rest kept


def test_beir_bad_layouts_fail_in_one_line(tmp_path, tiny_model, capsys):
    root = _beir_dir(tmp_path)
    with pytest.raises(DataError, match="missing BEIR qrels"):
        read_beir(root, split="dev")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq9\td1\t1\n")
    with pytest.raises(DataError, match="names query 'q9' that queries.jsonl lacks"):
        read_beir(root)
    assert main(["eval", str(tiny_model), "--beir-dir", str(tmp_path / "nope")]) == 2
    err = own_lines(capsys.readouterr().err)
    assert len(err) == 1 and "BEIR directory not found" in err[0] and "beir" in err[0].lower()


def test_large_corpora_embed_on_the_ray_actor_pool_alike(ray_cluster, tiny_model, tmp_path):
    from raycse.evaluation.beir import embed_documents
    from raycse.model.encoder import Encoder

    data = read_beir(_beir_dir(tmp_path))
    enc = Encoder.from_pretrained(str(tiny_model))
    local = embed_documents(data, enc.encode, str(tiny_model), 32)
    pooled = embed_documents(data, None, str(tiny_model), 32, ray_threshold=0)  # never calls the local embed
    np.testing.assert_allclose(pooled, local, atol=1e-5)
