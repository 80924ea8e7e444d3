"""STS readers and scorer on small SentEval-layout fixtures with independently computed Spearman."""

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from raycse.cli import main
from raycse.errors import DataError
from raycse.evaluation.sts import STS_YEARS, TASKS, evaluate_datasets, evaluate_senteval, load_task
from conftest import make_sentences


def letters(texts):
    """A transparent embedder: letter counts (a..z)."""
    out = np.zeros((len(texts), 26), dtype=np.float32)
    for i, t in enumerate(texts):
        for ch in t.lower():
            if "a" <= ch <= "z":
                out[i, ord(ch) - 97] += 1
    return out


def plain_cos(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def plain_spearman(x, y):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return 100 * cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))


def write_senteval(root: Path, seed: int = 0) -> dict:
    """All 7 tasks, a few pairs each; returns the (s1, s2, gold) each task should read back."""
    rng = random.Random(seed)
    expected = {}
    for task, (rel, subsets) in STS_YEARS.items():
        folder = root / rel
        folder.mkdir(parents=True)
        rows = []
        for subset in subsets:
            sents = make_sentences(12, seed=rng.randint(0, 10**6))
            pairs = [(sents[2 * i], sents[2 * i + 1]) for i in range(6)]
            gold = [f"{rng.uniform(0, 5):.2f}" for _ in pairs]
            gold[2] = ""  # unscored pair: skipped
            (folder / f"STS.input.{subset}.txt").write_text("\n".join(f"{a}\t{b}" for a, b in pairs) + "\n")
            (folder / f"STS.gs.{subset}.txt").write_text("\n".join(gold) + "\n")
            rows += [(a, b, float(g)) for (a, b), g in zip(pairs, gold) if g]
        expected[task] = rows
    (root / "STS/STSBenchmark").mkdir(parents=True)
    sents = make_sentences(20, seed=7)
    rows = [(sents[2 * i], sents[2 * i + 1], round(rng.uniform(0, 5), 2)) for i in range(10)]
    (root / "STS/STSBenchmark/sts-test.csv").write_text(
        "\n".join(f"g\tf\t2016\t{i}\t{g}\t{a}\t{b}\textra" for i, (a, b, g) in enumerate(rows)) + "\n")
    expected["STSBenchmark"] = rows
    (root / "SICK").mkdir()
    sents = make_sentences(20, seed=8)
    rows = [(sents[2 * i], sents[2 * i + 1], round(rng.uniform(1, 5), 2)) for i in range(10)]
    (root / "SICK/SICK_test_annotated.txt").write_text(
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
        + "\n".join(f"{i}\t{a}\t{b}\t{g}\tNEUTRAL" for i, (a, b, g) in enumerate(rows)) + "\n")
    expected["SICKRelatedness"] = rows
    return expected


@pytest.fixture
def senteval(tmp_path):
    return tmp_path, write_senteval(tmp_path)


def test_readers_skip_empty_gold_and_read_every_task(senteval):
    root, expected = senteval
    for task in TASKS:
        data = load_task(root, task)
        assert list(zip(data.sent1, data.sent2, data.gold.tolist())) == expected[task]
    assert len(load_task(root, "STS12")) == 5 * 5  # 5 subsets x 6 pairs, 1 unscored each


def test_scores_equal_plain_all_setting_spearman(senteval):
    root, expected = senteval
    scores = evaluate_senteval(letters, root)
    for task in TASKS:
        rows = expected[task]
        pred = [plain_cos(letters([a])[0], letters([b])[0]) for a, b, _ in rows]
        assert scores[task] == pytest.approx(plain_spearman(pred, [g for _, _, g in rows]), abs=1e-6)
    assert scores["avg"] == pytest.approx(np.mean([scores[t] for t in TASKS]))


def test_known_perfect_and_inverted_rankings(tmp_path):
    folder = tmp_path / "STS/STSBenchmark"
    folder.mkdir(parents=True)
    # similarity of "a"*k vs "a"*k + "b"*(5-k) grows with k; gold follows it (or its reverse).
    rows = [("a" * 5, "a" * k + "b" * (5 - k)) for k in range(1, 6)]
    for sign, want in ((1, 100.0), (-1, -100.0)):
        (folder / "sts-test.csv").write_text("\n".join(
            f"g\tf\ty\t{k}\t{k if sign > 0 else 6 - k}\t{a}\t{b}" for k, (a, b) in enumerate(rows, 1)) + "\n")  # (gold in 0-5)
        assert evaluate_senteval(letters, tmp_path, ["STSB"])["STSBenchmark"] == pytest.approx(want)


def test_each_unique_sentence_is_embedded_once(senteval):
    root, _ = senteval
    seen = []

    def counting(texts):
        seen.extend(texts)
        return letters(texts)

    evaluate_senteval(counting, root)
    assert len(seen) == len(set(seen))


def test_fast_path_equals_naive_loop_on_a_real_encoder(senteval, tiny_model):
    from raycse.evaluation.sts import cosine_rows, embed_unique, similarities
    from raycse.model.encoder import Encoder

    root, _ = senteval
    enc = Encoder.from_pretrained(str(tiny_model))
    data = [load_task(root, t) for t in TASKS]
    table = embed_unique(lambda xs: enc.encode(xs, batch_size=16), data)
    for d in data:
        # the naive loop: every pair embedded in file order, batch 128, no sorting or dedup
        naive = np.concatenate([cosine_rows(enc.encode(d.sent1[s:s + 128]), enc.encode(d.sent2[s:s + 128]))
                                for s in range(0, len(d), 128)])
        np.testing.assert_allclose(similarities(d, table), naive, atol=1e-5)
    # and the scores: scipy's Spearman over every pair's cosine, one pair at a time
    from scipy.stats import spearmanr

    scores = {d.name: 100 * spearmanr([plain_cos(letters([a])[0], letters([b])[0]) for a, b in zip(d.sent1, d.sent2)],
                                      d.gold).statistic for d in data}
    assert scores == pytest.approx({k: v for k, v in evaluate_datasets(letters, data).items() if k != "avg"})


def test_missing_senteval_files_are_clear(tmp_path):
    with pytest.raises(DataError, match="SentEval directory not found"):
        load_task(tmp_path / "nope", "STS12")
    with pytest.raises(DataError, match="missing evaluation file .*STS.input.MSRpar.txt"):
        load_task(tmp_path, "STS12")
    with pytest.raises(DataError, match="unknown STS task"):
        load_task(tmp_path, "STS99")


def test_eval_cli_prints_the_seven_tasks_and_mean(senteval, tiny_model, capsys, tmp_path):
    root, _ = senteval
    out = tmp_path / "scores.json"
    assert main(["eval", str(tiny_model), "--senteval-dir", str(root), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    for task in TASKS + ["avg"]:
        assert task in printed
    assert main(["eval", str(tiny_model), "--senteval-dir", str(root), "--tasks", "STS12", "SICK-R"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [l.split()[0] for l in lines] == ["STS12", "SICKRelatedness", "avg"]


def test_length_attack_cli_reports_spearman_and_shift(tiny_model, stsb_dev, capsys, tmp_path):
    from raycse.evaluation.length_attack import length_attack, repeat_within
    from raycse.evaluation.sts import read_stsb
    from raycse.model.encoder import Encoder

    enc = Encoder.from_pretrained(str(tiny_model))
    dev = read_stsb(stsb_dev, "dev")
    rows = length_attack(lambda xs: enc.encode(xs), [dev], [1, 3], enc.tokenizer, 40)
    assert rows[0]["m"] == 1 and rows[0]["mean_shift"] == pytest.approx(0.0, abs=1e-5)
    assert rows[0]["spearman"] == pytest.approx(evaluate_datasets(lambda xs: enc.encode(xs), [dev])["dev"], abs=1e-6)
    # repetition stays within the max length
    mapping = repeat_within(["a b c d e"], 100, {"a b c d e": 5}, 40)
    assert mapping["a b c d e"].count("a") == 7  # (40 - 2) // 5
    out = tmp_path / "la.json"
    assert main(["eval", str(tiny_model), "--stsb-dev", str(stsb_dev), "--length-attack", "1", "2",
                 "--max-length", "64", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "mean cos shift" in printed and len(json.loads(out.read_text())["length_attack"]) == 2
