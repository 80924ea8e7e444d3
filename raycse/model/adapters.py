"""LoRA adapters on the encoder's backbone, through peft (``model.lora``; extra ``raycse[peft]``).

Hu et al. 2021: each targeted linear map W x becomes W x + (alpha / r) B A x, with W frozen and only
A (r x in) and B (out x r, zero at the start) trained. peft builds, trains and merges the adapters;
this module checks the settings, wraps the backbone, and writes what a run outputs: the merged
backbone (W + (alpha / r) B A, a plain Hugging Face model sentence-transformers loads) and the
adapter alone (``adapter/``, for ``peft.PeftModel.from_pretrained``).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from raycse.errors import ConfigError

if TYPE_CHECKING:  # (the config checks its settings here without importing torch)
    from torch import nn

ADAPTER_DIR = "adapter"  # beside the merged model's files in a saved model directory
KEYS = {"r": 8, "alpha": None, "dropout": 0.0, "target_modules": None}  # alpha None: 2 r; targets None: peft's


def lora_settings(spec: dict) -> dict:
    """``model.lora`` with its defaults filled in, or a :class:`ConfigError` naming the bad entry."""
    unknown = [k for k in spec if k not in KEYS]
    if unknown:
        raise ConfigError(f"model.lora has {unknown[0]!r}; its keys are {', '.join(KEYS)}")
    out = {**KEYS, **spec}
    r, alpha, dropout, targets = out["r"], out["alpha"], out["dropout"], out["target_modules"]
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ConfigError(f"model.lora.r must be a whole number >= 1 (the adapters' rank), got {r!r}")
    if alpha is None:
        out["alpha"] = alpha = 2 * r
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise ConfigError(f"model.lora.alpha must be a number > 0 (the update is scaled by alpha / r), got {alpha!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ConfigError(f"model.lora.dropout must be in [0, 1), got {dropout!r}")
    if isinstance(targets, str):
        out["target_modules"] = targets = [t.strip() for t in targets.split(",") if t.strip()]
    if targets is not None and (not targets or not all(isinstance(t, str) and t for t in targets)):
        raise ConfigError(f"model.lora.target_modules must name modules, e.g. [query, value], got {targets!r}")
    return out


def _peft():
    try:
        import peft
    except ImportError:
        raise ConfigError("model.lora needs peft: pip install 'raycse[peft]'") from None
    return peft


def add_lora(backbone: nn.Module, spec: dict) -> nn.Module:
    """The backbone wrapped by peft: its own weights frozen, LoRA adapters on the target modules."""
    peft = _peft()
    s = lora_settings(spec)
    # never the HF pooler (BERT's dense+tanh): it feeds no raycse embedding, so its adapters would get no
    # gradient (and DDP refuses parameters that get none)
    config = peft.LoraConfig(r=s["r"], lora_alpha=s["alpha"], lora_dropout=float(s["dropout"]),
                             target_modules=s["target_modules"], exclude_modules=r".*pooler.*", bias="none")
    try:
        with warnings.catch_warnings():  # peft 0.21 asks transformers 5 a name it deprecated: not the user's to fix
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            return peft.get_peft_model(backbone, config)
    except ValueError as exc:  # e.g. target modules the model lacks
        raise ConfigError(f"model.lora: {str(exc).splitlines()[0]}") from None


def is_lora(backbone: nn.Module) -> bool:
    return type(backbone).__module__.startswith("peft.")


def merged(backbone: nn.Module) -> nn.Module:
    """A plain copy of the backbone with the adapters folded into its weights (peft's merge); the
    training model keeps its frozen weights and adapters untouched."""
    return copy.deepcopy(backbone).merge_and_unload() if is_lora(backbone) else backbone


def save_adapter(backbone: nn.Module, path: Path) -> None:
    """The adapter alone (adapter_config.json, adapter_model.safetensors) under ``path/adapter``."""
    if is_lora(backbone):
        backbone.save_pretrained(path / ADAPTER_DIR, safe_serialization=True)


def trainable_line(module: nn.Module, backbone: nn.Module) -> str:
    """What trains: the count of trainable parameters against all, and with LoRA, the adapters'
    settings (as peft holds them) and their share."""
    total = sum(p.numel() for p in module.parameters())
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    line = f"trainable parameters: {trainable:,} of {total:,} ({100 * trainable / max(total, 1):.2f}%)"
    if not is_lora(backbone):
        return line
    config = backbone.peft_config["default"]
    adapters = sum(p.numel() for n, p in backbone.named_parameters() if "lora_" in n)
    heads = trainable - adapters
    return (f"{line}; LoRA r={config.r} alpha={config.lora_alpha:g} on {', '.join(sorted(config.target_modules))}: "
            f"{adapters:,} in the adapters" + (f", {heads:,} in the training heads" if heads else ""))
