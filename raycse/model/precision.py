"""Which autocast dtype a precision setting means on a device: the encoder's floor, used by the
training loop, evaluation and the grouping's embedding actors alike."""

from __future__ import annotations

import contextlib
from typing import Optional

import torch


def cpu_supports_bf16() -> bool:
    check = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool((check and check()) or (amx and amx()))


def resolve_precision(precision: str, device: torch.device) -> Optional[torch.dtype]:
    """The autocast dtype for a precision setting (None = plain fp32)."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16 if device.type == "cuda" else torch.bfloat16
    # auto
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_supports_bf16() else None


def autocast(device: torch.device, dtype: Optional[torch.dtype]):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
