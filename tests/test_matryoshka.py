"""Matryoshka (issue 68, item 2): the objective's loss summed over nested, re-normalised prefixes of
the embedding, checked against loops written from the formula (Kusupati et al., 2022, Sec. 3) and
against each objective run on an encoder cut by hand (recomputed per size, not replayed); the
encoder runs once a step; GradCache and two workers' gather give the gradients of one uncached
worker; what cannot be wrapped is refused in one line."""

from __future__ import annotations

import math
import os

import pytest
import torch

from conftest import make_sentences, own_lines
from raycse.cli import main
from raycse.config import RunConfig
from raycse.errors import ConfigError
from raycse.model.precision import autocast
from raycse.platform.process_state import seed_everything
from raycse.train.gradcache import cached_step
from raycse.train.module import build_module

TEXTS = make_sentences(8, seed=7, min_len=6)
PAIRS = [(a, b, s) for a, b, s in zip(TEXTS, make_sentences(8, seed=8), [0.9, 0.1, 0.8, 0.3, 1.0, 0.0, 0.6, 0.4])]
DIMS, WEIGHTS = [32, 16, 8], [1.0, 0.5, 2.0]  # the tiny BERT is 32 wide
CASES = {  # objective -> (params, examples, pooling)
    "simcse": ({"tau": 0.05}, TEXTS, "cls"),
    "bsc": ({"mu": 0.5}, PAIRS, "mean"),
    "hicl": ({"alpha": 0.2, "beta": 0.1, "slice_length": 3}, TEXTS, "mean"),
    "laser": ({}, TEXTS, "mean"),
    "compcse": ({"compose": "sbert", "compose_at": "encoder", "d0": 0.5}, TEXTS, "cls"),
}


def _module(model, name, dims=DIMS, weights=WEIGHTS):
    params, _, pooling = CASES[name]
    run = RunConfig()
    run.model.name_or_path, run.model.pooling = str(model), pooling
    run.objective.name, run.objective.params = name, dict(params)
    run.objective.matryoshka_dims, run.objective.matryoshka_weights = dims, weights
    run.validate()
    seed_everything(0)
    return build_module(run).train()


def _batch(module, name):
    return module.objective.collate(CASES[name][1], module.encoder.tokenizer, 24)


def test_the_loss_is_the_weighted_sum_of_infonce_over_renormalised_prefixes(tiny_model_no_dropout):
    """SimCSE under Matryoshka, against sum_m c_m * InfoNCE written as loops over the normalised prefixes."""
    module = _module(tiny_model_no_dropout, "simcse")
    batch = _batch(module, "simcse")
    got = module(batch).loss.item()
    with torch.no_grad():  # no dropout in this model: both views are one embedding
        z = module.encoder(**batch).double()
    tau, n, want = 0.05, z.shape[0], 0.0
    for m, c in zip(DIMS, WEIGHTS):
        prefix = [z[i, :m] / math.sqrt(sum(float(x) ** 2 for x in z[i, :m])) for i in range(n)]
        loss = 0.0
        for i in range(n):
            sims = [float(prefix[i] @ prefix[j]) / tau for j in range(n)]
            loss += -(sims[i] - math.log(sum(math.exp(s) for s in sims)))
        want += c * loss / n
    assert got == pytest.approx(want, rel=1e-5)


class CutByHand(torch.nn.Module):
    """An encoder whose embedding is the real one's first ``m`` coordinates, re-normalised, computed
    anew at every call (the reference: no replay)."""

    def __init__(self, encoder, m):
        super().__init__()
        self.inner, self.m = encoder, m

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        return self.head(self.inner.pooled(input_ids, attention_mask, token_type_ids))

    def head(self, x):
        z = self.inner.head(x)[:, :self.m].float()
        return z / z.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("name", list(CASES))
def test_each_objective_sums_its_own_loss_on_each_prefix(tiny_model_no_dropout, name):
    """Every objective it wraps, HiCL's segments and CompCSE's composed halves (d0 a share of each
    prefix) included, equals that objective run on encoders cut by hand, one per size, weighted."""
    module = _module(tiny_model_no_dropout, name)
    batch = _batch(module, name)
    seed_everything(1)
    got = module(batch).loss
    base = module.objective.base
    seed_everything(1)
    want = sum(c * base(CutByHand(module.encoder, m), batch).loss for m, c in zip(DIMS, WEIGHTS))
    assert got.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)


def test_the_encoder_runs_once_a_step_and_one_size_is_the_plain_objective(tiny_model_no_dropout):
    module = _module(tiny_model_no_dropout, "simcse")
    calls = []
    handle = module.encoder.backbone.embeddings.register_forward_hook(lambda *_: calls.append(1))
    module(_batch(module, "simcse"))
    handle.remove()
    assert len(calls) == 1  # three sizes, one encoder pass (SimCSE's two views stacked in it)

    plain = _module(tiny_model_no_dropout, "simcse", dims=None, weights=None)
    whole = _module(tiny_model_no_dropout, "simcse", dims=[32], weights=None)
    batch = _batch(plain, "simcse")
    for m in (plain, whole):
        m.zero_grad()
        m(batch).loss.backward()
    grads = {n: p.grad for n, p in whole.named_parameters() if p.grad is not None}
    assert max((p.grad - grads[n]).abs().max().item()
               for n, p in plain.named_parameters() if p.grad is not None) < 1e-6


def _grads(module):
    return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["simcse", "compcse", "hicl"])
def test_gradcache_gives_the_uncached_gradients(tiny_model_no_dropout, name):
    module = _module(tiny_model_no_dropout, name)
    batch = _batch(module, name)
    seed_everything(1)
    module.zero_grad()
    module(batch).loss.backward()
    want = _grads(module)
    seed_everything(1)
    module.zero_grad()
    cached_step(module, batch, 2, lambda: autocast(torch.device("cpu"), None))
    got = _grads(module)
    assert set(got) == set(want)
    assert max((got[k] - want[k]).abs().max().item() for k in want) < 1e-5


def _worker(rank, model, out_dir, port):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    module = _module(model, "simcse")
    batch = module.objective.collate(TEXTS[rank * 4:(rank + 1) * 4], module.encoder.tokenizer, 24)
    module(batch).loss.backward()
    grads = _grads(module)
    for g in grads.values():  # DDP's average
        dist.all_reduce(g)
        g /= 2
    torch.save(grads, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_two_workers_gather_every_prefix(tiny_model_no_dropout, tmp_path):
    """Two gloo workers with half the batch each give one worker's gradients on the whole batch: each
    prefix's in-batch negatives come from both workers."""
    from conftest import _free_port, spawn_gloo

    spawn_gloo(_worker, (str(tiny_model_no_dropout), str(tmp_path), _free_port()))
    module = _module(tiny_model_no_dropout, "simcse")
    module(_batch(module, "simcse")).loss.backward()
    want = _grads(module)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert max((got[k] - want[k]).abs().max().item() for k in want) < 1e-5


def test_what_cannot_be_wrapped_is_refused_in_one_line(tiny_model_no_dropout, corpus, tmp_path, capsys):
    common = ["--model", str(tiny_model_no_dropout), "--corpus", str(corpus), "--stsb-dev", "none",
              "--max-steps", "1", "--batch-size", "8"]
    cases = {
        "sgopt": (["--objective", "sgopt", "--matryoshka-dims", "32,16"], "cannot wrap sgopt"),
        "compcse's sbert on projected halves": (["--objective", "compcse", "--set", "objective.compose=sbert",
                                                 "--matryoshka-dims", "32,16"], "set compose_at: encoder"),
        "a size of 0": (["--matryoshka-dims", "32,0"], "sizes >= 1"),
        "a repeated size": (["--matryoshka-dims", "[16, 16]"], "repeats a size"),
        "weights that do not match": (["--matryoshka-dims", "32,16", "--set", "objective.matryoshka_weights=[1]"],
                                      "one weight >= 0 per size"),
        "weights alone": (["--set", "objective.matryoshka_weights=[1]"], "needs objective.matryoshka_dims"),
        "wider than the model": (["--matryoshka-dims", "64,32"], "more than the model's 32"),
    }
    for case, (flags, expected) in cases.items():
        out = tmp_path / case.replace(" ", "_")
        capsys.readouterr()
        assert main(["train", *common, *flags, "--output", str(out)]) == 2, case
        err = own_lines(capsys.readouterr().err)
        assert len(err) == 1 and expected in err[0], (case, err)
        assert not out.exists(), case
    with pytest.raises(ConfigError, match="matryoshka_dims and matryoshka_weights"):
        RunConfig.from_dict({"objective": {"matryoshka_sizes": [8]}})


# A trained model's sizes, eval's score of each and the card: one fit with the sentence-transformers round
# trip's (tests/test_st_roundtrip.py, test_a_trained_model_keeps_dense_normalize_prompts_and_similarity).


def test_a_search_space_can_search_the_sizes(tmp_path):
    import optuna
    import yaml

    from raycse.tune.space import load_space

    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({"run": {"objective": {"name": "simcse"}},
                                    "search": {"matryoshka_dims": {"choice": ["none", "384,256,128,64"]}}}))
    space = load_space(str(path))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(8):
        trial = study.ask()
        space.define_by_run()(trial)
        dims = space.run_config(trial.params, seed=0).objective.matryoshka_dims
        seen.add(tuple(dims) if dims else None)
        study.tell(trial, 0.0)
    assert seen == {None, (384, 256, 128, 64)}
    path.write_text(yaml.safe_dump({"run": {"objective": {"name": "sgopt"}},
                                    "search": {"matryoshka_dims": {"choice": ["none", "64,32"]}}}))
    with pytest.raises(ConfigError, match="cannot wrap sgopt"):
        load_space(str(path))
