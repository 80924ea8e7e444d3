"""What machine this is: the CPU model and the ISA flags that decide kernel choice. Printed in every
benchmark and in the first line of a training log; keys the cached kernel probe (raycse.model.onednn).
Also faiss, imported without its loader's lines about the ISA builds a wheel lacks."""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
# Caps that make a machine behave like a smaller ISA (an AVX-512 box standing in for an AVX2 one)
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


@functools.lru_cache(maxsize=1)
def cpu_model_and_flags() -> tuple[str, tuple[str, ...]]:
    model, flags = platform.processor() or platform.machine(), ()
    try:
        info = Path("/proc/cpuinfo").read_text()
        model = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        have = next(line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags"))
        flags = tuple(f for f in ISA_FLAGS if f in have)
    except (OSError, StopIteration):
        pass
    return model, flags


def isa_caps() -> dict[str, str]:
    return {k: os.environ[k] for k in ISA_CAPS if os.environ.get(k)}


def describe() -> str:
    """``AMD EPYC ... [avx2 avx512f ...], 2 CPUs`` (+ the ISA caps in force, if any)."""
    model, flags = cpu_model_and_flags()
    caps = isa_caps()
    capped = f", capped by {' '.join(f'{k}={v}' for k, v in caps.items())}" if caps else ""
    return f"{model} [{' '.join(flags) or 'no AVX2'}], {os.cpu_count()} CPUs{capped}"


def import_faiss():
    """The faiss module, imported without its INFO lines: its loader tries a build per ISA flag and logs
    each one the wheel lacks (1.15's wheels hold only the generic one), and older releases log that the
    CPU wheel has no GPU indexes; Ray's workers, logging at INFO, print them as lines that read like
    failures (``ModuleNotFoundError(...)``, ``Failed to load GPU Faiss``)."""
    import logging

    logging.getLogger("faiss").setLevel(logging.WARNING)  # (and so faiss.loader)
    import faiss

    return faiss
