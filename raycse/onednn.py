"""fp32 linear layers through oneDNN for CPU inference, where MKL's sgemm is the slow path.

PyTorch sends a float32 ``F.linear`` on the CPU to MKL's sgemm. On this project's 2-core AMD EPYC VM
(AVX-512; MKL is known to pick generic code paths on non-Intel CPUs) it reaches 140-190 GFLOP/s on BERT's shapes, while
oneDNN's inner product (already bundled with PyTorch, and what bf16 autocast uses anyway) reaches
320-420 GFLOP/s on the same float32 inputs, agreeing to float32 rounding (relative difference
~1e-6; ``benchmarks/eval_speed.py`` prints both).

:func:`onednn_linear` is a ``TorchFunctionMode`` that reroutes ``F.linear`` to oneDNN when nothing
needs its gradient (oneDNN's op has no backward), everything is float32 on the CPU and autocast is
off (under autocast the usual path already goes through oneDNN in bf16). Everything else, and every
other op, runs as usual, so any Hugging Face architecture can be wrapped. ``RAYCSE_ONEDNN=0`` in the
environment turns it off (PyTorch's default kernels everywhere).
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


def available() -> bool:
    if os.environ.get("RAYCSE_ONEDNN", "1").strip() == "0":
        return False
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _eligible(tensors: tuple) -> bool:
    if torch.is_autocast_enabled("cpu"):
        return False
    grad = torch.is_grad_enabled()
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.layout == torch.strided
               and not (grad and t.requires_grad) for t in tensors)


class _OneDNNLinear(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if _eligible((x, weight) if bias is None else (x, weight, bias)):
                return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        return func(*args, **kwargs)


def onednn_linear(enabled: bool = True):
    """Context in which eligible float32 CPU ``F.linear`` calls run on oneDNN (see the module docstring)."""
    if not (enabled and available()) or torch.is_grad_enabled():
        return contextlib.nullcontext()
    return _OneDNNLinear()
