"""The step engine: one optimizer step (forward, backward, clip, step, schedule) in the run's
precision, with GradCache when ``train.cache_chunk_size`` asks for it.

Each step's loss stays on the device until :meth:`StepEngine.read_losses` (a logging or checkpoint
step): a read per step made the host wait for the device at every step, where it could queue the
next one meanwhile."""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from raycse.config import RunConfig
from raycse.errors import LossNotFinite
from raycse.model.precision import autocast, resolve_precision
from raycse.objectives.base import LossOutput
from raycse.train import gradcache
from raycse.train.module import build_optimizer, unwrap


def move(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def check_gradients_reach_all(module: nn.Module) -> None:
    """Every trainable parameter must get a gradient, or DDP silently stops syncing its bucket (a mixture's
    sources' objectives but the step's own have none: DDP is told so, raycse.train.loop)."""
    missing = [n for n, p in module.named_parameters()
               if p.requires_grad and p.grad is None and not n.startswith("objective.parts.")]
    if missing:
        raise RuntimeError(f"trainable parameters received no gradient: {', '.join(missing[:5])}"
                           f"{' ...' if len(missing) > 5 else ''}; freeze them (requires_grad_(False))")


class StepEngine:
    """The (DDP-wrapped) ``module`` on ``device``, its optimizer and schedule over ``total_steps``."""

    def __init__(self, run: RunConfig, module: nn.Module, device: torch.device, total_steps: int):
        self.run, self.module, self.core, self.device = run, module, unwrap(module), device
        self.opt, self.sched = build_optimizer(module, run, total_steps)
        self.dtype = resolve_precision(run.train.precision, device)
        self.scaler = torch.amp.GradScaler("cuda") if self.dtype == torch.float16 else None
        self.unread: list = []  # the losses of the steps since the last read, on the device

    @property
    def lr(self) -> float:
        return self.sched.get_last_lr()[0]

    def step(self, batch: dict, done: int) -> LossOutput:
        """One optimizer step on ``batch`` (on the device), ``done`` steps having been taken before it."""
        t, scaler, opt = self.run.train, self.scaler, self.opt
        if t.cache_chunk_size:  # GradCache: both passes and the gradient average in one call
            out = gradcache.cached_step(self.core, batch, t.cache_chunk_size,
                                        lambda: autocast(self.device, self.dtype),
                                        scaler.scale if scaler is not None else None)
            if scaler is not None:
                scaler.unscale_(opt)
        else:
            with autocast(self.device, self.dtype):
                out = self.module(batch)
            if scaler is not None:
                scaler.scale(out.loss).backward()
                scaler.unscale_(opt)
            else:
                out.loss.backward()
        if t.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), t.max_grad_norm)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        self.sched.step()
        if done == 0:
            check_gradients_reach_all(self.core)
        opt.zero_grad(set_to_none=True)
        self.unread.append(out.loss.detach())
        return out

    def read_losses(self, done: int) -> list[float]:
        """The losses of the steps since the last read, ``done`` steps being taken (one wait for the
        device); a non-finite one stops the run naming its step."""
        if not self.unread:
            return []
        values = torch.stack(self.unread).float().tolist()
        first, self.unread = done - len(values) + 1, []
        for i, value in enumerate(values):
            if not math.isfinite(value):
                raise LossNotFinite(f"loss became {value} at step {first + i} (read back at step {done}, steps "
                                    f"{first}..{done}); lower train.lr or use precision fp32 (an objective of your "
                                    f"own: check that its loss stays finite)")
        return values

    def synchronize(self) -> float:
        """Wait for the device's queued work (a timing must include it); the time after."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def peak_memory(self) -> dict:
        """Peak resident memory of this worker (and of its GPU, when there is one), and the bytes of parameters and
        optimizer state it holds (its shard of them under ``--sharding fsdp``), in MB."""
        import resource

        from raycse.train.sharding import local_bytes

        out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "held_state_mb": local_bytes(self.module, self.opt) / 2**20}
        if self.device.type == "cuda":
            out["peak_gpu_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        return out
