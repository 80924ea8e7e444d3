"""2 workers x batch b == 1 worker x batch 2b: same loss and gradients (gathered negatives with grad)."""

import sys

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


def probe_loop(config):
    """Runs on each Ray Train worker: one forward/backward on this rank's slice of the global batch."""
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    from raycse.platform.process_state import seed_everything

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    run = RunConfig.from_dict(config["run"])
    seed_everything(0)
    module = ray.train.torch.prepare_model(build_module(run))
    loss, grads = _loss_and_grads(module, config["texts"][rank * B:(rank + 1) * B])  # DDP averages grads
    dist.all_reduce(loss)
    if rank == 0:
        torch.save({"loss": loss / ctx.get_world_size(), "grads": grads}, config["out"])
    ray.train.report({"done": 1})


def test_two_workers_match_one_worker_with_double_batch(ray_cluster, tiny_model_no_dropout, tmp_path):
    import ray.cloudpickle
    from ray.train import RunConfig as TrainRunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raycse.platform.process_state import seed_everything

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    run = _run_config(str(tiny_model_no_dropout))
    out = tmp_path / "probe.pt"
    TorchTrainer(probe_loop, train_loop_config={"run": run.to_dict(), "texts": TEXTS, "out": str(out)},
                 scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                 run_config=TrainRunConfig(name="probe", storage_path=str(tmp_path / "ray"))).fit()
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
