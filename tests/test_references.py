"""Issue 89: a teacher (distillation: kl, mse, margin_mse) and a guide (GISTEmbed's mask) around any objective.

Each term is checked against a second implementation written from the papers' and sentence-transformers'
formulas as loops over rows and candidates (never raycse's helpers); the mask on an example with a false
negative masked and a true negative kept; the wrapped step on 2 workers (gloo) against 1 worker with the
double batch; GradCache against the plain step; a run through raycse.train with both, its vectors
read back from the cache the second time."""

from __future__ import annotations

import math
import os

import pytest
import torch

from conftest import make_sentences
from raycse.config import RunConfig
from raycse.platform.process_state import seed_everything

TEXTS = make_sentences(8, seed=11, min_len=5)


def _cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def _softmax(row):
    top = max(v for v in row if v is not None)
    e = [0.0 if v is None else math.exp(v - top) for v in row]
    return [x / sum(e) for x in e]


def kl_by_loops(s, t, s2, t2, tau_s, tau_t):
    """(1/n) sum_i sum_j p^T_ij log(p^T_ij / p^S_ij), j over the pair column (s2/t2) or the other sentences."""
    n, total = len(s), 0.0
    cand_s, cand_t = (s2, t2) if s2 is not None else (s, t)
    for i in range(n):
        left_out = s2 is None
        ls = [None if left_out and j == i else _cos(s[i], cand_s[j]) / tau_s for j in range(len(cand_s))]
        lt = [None if left_out and j == i else _cos(t[i], cand_t[j]) / tau_t for j in range(len(cand_t))]
        ps, pt = _softmax(ls), _softmax(lt)
        total += sum(pt[j] * math.log(pt[j] / ps[j]) for j in range(len(pt)) if pt[j] > 0)
    return total / n


@pytest.mark.parametrize("pairs", [False, True])
def test_kl_term_is_the_teachers_softmax_against_the_students(pairs):
    from raycse.objectives.distill import kl_term

    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(6, 8, generator=g), torch.randn(6, 12, generator=g)  # (sizes need not match)
    s2, t2 = (torch.randn(6, 8, generator=g), torch.randn(6, 12, generator=g)) if pairs else (None, None)
    got = kl_term(s, t, s2, t2, 0.1, 0.05).item()
    want = kl_by_loops(s.tolist(), t.tolist(), s2.tolist() if pairs else None, t2.tolist() if pairs else None, 0.1, 0.05)
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert kl_term(t[:, :8], t[:, :8], None, None, 0.05, 0.05).item() == pytest.approx(0.0, abs=1e-6)  # equal: 0


def test_mse_term_is_the_mean_squared_difference_of_every_coordinate():
    from raycse.objectives.distill import mse_term

    g = torch.Generator().manual_seed(1)
    s, t, s2, t2 = (torch.randn(5, 4, generator=g) for _ in range(4))
    got = mse_term([s, s2], [t, t2]).item()
    rows = list(zip(s.tolist() + s2.tolist(), t.tolist() + t2.tolist()))
    want = sum((a - b) ** 2 for x, y in rows for a, b in zip(x, y)) / (len(rows) * 4)
    assert got == pytest.approx(want, rel=1e-5)


def test_margin_mse_is_the_students_margin_against_the_teachers():
    from raycse.objectives.distill import margin_mse_term

    g = torch.Generator().manual_seed(2)
    n, k = 4, 3
    s, sp, sn = torch.randn(n, 6, generator=g), torch.randn(n, 6, generator=g), torch.randn(n, k, 6, generator=g)
    t, tp, tn = torch.randn(n, 10, generator=g), torch.randn(n, 10, generator=g), torch.randn(n, k, 10, generator=g)
    got = margin_mse_term(s, sp, sn, t, tp, tn).item()
    want = 0.0
    for i in range(n):
        for m in range(k):  # Hofstaetter et al.: (M_s(q, p, n) - M_t(q, p, n))^2, M = s(q, p) - s(q, n)
            student = _cos(s[i].tolist(), sp[i].tolist()) - _cos(s[i].tolist(), sn[i, m].tolist())
            teacher = _cos(t[i].tolist(), tp[i].tolist()) - _cos(t[i].tolist(), tn[i, m].tolist())
            want += (student - teacher) ** 2
    assert got == pytest.approx(want / (n * k), rel=1e-5)


def info_nce_with_guide_by_loops(a, c, ga, gc, tau, margin):
    """GISTEmbed: -log e^{s(a_i,c_i)/tau} / sum_{j kept} e^{s(a_i,c_j)/tau}, j dropped where
    g(a_i, c_j) > g(a_i, c_i) - margin (j != i)."""
    total, dropped = 0.0, 0
    for i in range(len(a)):
        threshold = _cos(ga[i], gc[i]) - margin
        kept = [j for j in range(len(c)) if j == i or not _cos(ga[i], gc[j]) > threshold]
        dropped += len(c) - len(kept)
        logits = {j: _cos(a[i], c[j]) / tau for j in kept}
        top = max(logits.values())
        total += -(logits[i] - top - math.log(sum(math.exp(v - top) for v in logits.values())))
    return total / len(a), dropped


def test_the_guide_masks_a_false_negative_and_keeps_a_true_one():
    """Single sentences: a sentence's positive is itself (guide similarity 1), so a candidate is masked when the
    guide finds it within the margin of 1. Sentence 1 is sentence 0 again to the guide (0.9988: a false
    negative, masked both ways at margin 0.01); sentence 2 is far (a true negative, kept); at margin 0 only an
    exact duplicate would be masked. The loss equals GISTEmbed's by loops, and the fraction is said."""
    from raycse.objectives.contrastive import info_nce
    from raycse.objectives.guide import Guide, guided

    g = torch.Generator().manual_seed(3)
    z1, z2 = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    guide_vectors = torch.eye(4, 6)
    guide_vectors[1] = torch.tensor([1.0, 0.05, 0, 0, 0, 0])  # sentence 1 is sentence 0 again, to the guide
    plain = info_nce(z1, z2, 0.05).item()
    for margin, masked in ((0.01, 2), (0.0, 0)):
        guide = Guide(guide_vectors, margin=margin)
        with guided(guide):
            got = info_nce(z1, z2, 0.05).item()
        want, dropped = info_nce_with_guide_by_loops(z1.tolist(), z2.tolist(), guide_vectors.tolist(),
                                                     guide_vectors.tolist(), 0.05, margin)
        assert dropped == masked and got == pytest.approx(want, rel=1e-5)
        assert guide.fraction().item() == pytest.approx(masked / 12)  # of the 4 x 3 negatives
    assert got == pytest.approx(plain, rel=1e-6)  # nothing masked: InfoNCE as it was
    with guided(Guide(guide_vectors, margin=0.01)):
        assert info_nce(z1, z2, 0.05).item() != pytest.approx(plain, rel=1e-3)


def test_pairs_with_hard_negatives_are_masked_among_positives_and_negatives():
    from raycse.objectives.contrastive import info_nce_hard
    from raycse.objectives.guide import Guide, guided

    g = torch.Generator().manual_seed(4)
    n, k = 3, 1
    h, pos, neg = torch.randn(n, 8, generator=g), torch.randn(n, 8, generator=g), torch.randn(n, k, 8, generator=g)
    gq, gp, gn = torch.randn(n, 5, generator=g), torch.randn(n, 5, generator=g), torch.randn(n * k, 5, generator=g)
    gn[0] = gq[0] * 3  # row 0's own hard negative is its anchor again, to the guide: masked
    with guided(Guide(gq, 0.0, gp, gn)):
        got = info_nce_hard(h, pos, neg, 0.05).item()
    cands, gcands = pos.tolist() + neg.reshape(n * k, -1).tolist(), gp.tolist() + gn.tolist()
    want, dropped = info_nce_with_guide_by_loops(h.tolist(), cands, gq.tolist(), gcands, 0.05, 0.0)
    assert dropped >= 1 and got == pytest.approx(want, rel=1e-5)


def _module(model, teacher=True, guide=True, objective="simcse", distill="kl", cache=None):
    from raycse.train.module import build_module

    run = RunConfig()
    run.model.name_or_path, run.model.pooling = str(model), "mean"
    run.model.teacher, run.model.guide = ("T" if teacher else None), ("initial" if guide else None)
    run.objective.name, run.objective.distill, run.objective.guide_margin = objective, distill, 0.05
    run.train.cache_chunk_size = cache or 0
    seed_everything(0)
    return build_module(run)


def _batch(module, texts, seed=7):
    g = torch.Generator().manual_seed(seed)
    batch = module.objective.collate(texts, module.encoder.tokenizer, 24)
    batch["teacher.text"] = torch.randn(len(texts), 12, generator=g)  # a wider teacher
    batch["guide.text"] = torch.randn(len(texts), 6, generator=g)
    batch["guide.text"][1] = batch["guide.text"][0]  # a false negative pair
    return batch


def test_the_student_rows_are_the_objectives_own_and_the_terms_add(tiny_model_no_dropout):
    """SimCSE's first view is what the teacher is compared with (no extra pass); CompCSE, which embeds
    halves, gets a pass of the whole sentences. The loss is the objective's under the guide plus
    w times the teacher's term."""
    from raycse.objectives.contrastive import info_nce
    from raycse.objectives.distill import kl_term
    from raycse.objectives.guide import Guide, guided

    module = _module(tiny_model_no_dropout).eval()
    batch = _batch(module, TEXTS)
    out = module(batch)
    z = module.encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    with guided(Guide(batch["guide.text"], 0.05)):
        contrastive = info_nce(z, z, 0.05)
    expected = contrastive + 1.0 * kl_term(z, batch["teacher.text"], None, None, 0.05, 0.05)
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert list(module.objective.places.values()) == [(0, 0)]  # found in the objective's own call
    assert out.metrics["guide_masked"].item() > 0
    compcse = _module(tiny_model_no_dropout, objective="compcse", guide=False).eval()
    compcse(_batch(compcse, TEXTS))
    assert list(compcse.objective.places.values()) == [None]  # an extra pass of the whole sentences


def _grads(module):
    return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}


def test_gradcache_gives_the_plain_steps_gradients_with_teacher_and_guide(tiny_model_no_dropout):
    from raycse.model.precision import autocast
    from raycse.train.gradcache import cached_step

    plain = _module(tiny_model_no_dropout).train()
    batch = _batch(plain, TEXTS)
    seed_everything(1)
    loss = plain(batch).loss
    loss.backward()
    want = _grads(plain)
    cached = _module(tiny_model_no_dropout, cache=2).train()
    seed_everything(1)
    out = cached_step(cached, _batch(cached, TEXTS), 2, lambda: autocast(torch.device("cpu"), None))
    got = _grads(cached)
    assert out.loss.item() == pytest.approx(loss.item(), abs=1e-6)
    assert set(got) == set(want) and max((got[k] - want[k]).abs().max().item() for k in want) < 1e-5


def _worker(rank, model, out_dir, port):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    module = _module(model).train()
    full = _batch(module, TEXTS)
    half = module.objective.collate(TEXTS[rank * 4:(rank + 1) * 4], module.encoder.tokenizer, 24)
    half.update({k: v[rank * 4:(rank + 1) * 4] for k, v in full.items() if k.startswith(("teacher.", "guide."))})
    loss = module(half).loss
    loss.backward()
    grads = _grads(module)
    for g in grads.values():  # DDP's average
        dist.all_reduce(g)
        g /= 2
    dist.all_reduce(loss)
    torch.save({"loss": loss.item() / 2, "grads": grads}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.full_tier  # (two spawned torch processes, ~10 s: kept out of the fast tier)
def test_two_workers_gather_the_teachers_and_guides_vectors_like_the_students(tiny_model_no_dropout, tmp_path):
    """2 workers x 4 sentences == 1 worker x 8: the teacher's candidates and the guide's are gathered across
    workers as the student's are (same loss, same gradients)."""
    from conftest import _free_port, spawn_gloo

    spawn_gloo(_worker, (str(tiny_model_no_dropout), str(tmp_path), _free_port()))
    one = _module(tiny_model_no_dropout).train()
    loss = one(_batch(one, TEXTS)).loss
    loss.backward()
    want = _grads(one)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["loss"] == pytest.approx(loss.item(), rel=1e-5)
        assert max((got["grads"][k] - want[k]).abs().max().item() for k in want) < 1e-5


def test_mse_with_unequal_sizes_and_a_guide_without_infonce_are_refused(tiny_model, tmp_path):
    from transformers import BertConfig, BertModel

    from raycse.errors import ConfigError
    from raycse.train.model_checks import resolve_references

    wide = tmp_path / "wide"
    BertModel(BertConfig(vocab_size=50, hidden_size=48, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(wide)
    run = RunConfig()
    run.model.name_or_path, run.model.teacher, run.objective.distill = str(tiny_model), str(wide), "mse"
    with pytest.raises(ConfigError, match="the teacher's is 48, the student's 32; use --distill kl") as err:
        resolve_references(run.resolved(), str(tiny_model))
    assert "\n" not in str(err.value)
    run.objective.distill = "kl"
    assert resolve_references(run.resolved(), str(tiny_model))[0].model.teacher == str(wide.resolve())
    run.model.guide, run.objective.name = "initial", "bsc"
    with pytest.raises(ConfigError, match="objective 'bsc' does not score its negatives"):
        run.validate()


def test_a_run_with_a_teacher_and_a_guide_trains_and_a_second_seed_reads_their_vectors_back(
        ray_cluster, tiny_model, corpus, stsb_dev, tmp_path, capsys, monkeypatch):
    """`raycse train --teacher T --guide initial` (its worker loop in this process: local_session): both terms in
    the step's metrics, the vectors computed once and kept; another seed (another shuffle of the same sentences)
    reads them back. (Two workers gathering them: test_two_workers_gather_the_teachers_and_guides_vectors_...)"""
    from conftest import make_tiny_model
    from local_session import fit_in_process, run_of

    monkeypatch.setenv("RAYCSE_CACHE", str(tmp_path / "cache"))
    teacher = make_tiny_model(tmp_path / "teacher", seed=1)
    said = []
    for seed in (0, 1):
        run = run_of(["--model", str(tiny_model), "--corpus", str(corpus), "--output", str(tmp_path / f"run{seed}"),
                      "--stsb-dev", str(stsb_dev), "--batch-size", "8", "--max-length", "16", "--max-steps", "4",
                      "--log-steps", "2", "--seed", str(seed), "--teacher", str(teacher), "--guide", "initial",
                      "--guide-margin", "0.001"])
        last = fit_in_process(run, tmp_path / f"ckpt{seed}").last
        said.append(capsys.readouterr().out)
        assert last["step"] == 4 and last["last_distill"] > 0 and 0 <= last["last_guide_masked"] <= 1
    assert "teacher: text: 256 embeddings (32-d) computed" in said[0] and "guide: text: 256 embeddings" in said[0]
    assert "teacher: text: 256 embeddings read back" in said[1] and "guide: text: 256 embeddings read back" in said[1]
    assert len(list((tmp_path / "cache" / "references").glob("*.npz"))) == 2


def test_the_vector_cache_is_read_only_when_whole_and_written_whole(tmp_path):
    """A cache file cut short, another's, or one missing a text is computed again (None); a write leaves
    exactly the file, no part-written one; a read gives each text's vector whatever the order. Issue 106: a
    file of NaNs, of vectors of another width, or whose vectors no longer match its digest is not trusted, and
    says why."""
    import json

    import numpy as np

    from raycse.grouping.references import read_cached, text_hash, write_cached

    hashes = np.array([text_hash(t) for t in ("a", "b", "c", "a")], dtype=np.uint64)
    vectors = np.arange(8, dtype=np.float32).reshape(4, 2)
    vectors[3] = vectors[0]  # (the same text, the same vector)
    path = tmp_path / "refs" / "x.npz"
    write_cached(path, hashes, vectors, "teacher-model")
    assert [p.name for p in path.parent.iterdir()] == ["x.npz"]
    with np.load(path) as z:
        assert json.loads(str(z["meta"]))["model"] == "teacher-model" and json.loads(str(z["meta"]))["width"] == 2
    again, problem = read_cached(path, hashes[::-1].copy(), width=2)
    assert np.array_equal(again, vectors[::-1]) and problem == ""
    assert read_cached(path, np.array([text_hash("d")], dtype=np.uint64)) == (None, "")  # a text not kept
    assert read_cached(path, hashes, width=768)[1] == "2-d vectors for a 768-d model"  # another model's width
    with np.load(path) as z:
        kept, meta = z["hashes"], z["meta"]
    np.savez(path, hashes=kept, vectors=np.full((3, 2), np.nan, dtype=np.float32), meta=meta)  # poisoned
    assert read_cached(path, hashes) == (None, "its vectors do not match their digest")
    nan = np.full((3, 2), np.nan, dtype=np.float32)
    write_cached(path, kept, nan)  # NaNs with a digest of their own
    assert read_cached(path, hashes) == (None, "it holds values that are not finite")
    np.savez(path, hashes=kept, vectors=np.zeros((3, 5), dtype=np.float32))  # no digest (a hand-made file)
    assert read_cached(path, hashes) == (None, "unreadable, or written without its digest")
    path.write_bytes(path.read_bytes()[:40])  # cut short
    assert read_cached(path, hashes)[0] is None


def test_a_cache_folder_of_another_user_or_writable_by_all_is_refused(tmp_path, monkeypatch):
    """Issue 106 item 5: the reference cache's names are predictable, so a folder others can write is refused
    in one line naming RAYCSE_CACHE; one of this user's, or none yet, is used."""
    from raycse.errors import ConfigError
    from raycse.platform.caches import checked_cache_dir

    cache = tmp_path / "cache"
    monkeypatch.setenv("RAYCSE_CACHE", str(cache))
    assert checked_cache_dir("references") == cache / "references"  # nothing there yet
    (cache / "references").mkdir(parents=True)
    cache.chmod(0o755)
    (cache / "references").chmod(0o777)
    with pytest.raises(ConfigError, match=r"references is writable by every user, .* set RAYCSE_CACHE") as err:
        checked_cache_dir("references")
    assert "\n" not in str(err.value)
    (cache / "references").chmod(0o755)
    assert checked_cache_dir("references") == cache / "references"
    if os.geteuid() != 0:
        return  # (only root can give a folder to another user)
    os.chown(cache, 12345, -1)
    with pytest.raises(ConfigError, match="is owned by user id 12345, not yours"):
        checked_cache_dir("references")


def test_a_teacher_weighted_0_is_left_out(tmp_path):
    """Issue 89, item 4: distill_weight 0 is a search's "no teacher" choice: no term, nothing embedded, and the
    teacher not even loaded (a URI not fetched); any other weight loads it."""
    from raycse.config import RunConfig
    from raycse.errors import RaycseError
    from raycse.train.model_checks import resolve_references

    run = RunConfig()
    run.model.teacher, run.objective.distill_weight = str(tmp_path / "nosuch"), 0.0
    run = run.resolved()
    assert run.objective.references(True, False) is None and run.build_objective().__class__.__name__ == "SimCSE"
    assert resolve_references(run, "unused")[0].model.teacher == str(tmp_path / "nosuch")
    with pytest.raises(RaycseError, match=r"model.teacher \(--teacher\): model path does not exist"):
        resolve_references(run.resolved({"objective.distill_weight": 0.5}), "unused")
    # a Tune trial weighting the teacher 0 does not take the experiment's prepared data, teacher vectors and all
    from raycse.train.prepare import data_key

    weighted = {data_key(run.resolved({"objective.distill_weight": w})) for w in (0.5, 1.0, 2.0)}
    assert len(weighted) == 1 and data_key(run) not in weighted
