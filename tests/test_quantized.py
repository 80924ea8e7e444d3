"""Issue 88, item 3: STS and BEIR scored on quantized embeddings (int8, uint8, binary, ubinary). The second
implementation below follows sentence-transformers' documented quantization word by word, in loops: each
coordinate's range over the calibration vectors cut into 255 steps, one bit per coordinate packed from the
left; the similarities are loops too (cosine of the integer vectors, the share of equal bits)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import make_beir_dir, write_stsb
from raycse.cli import main
from raycse.errors import ConfigError
from raycse.evaluation.quantized import pair_similarity, quantize, ranges_of, search_at, sts_similarities


def _unit(row):
    norm = math.sqrt(sum(v * v for v in row)) or 1.0
    return [v / norm for v in row]


def loop_quantize(rows, precision, calibration=None):
    """sentence-transformers' quantize_embeddings as its docstring and code describe it, on normalised rows."""
    rows = [_unit(r) for r in rows]
    if precision in ("binary", "ubinary"):
        out = []
        for r in rows:
            bits = [1 if v > 0 else 0 for v in r] + [0] * (-len(r) % 8)
            packed = [sum(bits[i + k] << (7 - k) for k in range(8)) for i in range(0, len(bits), 8)]
            out.append([b - 128 for b in packed] if precision == "binary" else packed)
        return out
    cal = [_unit(r) for r in (calibration if calibration is not None else rows)]
    out = []
    for r in rows:
        q = []
        for j, v in enumerate(r):
            lo = np.float32(min(c[j] for c in cal))
            hi = np.float32(max(c[j] for c in cal))
            step = (hi - lo) / np.float32(255) or np.float32(1)
            level = min(max(math.floor((np.float32(v) - lo) / step), 0), 255)
            q.append(level - 128 if precision == "int8" else level)
        out.append(q)
    return out


def loop_similarity(a, b, precision, dim):
    if precision in ("binary", "ubinary"):
        def bits(row):
            raw = [(x + 128) if precision == "binary" else x for x in row]
            return [(byte >> (7 - k)) & 1 for byte in raw for k in range(8)][:dim]
        return sum(x == y for x, y in zip(bits(a), bits(b))) / dim
    dot = sum(float(x) * float(y) for x, y in zip(a, b))
    return dot / (math.sqrt(sum(float(x) ** 2 for x in a)) * math.sqrt(sum(float(y) ** 2 for y in b)))


@pytest.fixture
def vectors():
    rng = np.random.default_rng(3)
    return rng.normal(size=(9, 13)).astype(np.float32)  # 13 coordinates: the last byte of bits is padded


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_quantization_follows_sentence_transformers_words(vectors, precision):
    ours = quantize(vectors, precision, ranges_of(vectors) if precision.endswith("int8") else None)
    assert ours.tolist() == loop_quantize(vectors.tolist(), precision)
    assert ours.dtype == (np.int8 if precision in ("int8", "binary") else np.uint8)


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_sts_similarities_calibrate_both_sides_together(vectors, precision):
    a, b = vectors[:5], vectors[4:]
    got = sts_similarities(a, b, precision)
    both = np.concatenate([a, b]).tolist()
    qa = loop_quantize(a.tolist(), precision, both)
    qb = loop_quantize(b.tolist(), precision, both)
    want = [loop_similarity(x, y, precision, a.shape[1]) for x, y in zip(qa, qb)]
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_pair_similarity_on_bits_is_the_share_of_equal_bits():
    a = quantize(np.array([[1, -1, 1, 1, -1]], dtype=np.float32), "ubinary")
    b = quantize(np.array([[1, 1, 1, -1, -1]], dtype=np.float32), "ubinary")
    assert pair_similarity(a, b, "ubinary", 5).tolist() == [3 / 5]


@pytest.mark.parametrize("precision", ["int8", "binary"])
def test_beir_search_at_a_precision_ranks_as_a_loop_does(tmp_path, vectors, precision):
    from raycse.evaluation.beir import read_beir

    data = read_beir(make_beir_dir(tmp_path / "beir"))
    rng = np.random.default_rng(5)
    docs = rng.normal(size=(len(data.doc_ids), 13)).astype(np.float32)
    queries = rng.normal(size=(len(data.query_ids), 13)).astype(np.float32)
    run = search_at(docs, queries, data, precision, k=100)
    qd = loop_quantize(docs.tolist(), precision, docs.tolist())
    qq = loop_quantize(queries.tolist(), precision, docs.tolist())  # queries take the documents' ranges
    for qid, q in zip(data.query_ids, qq):
        want = {d: loop_similarity(q, v, precision, 13) for d, v in zip(data.doc_ids, qd) if d != qid}
        if precision == "binary":  # (faiss scores bits that agree; the loop their share)
            want = {d: s * 13 for d, s in want.items()}
        assert run[qid] == pytest.approx(want, abs=1e-5)


def test_raycse_eval_scores_each_precision_in_a_column_and_in_its_json(tiny_model, tmp_path, capsys):
    dev = write_stsb(tmp_path / "dev.csv")
    beir = make_beir_dir(tmp_path / "beir")
    plain, out = tmp_path / "plain.json", tmp_path / "q.json"
    assert main(["eval", str(tiny_model), "--stsb-dev", str(dev), "--beir-dir", str(beir), "--json", str(plain)]) == 0
    capsys.readouterr()
    assert main(["eval", str(tiny_model), "--stsb-dev", str(dev), "--beir-dir", str(beir), "--json", str(out),
                 "--embedding-precision", "binary,int8"]) == 0
    printed = capsys.readouterr()
    assert "int8/uint8 ranges: calibrated on each STS task's own sentences" in printed.err
    assert [line.split() for line in printed.out.splitlines() if line.startswith("precision")] == \
        [["precision", "float32", "int8", "binary"]] * 2  # STS, then BEIR
    got, base = json.loads(out.read_text()), json.loads(plain.read_text())
    assert got["scores"] == base["scores"]  # float32 stays the main score
    sts = got["embedding_precision"]["sts"]
    assert set(sts) == {"float32", "int8", "binary"} and sts["float32"] == base["scores"]
    assert set(got["beir"]["embedding_precision"]) == {"float32", "int8", "binary"}


def test_a_selection_score_may_quantize_and_names_its_precision(tmp_path):
    from raycse.config import EvalConfig
    from raycse.evaluation.selection import load_selection
    from raycse.evaluation.sts import evaluate_datasets, read_stsb

    dev = write_stsb(tmp_path / "dev.csv")
    cfg = EvalConfig(stsb_dev=str(dev), metric="sts@binary")
    cfg.validate()
    assert (cfg.score_key(), cfg.score_label()) == ("stsb_dev_spearman_binary", "STS-B dev Spearman (binary)")
    selection = load_selection(cfg)
    rng = np.random.default_rng(0)
    table = {}

    def embed(xs, prompt_name=None):
        return np.stack([table.setdefault(x, rng.normal(size=12).astype(np.float32)) for x in xs])

    data = read_stsb(dev, name="stsb_dev")
    assert selection.score(embed) == evaluate_datasets(embed, [data], "binary")["stsb_dev"]
    assert selection.score(embed) != evaluate_datasets(embed, [data])["stsb_dev"]
    beir = EvalConfig(metric="beir:/x:ndcg@10@int8")
    assert beir.selection() == ("beir", "/x", "nDCG@10") and beir.embedding_precision() == "int8"
    assert beir.score_key() == "beir_ndcg@10_int8"
    with pytest.raises(ConfigError, match="MTEB scores its own embeddings"):
        EvalConfig(metric="mteb:STS12@binary").validate()


def test_train_selects_on_binary_embeddings(ray_cluster, tiny_model, corpus, stsb_dev, tmp_path, caplog):
    """--eval-metric sts@binary through the worker loop in this process (local_session): every score, the
    selection and the card are of binary embeddings."""
    from local_session import fit_in_process, run_of

    out = tmp_path / "run"
    run = run_of(["--model", str(tiny_model), "--corpus", str(corpus), "--output", str(out), "--stsb-dev",
                  str(stsb_dev), "--batch-size", "16", "--max-length", "16", "--eval-steps", "2", "--max-steps", "4",
                  "--eval-metric", "sts@binary"])
    fit_in_process(run, tmp_path / "ckpt").publish(out)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["score_key"] == "stsb_dev_spearman_binary" and "stsb_dev_spearman" not in metrics["best"]
    assert run.eval.score_label() == "STS-B dev Spearman (binary)"  # (the command's last line names it so)
    assert "step 4: STS-B dev Spearman (binary)" in caplog.text
    assert "STS-B dev Spearman x100 (binary embeddings)" in (out / "model" / "README.md").read_text()
