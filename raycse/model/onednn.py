"""Float32 linear layers on oneDNN on the CPU, where MKL's sgemm is the slow path.

PyTorch sends a float32 ``F.linear`` (and its backward matmuls) on the CPU to MKL's sgemm, which
is known to pick generic code paths on non-Intel CPUs; oneDNN's inner product (bundled with PyTorch,
and what bf16 autocast uses anyway) agrees with it to float32 rounding and was about twice as fast
on BERT's shapes on AMD EPYC (figures: BENCHMARKS.md). Which is faster depends on the CPU, hence the
probe below.

:func:`onednn_linear` is a ``TorchFunctionMode`` that reroutes ``F.linear`` to oneDNN when every
tensor is float32 on the CPU and autocast is off (under autocast the usual path already runs bf16 on
oneDNN). Where nothing needs a gradient (inference) it calls oneDNN's op directly; otherwise
:class:`_Linear` computes the forward and both backward products with it too. Every other op runs
as usual, so any Hugging Face architecture can be wrapped.

Which kernels a machine gets is measured, not assumed: :func:`choice` times BERT-shaped float32
linears (forward and both backward products, three layer shapes) both ways in 7 alternating rounds
once per machine (CPU model, ISA flags and caps, torch version, threads), ~1 s, and caches the verdict
in ``~/.cache/raycse/kernels.json`` (``RAYCSE_CACHE`` moves it) unless its rounds disagree (a busy
machine). ``RAYCSE_ONEDNN=0`` / ``=1`` in the environment forces PyTorch's own
kernels / oneDNN without probing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from raycse.platform import compat


def available() -> bool:
    return choice()["onednn"]


def kernels_note(device: torch.device, *dtypes) -> str:
    """What rank 0's first line says of the choice: ``; fp32 CPU linears on oneDNN (probed: 2.10x PyTorch's
    default)`` where float32 linears run on this CPU (a CPU device, and None, fp32, among the autocast
    ``dtypes`` of training and scoring) and oneDNN was chosen; nothing where PyTorch's default kernels stay
    (:func:`kernels_detail` says why, for the log file) or no choice is made (a GPU, bf16 throughout: no
    probe runs)."""
    kernels = _choice_for(device, dtypes)
    return f"; fp32 CPU linears on oneDNN ({kernels['why']})" if kernels and kernels["onednn"] else ""


def kernels_detail(device: torch.device, *dtypes) -> str:
    """The kernel choice and its reason in full, or "" where no choice is made (as :func:`kernels_note`)."""
    kernels = _choice_for(device, dtypes)
    if kernels is None:
        return ""
    return f"kernel probe: fp32 CPU linears on {'oneDNN' if kernels['onednn'] else 'PyTorch default kernels'} ({kernels['why']})"


def _choice_for(device: torch.device, dtypes) -> Optional[dict]:
    """:func:`choice` where float32 linears run on this CPU; None where no choice is made (no probe)."""
    return choice() if applies(device, *dtypes) else None


def _cache_file() -> Path:
    from raycse.platform.caches import cache_dir

    return cache_dir() / "kernels.json"


def _probe_key() -> str:
    from raycse.platform.machine import describe

    return f"{describe()} | torch {torch.__version__} | threads {torch.get_num_threads()}"


# BERT-base-like layer shapes at 2,048 tokens (in -> out): attention projection, FFN up, FFN down
PROBE_SHAPES = ((384, 384), (384, 1536), (1536, 384))
PROBE_ROUNDS = 7
# a verdict whose rounds disagree this much (max - min over the median ratio) was taken under load:
# used by this process, never cached (a probe taken under load must not decide for later runs)
UNSTEADY_SPREAD = 0.35


def _probe(rounds: int = PROBE_ROUNDS) -> dict:
    """Paired timings of BERT-shaped float32 linears, forward + both backward products, PyTorch's
    default kernels vs oneDNN, alternating in each round so a load change hits both sides alike."""
    def make_layers():
        g = torch.Generator().manual_seed(0)
        return [(torch.randn(2048, i, generator=g, requires_grad=True),
                 torch.randn(o, i, generator=g, requires_grad=True), torch.zeros(o, requires_grad=True))
                for i, o in PROBE_SHAPES]

    def timed(fn) -> float:
        t0 = time.perf_counter()
        for x, w, b in layers:
            out = fn(x, w, b)
            out.backward(torch.ones_like(out))
        return time.perf_counter() - t0

    # the first use may come under no_grad / inference mode / autocast (an evaluation): leave them
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast("cpu", enabled=False):
        layers = make_layers()  # (made here: tensors made under inference mode cannot take part in autograd)
        timed(F.linear), timed(_Linear.apply)  # warm-up: first-call kernel selection, allocations
        pairs = []
        for r in range(rounds):
            if r % 2:
                onednn, default = timed(_Linear.apply), timed(F.linear)
            else:
                default, onednn = timed(F.linear), timed(_Linear.apply)
            pairs.append((default, onednn))
    ratios = sorted(d / o for d, o in pairs)
    return {"default_s": statistics.median(d for d, _ in pairs), "onednn_s": statistics.median(o for _, o in pairs),
            "ratio": statistics.median(ratios), "spread": (ratios[-1] - ratios[0]) / statistics.median(ratios),
            "rounds": rounds}


_PINNED: Optional[dict] = None  # a fit's one choice, while it runs (:func:`pin`)


def choice() -> dict:
    """Whether float32 CPU linears go to oneDNN here: {"onednn": bool, "why": str}; the environment's
    RAYCSE_ONEDNN is read at every call, then the choice :func:`pin` set, else the probe's (once per machine)."""
    forced = os.environ.get("RAYCSE_ONEDNN", "").strip()
    if forced == "0":
        return {"onednn": False, "why": "RAYCSE_ONEDNN=0"}
    if not op_works():
        return {"onednn": False, "why": "oneDNN's linear op is not available in this PyTorch"}
    if forced == "1":
        return {"onednn": True, "why": "RAYCSE_ONEDNN=1"}
    if _PINNED is not None:
        return dict(_PINNED)
    return _probed(_probe_key())


def applies(device: torch.device, *dtypes) -> bool:
    """Whether a choice is made for a model on ``device`` run in the autocast ``dtypes`` (None: float32): float32
    linears on the CPU."""
    return device.type == "cpu" and None in dtypes


def pin(verdict: Optional[dict]) -> None:
    """:func:`choice` answers ``verdict`` in this process (None: the probe's again) until pinned anew; the
    environment's RAYCSE_ONEDNN still comes first. A fit pins one choice for all its ranks
    (raycse.train.kernels)."""
    global _PINNED
    _PINNED = dict(verdict) if verdict is not None else None


def pinned() -> Optional[dict]:
    """The choice :func:`pin` set, or None."""
    return dict(_PINNED) if _PINNED is not None else None


@functools.lru_cache(maxsize=4)
def _probed(key: str) -> dict:
    from raycse.platform.caches import read_json_cache, write_json_cache

    path = _cache_file()
    cache = read_json_cache(path)
    m, note = cache.get(key), ""
    if m is None or "ratio" not in m:  # (records of the older, single-shape probe are measured again)
        m = _probe()
        if m["spread"] <= UNSTEADY_SPREAD:
            write_json_cache(path, {**cache, key: m})
        else:
            note = f"; rounds disagree by {m['spread']:.0%} (a busy machine?): not cached, measured again next time"
    use = m["ratio"] > 1.05  # only a clear win changes kernels
    return {"onednn": use, "why": f"probed: {m['ratio']:.2f}x PyTorch's default{note}"}


_ONEDNN_LINEAR = compat.onednn_linear()  # None where this PyTorch has no oneDNN linear


@functools.lru_cache(maxsize=1)
def op_works() -> bool:
    """oneDNN's op is PyTorch-internal (inductor uses it): check once that it exists and agrees with
    ``F.linear``, so a PyTorch without it, or with another signature, just keeps its own kernels."""
    if _ONEDNN_LINEAR is None:
        return False
    try:
        # in float32 whatever the caller's context (the first call may come under autocast)
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            # a private generator: the global one is the training's dropout stream, saved in checkpoints
            # (this runs lazily, and drawing from it broke exact resumes)
            g = torch.Generator().manual_seed(0)
            x, w, b = torch.randn(3, 4, 8, generator=g), torch.randn(5, 8, generator=g), torch.randn(5, generator=g)
            return bool(torch.allclose(_inner(x, w, b), F.linear(x, w, b), atol=1e-5, rtol=1e-5))
    except Exception:  # noqa: BLE001 - any failure means: do not use it
        return False


def _eligible(tensors: tuple) -> bool:
    return not torch.is_autocast_enabled("cpu") and all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.layout == torch.strided for t in tensors)


def _inner(a: Tensor, b: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``a @ b.T (+ bias)`` on oneDNN: a (..., k), b (n, k)."""
    return _ONEDNN_LINEAR(a, b, bias)


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
