"""2 workers x batch b == 1 worker x batch 2b: same loss and gradients (gathered negatives with grad)."""

import pytest
import torch

from conftest import make_sentences
from raycse.config import RunConfig
from raycse.train.module import build_module, unwrap

B = 6
TEXTS = make_sentences(2 * B, seed=3)


def _run_config(model: str) -> RunConfig:
    run = RunConfig()
    run.model.name_or_path = model
    run.model.pooling = "cls"  # cls + the MLP head used in training: the head's gradients are checked too
    run.objective.params = {"tau": 0.05}
    return run


def _loss_and_grads(module, texts, max_length=32):
    core = unwrap(module)
    batch = core.objective.collate(texts, core.encoder.tokenizer, max_length)
    loss = module(batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in core.named_parameters() if p.grad is not None}


def probe_worker(rank: int, world: int, port: int, run_dict: dict, out: str) -> None:
    """One of 2 gloo processes, as a Ray Train worker is (DDP, which Ray Train's ``prepare_model`` wraps): one
    forward/backward on this rank's slice of the global batch."""
    import os

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from raycse.platform.process_state import seed_everything

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    seed_everything(0)
    module = DistributedDataParallel(build_module(RunConfig.from_dict(run_dict)))
    loss, grads = _loss_and_grads(module, TEXTS[rank * B:(rank + 1) * B])  # DDP averages grads
    dist.all_reduce(loss)
    if rank == 0:
        torch.save({"loss": loss / world, "grads": grads}, out)
    dist.destroy_process_group()


@pytest.mark.full_tier  # (two spawned torch processes)
def test_two_workers_match_one_worker_with_double_batch(tiny_model_no_dropout, tmp_path):
    from conftest import _free_port, spawn_gloo
    from raycse.platform.process_state import seed_everything

    run = _run_config(str(tiny_model_no_dropout))
    out = tmp_path / "probe.pt"
    spawn_gloo(probe_worker, (2, _free_port(), run.to_dict(), str(out)))
    two = torch.load(out)

    seed_everything(0)
    loss, grads = _loss_and_grads(build_module(run), TEXTS)
    assert two["loss"].item() == pytest.approx(loss.item(), abs=1e-5)
    assert set(two["grads"]) == set(grads)
    assert any(k.startswith("encoder.mlp") for k in grads)
    worst = max((two["grads"][k] - grads[k]).abs().max().item() for k in grads)
    assert worst < 1e-5, worst
    # Gathering matters: two independent half-batch losses average to a different (lower) value.
    seed_everything(0)
    local = [_loss_and_grads(build_module(run), TEXTS[r * B:(r + 1) * B])[0].item() for r in range(2)]
    assert abs(sum(local) / 2 - loss.item()) > 1e-3
