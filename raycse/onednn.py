"""Float32 linear layers on oneDNN on the CPU, where MKL's sgemm is the slow path.

PyTorch sends a float32 ``F.linear`` (and its backward matmuls) on the CPU to MKL's sgemm. On this
project's 2-core AMD EPYC VM (AVX-512; MKL is known to pick generic code paths on non-Intel CPUs) it
reaches 140-190 GFLOP/s on BERT's shapes, while oneDNN's inner product (bundled with PyTorch, and
what bf16 autocast uses anyway) reaches 320-420 GFLOP/s on the same float32 inputs, agreeing to
float32 rounding (relative difference ~1e-6); the two backward products are 2.2x and 1.5x faster
(BENCHMARKS.md).

:func:`onednn_linear` is a ``TorchFunctionMode`` that reroutes ``F.linear`` to oneDNN when every
tensor is float32 on the CPU and autocast is off (under autocast the usual path already runs bf16 on
oneDNN). Where nothing needs a gradient (inference) it calls oneDNN's op directly; otherwise
:class:`_Linear` computes the forward and both backward products with it too. Every other op runs
as usual, so any Hugging Face architecture can be wrapped.

Which kernels a machine gets is measured, not assumed: :func:`choice` times BERT-shaped float32
linears (forward and both backward products) both ways once per machine (CPU model, ISA flags and
caps, torch version, threads), ~0.3 s, and caches the verdict in ``~/.cache/raycse/kernels.json``
(``RAYCSE_CACHE`` moves it). ``RAYCSE_ONEDNN=0`` / ``=1`` in the environment forces PyTorch's own
kernels / oneDNN without probing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode


def available() -> bool:
    return choice()["onednn"]


def _cache_file() -> Path:
    from raycse.machine import cache_dir

    return cache_dir() / "kernels.json"


def _probe_key() -> str:
    from raycse.machine import describe

    return f"{describe()} | torch {torch.__version__} | threads {torch.get_num_threads()}"


def _time(fn, reps: int = 3) -> float:
    fn()  # warm-up (first-call kernel selection, allocations)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _probe() -> dict:
    """Seconds of a BERT-shaped float32 linear (2048 tokens, 384 -> 1536), forward + backward, both ways."""
    def tensors():
        g = torch.Generator().manual_seed(0)
        return (torch.randn(2048, 384, generator=g, requires_grad=True),
                torch.randn(1536, 384, generator=g, requires_grad=True), torch.zeros(1536, requires_grad=True))

    def step(fn):
        x, w, b = tensors()

        def run():
            out = fn(x, w, b)
            out.backward(torch.ones_like(out))
        return run

    # the first use may come under no_grad / inference mode / autocast (an evaluation): leave them
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast("cpu", enabled=False):
        default = _time(step(F.linear))
        onednn = _time(step(_Linear.apply))
    return {"default_s": default, "onednn_s": onednn}


def choice() -> dict:
    """Whether float32 CPU linears go to oneDNN here: {"onednn": bool, "why": str}; the environment's
    RAYCSE_ONEDNN is read at every call, the probe runs once per machine."""
    forced = os.environ.get("RAYCSE_ONEDNN", "").strip()
    if forced == "0":
        return {"onednn": False, "why": "RAYCSE_ONEDNN=0"}
    if not op_works():
        return {"onednn": False, "why": "oneDNN's linear op is not available in this PyTorch"}
    if forced == "1":
        return {"onednn": True, "why": "RAYCSE_ONEDNN=1"}
    return _probed(_probe_key())


@functools.lru_cache(maxsize=4)
def _probed(key: str) -> dict:
    from raycse.machine import read_json_cache, write_json_cache

    path = _cache_file()
    cache = read_json_cache(path)
    if key not in cache:
        cache[key] = _probe()
        write_json_cache(path, cache)
    m = cache[key]
    ratio = m["default_s"] / m["onednn_s"]
    use = ratio > 1.05  # only a clear win changes kernels
    return {"onednn": use, "why": f"probed: oneDNN {ratio:.2f}x PyTorch's default on a BERT-shaped fp32 linear"}


@functools.lru_cache(maxsize=1)
def op_works() -> bool:
    """oneDNN's op is PyTorch-internal (inductor uses it): check once that it exists and agrees with
    ``F.linear``, so a PyTorch without it, or with another signature, just keeps its own kernels."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    try:
        # in float32 whatever the caller's context (the first call may come under autocast)
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            x, w, b = torch.randn(3, 4, 8), torch.randn(5, 8), torch.randn(5)
            return bool(torch.allclose(_inner(x, w, b), F.linear(x, w, b), atol=1e-5, rtol=1e-5))
    except Exception:  # noqa: BLE001 - any failure means: do not use it
        return False


def _eligible(tensors: tuple) -> bool:
    return not torch.is_autocast_enabled("cpu") and all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.layout == torch.strided for t in tensors)


def _inner(a: Tensor, b: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``a @ b.T (+ bias)`` on oneDNN: a (..., k), b (n, k)."""
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


class _Linear(torch.autograd.Function):
    """``F.linear`` with the forward and the backward products on oneDNN (same maths)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        ctx.save_for_backward(x, weight)
        return _inner(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        flat = grad.reshape(-1, grad.shape[-1])  # (tokens, out)
        grad_x = _inner(grad, weight.t()) if ctx.needs_input_grad[0] else None  # grad @ W
        grad_w = _inner(flat.t(), x.reshape(-1, x.shape[-1]).t()) if ctx.needs_input_grad[1] else None  # grad^T @ x
        grad_b = flat.sum(0) if ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


class _OneDNNLinear(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            tensors = (x, weight) if bias is None else (x, weight, bias)
            if _eligible(tensors):
                if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
                    return _Linear.apply(x, weight, bias)
                return _inner(x, weight, bias)
        return func(*args, **kwargs)


def onednn_linear(enabled: bool = True):
    """Context in which eligible float32 CPU ``F.linear`` calls run on oneDNN (see the module docstring).

    Under CPU autocast nothing is eligible, so the mode (a Python call per torch op) is not entered."""
    if enabled and available() and not torch.is_autocast_enabled("cpu"):
        return _OneDNNLinear()
    return contextlib.nullcontext()
