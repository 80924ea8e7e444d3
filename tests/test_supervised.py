"""Supervised SimCSE with hard negatives (Gao et al. 2021, Sec. 5 + appendix) against a loop written
from the formula; 2 workers x b == 1 worker x 2b with hard negatives; triplet data through the Ray
Data pipeline and `raycse train --negative-column`."""

import json
import math
import os

import numpy as np
import pytest
import torch

from raycse.objectives import registry
from raycse.objectives.contrastive import info_nce_hard

from conftest import own_lines


def _cos(u, v):
    return sum(a * b for a, b in zip(u, v)) / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))


def plain_supervised(h, pos, neg, tau, alpha):
    """-log e^{s(h_i,h_i+)/tau} / sum_j (e^{s(h_i,h_j+)/tau} + alpha^{1[i=j]} sum_m e^{s(h_i,h_jm-)/tau}), mean."""
    n = len(h)
    total = 0.0
    for i in range(n):
        num = math.exp(_cos(h[i], pos[i]) / tau)
        den = 0.0
        for j in range(n):
            den += math.exp(_cos(h[i], pos[j]) / tau)
            for m in range(len(neg[j])):
                den += (alpha if i == j else 1.0) * math.exp(_cos(h[i], neg[j][m]) / tau)
        total += -math.log(num / den)
    return total / n


@pytest.mark.parametrize("k, alpha", [(1, 1.0), (2, 0.5), (2, 0.0), (0, 1.0)])
def test_supervised_loss_matches_the_formula(k, alpha):
    torch.manual_seed(k)
    h, pos, neg = torch.randn(5, 8), torch.randn(5, 8), torch.randn(5, k, 8)
    obj = registry.build("simcse", {"tau": 0.1, "hard_negative_weight": alpha})
    got = obj.supervised_loss(h, pos, neg if k else None).item()
    want = plain_supervised(h.tolist(), pos.tolist(), neg.tolist(), 0.1, alpha)
    assert got == pytest.approx(want, rel=1e-5)


def test_collate_and_forward_use_the_row_negatives(tiny_model_no_dropout):
    from raycse.model.encoder import Encoder

    enc = Encoder.from_pretrained(str(tiny_model_no_dropout), pooling="cls", mlp_head="none").train()
    obj = registry.build("simcse", {"tau": 0.1, "hard_negative_weight": 0.5})
    rows = [("the city river", "a river city", None, ("north road", "summer music")),
            ("a king was born", "the king", None, ("festival in the city", "a small village")),
            ("summer music festival", "music in summer", None, ("the war", "a bridge"))]
    batch = obj.collate(rows, enc.tokenizer, 32)
    assert batch["input_ids"].shape[0] == 3 + 3 + 6
    got = obj(enc, batch).loss.item()
    with torch.no_grad():
        g = lambda xs: enc.backbone(**enc.tokenize(xs)).last_hidden_state[:, 0]  # noqa: E731
        h, pos = g([r[0] for r in rows]), g([r[1] for r in rows])
        neg = [g(list(r[3])).tolist() for r in rows]
    assert got == pytest.approx(plain_supervised(h.tolist(), pos.tolist(), neg, 0.1, 0.5), rel=1e-4)


def _worker(rank, h, pos, neg, out_dir, port):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    b = h.shape[0] // 2
    parts = [t[rank * b:(rank + 1) * b].clone().requires_grad_(True) for t in (h, pos, neg)]
    loss = info_nce_hard(*parts, 0.1, own_weight=0.5)
    loss.backward()
    torch.save({"loss": loss.detach(), "grads": [p.grad for p in parts]}, os.path.join(out_dir, f"r{rank}.pt"))
    dist.barrier()  # neither rank tears gloo down while the other is still in a collective
    dist.destroy_process_group()


def test_two_workers_equal_one_worker_with_double_batch(tmp_path):
    """Each worker: its anchors against the gathered positives and negatives; the mean of the two
    losses and the gradients (all_gather carries them back) equal one worker's on the whole batch."""
    import torch.multiprocessing as mp

    from conftest import _free_port, spawn_gloo

    torch.manual_seed(0)
    h, pos, neg = torch.randn(6, 8), torch.randn(6, 8), torch.randn(6, 2, 8)
    port = _free_port()
    try:
        spawn_gloo(_worker, (h, pos, neg, str(tmp_path), port))
    except mp.ProcessExitedException as exc:
        # Seen twice in full runs on one box (never alone): rank 0 aborted in gloo's teardown at exit
        # ("terminate called without an active exception") after saving its results. Only that
        # is tolerated: both ranks' results must be there, and they are checked below.
        if exc.signal_name != "SIGABRT" or not all((tmp_path / f"r{r}.pt").is_file() for r in range(2)):
            raise
    ranks = [torch.load(tmp_path / f"r{r}.pt") for r in range(2)]
    whole = [t.clone().requires_grad_(True) for t in (h, pos, neg)]
    loss = info_nce_hard(*whole, 0.1, own_weight=0.5)
    loss.backward()
    assert (ranks[0]["loss"] + ranks[1]["loss"]).item() / 2 == pytest.approx(loss.item(), abs=1e-6)
    for t, full in enumerate(whole):  # per-worker mean losses: their gradients average to the global one
        got = torch.cat([ranks[0]["grads"][t], ranks[1]["grads"][t]]) / 2
        assert (got - full.grad).abs().max().item() < 1e-6
    local = [info_nce_hard(h[r * 3:(r + 1) * 3], pos[r * 3:(r + 1) * 3], neg[r * 3:(r + 1) * 3], 0.1, 0.5).item()
             for r in range(2)]
    assert abs(sum(local) / 2 - loss.item()) > 1e-3  # gathering matters


def _triplets(tmp_path, n=96):
    from conftest import make_sentences

    a, p, n1, n2 = (make_sentences(n, seed=s) for s in (1, 2, 3, 4))
    rows = [{"q": x, "a": y, "neg1": z, "neg2": w} for x, y, z, w in zip(a, p, n1, n2)]
    path = tmp_path / "triplets.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path, rows


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_triplets_travel_whole_through_grouping(ray_cluster, tmp_path, fmt):
    import pandas as pd

    from raycse.config import DataConfig, GroupingConfig
    from raycse.data.dataset import load_corpus
    from conftest import epoch_batches
    from raycse.train.batches import row_examples

    path, rows = _triplets(tmp_path)
    if fmt != "jsonl":
        df = pd.DataFrame(rows)
        path = tmp_path / f"triplets.{fmt}"
        df.to_parquet(path) if fmt == "parquet" else df.to_csv(path, index=False)
    d = DataConfig(corpus=str(path), text_column="q", pair_column="a", negative_column="neg1, neg2")
    corpus = load_corpus(d, seed=1)
    want = {r["q"]: (r["a"], (r["neg1"], r["neg2"])) for r in rows}
    eb = epoch_batches(corpus, GroupingConfig(strategy="shingle", group_size=4), 8, 2, 1, 0, 0)
    seen = 0
    for rows in eb.rows.values():
        for row in rows:
            for q, a, score, negs in row_examples(row):
                assert (a, negs) == want[q] and score is None
                seen += 1
    assert seen == 96


def test_train_supervised_with_hard_negatives_end_to_end(ray_cluster, tiny_model, stsb_dev, tmp_path, capsys):
    from raycse.cli import main

    path, _ = _triplets(tmp_path)
    base = ["train", "--model", str(tiny_model), "--corpus", str(path), "--text-column", "q", "--pair-column", "a",
            "--stsb-dev", str(stsb_dev), "--num-workers", "2", "--cpus-per-worker", "1", "--batch-size", "8",
            "--max-length", "16", "--max-steps", "6", "--eval-steps", "3"]
    # trained through the worker loop in this process (local_session); two workers: the equality test above
    from local_session import fit_in_process, run_of

    last = fit_in_process(run_of(base[1:] + ["--negative-column", "neg1,neg2", "--output", str(tmp_path / "sup"),
                                             "--set", "objective.hard_negative_weight=0.5", "--num-workers", "1"]),
                          tmp_path / "ckpt").last
    assert last["step"] == 6 and np.isfinite(last["loss"])
    capsys.readouterr()
    for extra, message in ((["--negative-column", "nope"], "column 'nope' not found"),
                           (["--negative-column", "neg1", "--objective", "laser"], "trains on single sentences"),
                           (["--negative-column", "neg1", "--objective", "sgopt"], "trains on single sentences")):
        bad = tmp_path / "bad"
        assert main(base + extra + ["--output", str(bad)]) == 2
        err = own_lines(capsys.readouterr().err)
        assert len(err) == 1 and message in err[0], err
        assert not bad.exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"q": "a king", "a": "the king", "neg1": " "}) + "\n")
    assert main(["train", "--model", str(tiny_model), "--corpus", str(empty), "--text-column", "q", "--pair-column",
                 "a", "--negative-column", "neg1", "--output", str(tmp_path / "e")]) == 2
    assert "negative column 'neg1' is empty" in capsys.readouterr().err
