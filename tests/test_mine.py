"""`raycse mine` on planted topics: the mined negatives come from the query's own topic (the hard
ones), never its positive, and respect the margin (checked with scores computed here, not the
miner's); bad input is one line and writes nothing."""

import json

import numpy as np
import pytest

from conftest import WORDS, own_lines, ray_sessions
from raycse.cli import main

TOPICS = 6


def _topic_sentences(rng, topic, n):
    words = WORDS[12 + topic * 12:12 + (topic + 1) * 12]  # each topic its own words (after the stop words)
    return [" ".join(rng.choice(words, size=7)) for _ in range(n)]


def _pairs(tmp_path):
    rng = np.random.default_rng(0)
    rows, topic_of = [], {}
    for t in range(TOPICS):
        qs, ps = _topic_sentences(rng, t, 10), _topic_sentences(rng, t, 10)
        for q, p in zip(qs, ps):
            rows.append({"q": q, "a": p})
            topic_of[q] = topic_of[p] = t
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path, rows, topic_of


@pytest.fixture(scope="module")
def planted_model(tiny_model, tmp_path_factory):
    """The tiny BERT made to embed by topic: each topic's words point along their own axis, the layers
    pass the embeddings through (attention and FFN outputs zeroed), mean pooling. A real HF model."""
    import torch

    from raycse.model.encoder import Encoder

    enc = Encoder.from_pretrained(str(tiny_model), pooling="mean", mlp_head="none")
    bert = enc.backbone
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in bert.encoder.layer:
            for lin in (layer.attention.output.dense, layer.output.dense):
                lin.weight.zero_()
                lin.bias.zero_()
        emb = bert.embeddings
        emb.position_embeddings.weight.zero_()
        emb.token_type_embeddings.weight.zero_()
        w = emb.word_embeddings.weight
        w.copy_(0.3 * torch.randn(w.shape, generator=g))
        for t in range(TOPICS):
            for word in WORDS[12 + t * 12:12 + (t + 1) * 12]:
                w[enc.tokenizer.convert_tokens_to_ids(word), t] += 4.0  # topic t's axis
    path = tmp_path_factory.mktemp("planted") / "model"
    enc.save(path)
    return path


def test_mined_negatives_are_hard_and_safe(ray_cluster, planted_model, tmp_path, capsys):
    from raycse.model.encoder import Encoder

    tiny_model = planted_model

    path, rows, topic_of = _pairs(tmp_path)
    out = tmp_path / "triplets.jsonl"
    # --embed-actors 4: every CPU of the test cluster; the pool must still leave its input split room to run
    argv = ["mine", "--corpus", str(path), "--text-column", "q", "--pair-column", "a", "--output", str(out),
            "--model", str(tiny_model), "--num-negatives", "2", "--range-max", "10", "--max-length", "16",
            "--embed-actors", "4"]
    assert main(argv) == 0
    assert "--negative-column negative_1,negative_2" in capsys.readouterr().out
    triplets = [json.loads(line) for line in out.read_text().splitlines()]
    assert triplets and set(triplets[0]) == {"q", "a", "negative_1", "negative_2"}
    positive = {r["q"]: r["a"] for r in rows}
    same_topic = 0
    for t in triplets:
        assert t["a"] == positive[t["q"]]
        for neg in (t["negative_1"], t["negative_2"]):
            assert neg != t["a"] and neg != t["q"]
            same_topic += topic_of[neg] == topic_of[t["q"]]
    # hard negatives share the query's topic (a random candidate would in 9 of 59 = 15%)
    assert same_topic / (2 * len(triplets)) > 0.95

    # the margin, checked with scores computed here
    enc = Encoder.from_pretrained(str(tiny_model))
    margin_out = tmp_path / "margin.jsonl"
    assert main(argv[:8] + [str(margin_out)] + argv[9:] + ["--margin", "0.05"]) == 0
    kept = [json.loads(line) for line in margin_out.read_text().splitlines()]
    assert kept
    for t in kept:
        q, a, n1, n2 = (enc.encode([t[k]], max_length=16)[0] for k in ("q", "a", "negative_1", "negative_2"))
        cos = lambda u, v: float(u @ v / np.linalg.norm(u) / np.linalg.norm(v))  # noqa: E731
        assert cos(q, n1) < cos(q, a) - 0.05 + 1e-4 and cos(q, n2) < cos(q, a) - 0.05 + 1e-4


def test_mine_bad_input_is_one_line_and_writes_nothing(tiny_model, tmp_path, capsys):
    """Refused before a Ray starts: an output of another format than the input's started a private Ray
    (a session directory written in the temporary directory) and then refused it."""
    import os

    sessions = ray_sessions()
    path, _, _ = _pairs(tmp_path)
    base = ["mine", "--corpus", str(path), "--text-column", "q", "--pair-column", "a", "--model", str(tiny_model)]
    cases = [(["--output", str(tmp_path / "t.parquet")], "must be a jsonl file like the input"),
             (["--output", str(tmp_path / "t.jsonl"), "--range-min", "5", "--range-max", "5"], "--range-min"),
             (["--output", str(tmp_path / "t.jsonl"), "--num-negatives", "0"], "--num-negatives must be >= 1"),
             (["--output", str(tmp_path / "no" / "t.jsonl")], "does not exist"),
             (["--output", str(tmp_path / "t.jsonl"), "--margin", "-1"], "--margin must be >= 0")]
    for extra, message in cases:
        assert main(base + extra) == 2
        err = own_lines(capsys.readouterr().err)
        assert len(err) == 1 and message in err[0], (extra, err)
    assert main(["mine", "--corpus", str(path), "--output", str(tmp_path / "t.jsonl")]) == 2
    assert "needs --pair-column" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl"]
    assert not [name for name, pid in ray_sessions() - sessions if pid == os.getpid()]


def test_an_interrupted_mine_is_one_line_naming_its_unwritten_output_and_the_rerun(ray_cluster, tiny_model, tmp_path,
                                                                                  capsys, monkeypatch):
    """A real SIGINT to this process as mine starts to embed: raycse's handler (installed by main) raises
    in the main thread, and the command ends in one line saying nothing was written to the output and
    how to mine again, with exit 130 and no output file. The Ray this process had joined before the
    command (the tests' shared one) stays joined: only a command's own Ray is shut down."""
    import os
    import signal

    import ray

    from raycse.grouping import embed

    original = embed.embed_corpus

    def embed_after_a_sigint(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setattr(embed, "embed_corpus", embed_after_a_sigint)
    path, _, _ = _pairs(tmp_path)
    out = tmp_path / "triplets.jsonl"
    argv = ["mine", "--corpus", str(path), "--text-column", "q", "--pair-column", "a", "--output", str(out),
            "--model", str(tiny_model), "--max-length", "16", "--embed-actors", "1"]
    assert main(argv) == 130
    err = own_lines(capsys.readouterr().err)
    assert err == [f"raycse: interrupted (SIGINT); nothing was written to {out}; rerun the same command to mine "
                   f"again"], err
    assert not out.exists()
    assert ray.is_initialized(), "the command shut down the Ray this process had joined before it"


def test_a_triplets_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """Through raycse.platform.outputs.written_file: a failed write leaves no hidden file beside the output and the
    earlier output untouched; a write that completes replaces it in one rename."""
    import pandas as pd

    from raycse.grouping.mine import write_table

    out = tmp_path / "triplets.jsonl"
    write_table({"q": ["a"], "a": ["b"]}, out, "jsonl")
    assert out.read_text().strip() == '{"q":"a","a":"b"}' and sorted(p.name for p in tmp_path.iterdir()) == [out.name]

    def half_then_fail(self, path, **kwargs):
        open(path, "w").write('{"q":')
        raise ValueError("a value pandas cannot write")

    monkeypatch.setattr(pd.DataFrame, "to_json", half_then_fail)
    with pytest.raises(ValueError):
        write_table({"q": ["c"], "a": ["d"]}, out, "jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no hidden file left
    assert out.read_text().strip() == '{"q":"a","a":"b"}'  # the earlier output untouched
