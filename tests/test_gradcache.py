"""GradCache: the cached step's parameter gradients equal the uncached step's, for every objective,
on 1 worker and on 2 (torch.distributed with gloo, as Ray Train sets it up), and pass 2 replays
pass 1's random state."""

import os

import pytest
import torch

from conftest import make_sentences, own_lines
from raycse.config import RunConfig
from raycse.model.precision import autocast
from raycse.platform.process_state import seed_everything
from raycse.train.gradcache import ChunkedEncoder, cached_step, replay
from raycse.train.module import build_module

TEXTS = make_sentences(8, seed=5, min_len=6)
PAIRS = [(a, b, s) for a, b, s in zip(TEXTS, make_sentences(8, seed=6), [0.9, 0.1, 0.8, 0.3, 1.0, 0.0, 0.6, 0.4])]
CASES = {  # objective -> (params, examples, pooling)
    "simcse": ({"tau": 0.05}, TEXTS, "cls"),
    "bsc": ({"mu": 0.5, "trainable_tau": True}, PAIRS, "mean"),
    "hicl": ({"alpha": 0.2, "beta": 0.1, "slice_length": 3}, TEXTS, "mean"),
    "laser": ({}, TEXTS, "mean"),
    "compcse": ({"compose": "sbert"}, TEXTS, "cls"),
    "sgopt": ({"proj_hidden": 16}, TEXTS, "cls"),
}


def _module(model, name):
    params, _, pooling = CASES[name]
    run = RunConfig()
    run.model.name_or_path, run.model.pooling = str(model), pooling
    run.objective.name, run.objective.params = name, dict(params)
    seed_everything(0)
    return build_module(run)


def _grads(module):
    return {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}


def _uncached(module, batch):
    seed_everything(1)
    module.zero_grad()
    loss = module(batch).loss
    loss.backward()
    return loss.item(), _grads(module)


def _cached(module, batch, chunk, check=False):
    seed_everything(1)
    module.zero_grad()
    out = cached_step(module, batch, chunk, lambda: autocast(torch.device("cpu"), None), check=check)
    return out.loss.item(), _grads(module)


@pytest.mark.parametrize("name", list(CASES))
def test_cached_gradients_equal_uncached(tiny_model_no_dropout, name):
    module = _module(tiny_model_no_dropout, name).train()
    _, examples, _ = CASES[name]
    batch = module.objective.collate(examples, module.encoder.tokenizer, 24)
    loss, want = _uncached(module, batch)
    cached_loss, got = _cached(module, batch, chunk=2)  # a quarter of the batch
    assert cached_loss == pytest.approx(loss, abs=1e-6)
    assert set(got) == set(want) and any(k.startswith("encoder.backbone") for k in got)
    worst = max((got[k] - want[k]).abs().max().item() for k in want)
    assert worst < 1e-5, (name, worst)


def test_pass_two_replays_the_dropout_of_pass_one(tiny_model):
    """With dropout on, every chunk's vectors in pass 2 equal pass 1's (check=True raises otherwise);
    replaying from the wrong state is caught."""
    module = _module(tiny_model, "simcse").train()
    batch = module.objective.collate(TEXTS, module.encoder.tokenizer, 24)
    _cached(module, batch, chunk=3, check=True)
    proxy = ChunkedEncoder(module.encoder, 3)
    module.objective(proxy, batch).loss.backward()
    for call in proxy.calls:
        call.states = call.states[1:] + call.states[:1]  # each chunk gets another chunk's state
    with pytest.raises(RuntimeError, match="pass 2 differs from pass 1"):
        replay(module.encoder, proxy.calls, check=True)


def _worker(rank, model, out_dir, port):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    module = _module(model, "simcse").train()
    half = TEXTS[rank * 4:(rank + 1) * 4]
    batch = module.objective.collate(half, module.encoder.tokenizer, 24)
    _, grads = _cached(module, batch, chunk=1)
    torch.save(grads, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_two_workers_cached_equal_one_worker_uncached_double_batch(tiny_model_no_dropout, tmp_path):
    from conftest import _free_port, spawn_gloo

    port = _free_port()
    spawn_gloo(_worker, (str(tiny_model_no_dropout), str(tmp_path), port))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    module = _module(tiny_model_no_dropout, "simcse").train()
    _, want = _uncached(module, module.objective.collate(TEXTS, module.encoder.tokenizer, 24))
    for got in ranks:  # both ranks hold the averaged gradient, equal to one worker's with the whole batch
        assert set(got) == set(want)
        assert max((got[k] - want[k]).abs().max().item() for k in want) < 1e-5


def test_same_seed_same_model_with_and_without_the_cache(ray_cluster, tiny_model_no_dropout, corpus, tmp_path, capsys):
    """Through the worker loop (in this process, as a Ray Train worker runs it): a few steps with cache_chunk_size a
    quarter of the batch give the model the uncached run gives; a chunk larger than the batch is refused. (Two
    workers: test_two_workers_cached_equal_one_worker_uncached_double_batch.)"""
    from local_session import fit_in_process
    from raycse.cli import main
    from raycse.config import RunConfig
    from raycse.model.encoder import Encoder

    def train(name, **extra):
        run = RunConfig.from_dict({"model": {"name_or_path": str(tiny_model_no_dropout), "max_length": 16},
                                   "data": {"corpus": str(corpus)}, "eval": {"stsb_dev": "none"},
                                   "train": {"batch_size": 8, "max_steps": 4, "lr": 5e-4, "precision": "fp32",
                                             **extra}, "output_dir": str(tmp_path / name)})
        return fit_in_process(run, tmp_path / f"{name}-ckpt")

    plain, cached = train("plain"), train("cached", cache_chunk_size=2)
    assert plain.last["step"] == cached.last["step"] == 4
    probe = make_sentences(6, seed=9)
    a = Encoder.from_pretrained(str(plain.model_dir())).encode(probe)
    b = Encoder.from_pretrained(str(cached.model_dir())).encode(probe)
    base = Encoder.from_pretrained(str(tiny_model_no_dropout)).encode(probe)
    assert abs(a - b).max() < 1e-4 and abs(a - base).max() > 1e-3  # trained, and trained alike
    capsys.readouterr()
    assert main(["train", "--model", str(tiny_model_no_dropout), "--corpus", str(corpus), "--output",
                 str(tmp_path / "bad"), "--stsb-dev", "none", "--batch-size", "8",
                 "--set", "train.cache_chunk_size=9"]) == 2
    err = own_lines(capsys.readouterr().err)
    assert len(err) == 1 and "cache_chunk_size must be between 1 and the batch size" in err[-1]
    assert not (tmp_path / "bad").exists()
