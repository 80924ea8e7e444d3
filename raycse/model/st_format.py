"""The sentence-transformers directory format: what raycse reads of a model's modules and writes back.

A sentence-transformers model is a list of modules (``modules.json``): a Transformer, a Pooling,
then optional Dense layers and a Normalize. raycse trains the Transformer and pools it the way the
model declares; the Dense layers it keeps, frozen, after the pooling (they are part of the
embedding); Normalize it applies at inference (every objective scores by cosine, which is blind to
it). Saving writes them back with the model's prompts and similarity function, so
``SentenceTransformer(path).encode`` gives raycse's embeddings. Prompts are applied as
sentence-transformers applies them: the text prepended to each sentence. A module raycse cannot
reproduce is refused in one line, never silently dropped.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from raycse.errors import ModelError
from raycse.platform.object_store import plain_relative

# sentence-transformers' Pooling config keys (its legacy form, which every version reads) and raycse's names
POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
KNOWN_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")


@dataclass
class DenseSpec:
    path: str
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a torch.nn class path, e.g. torch.nn.modules.activation.Tanh


@dataclass
class Layout:
    """What a model directory's sentence-transformers files declare (all empty for a plain HF model)."""

    transformer_dir: str = ""
    pooling: Optional[str] = None
    dense: list[DenseSpec] = field(default_factory=list)
    normalize: bool = False
    st_config: dict = field(default_factory=dict)  # prompts, default_prompt_name, similarity_fn_name
    include_prompt: bool = True  # False: the Pooling leaves a prompt's tokens out (raycse refuses prompts then)


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {path} ({type(exc).__name__}); copy or save the model again") from None


def _inside(root: Path, rel: str, what: str) -> str:
    """``rel`` as a folder of the model ("" is the model itself; a modules.json from someone else may
    point anywhere)."""
    if rel and not plain_relative(rel):
        raise ModelError(f"{root / 'modules.json'} puts its {what} module at {rel!r}, outside the model directory")
    return rel


def pooling_of(cfg: dict, where: Path) -> str:
    """raycse's name for a Pooling config's one mode (new ``pooling_mode`` key or the legacy booleans)."""
    mode = cfg.get("pooling_mode")
    modes = ([mode] if isinstance(mode, str) else list(mode)) if mode is not None else \
        [name for key, name in POOLING_KEYS.items() if cfg.get(key)]
    if len(modes) != 1 or modes[0] not in POOLING_KEYS.values():
        raise ModelError(f"{where} asks for pooling {modes or 'none'}; raycse supports exactly one of "
                         f"{', '.join(POOLING_KEYS.values())}: pass --pooling to choose one")
    return modes[0]


def activation(name: str, where: Path) -> nn.Module:
    """A Dense layer's activation: a torch.nn module class only (sentence-transformers' own trust rule)."""
    cls = getattr(nn, name.rsplit(".", 1)[-1], None) if name.startswith("torch.nn.") else None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ModelError(f"{where} uses activation {name!r}; raycse loads only torch.nn activations")
    return cls()


def _on_sentence_embedding(cfg: dict, where: Path) -> None:
    """A Dense or Normalize must read and write the sentence embedding (ST 6 lets a module read or write
    any feature, which raycse's pooled embedding does not hold)."""
    for key in ("module_input_name", "module_output_name"):
        if cfg.get(key) not in (None, "sentence_embedding"):
            raise ModelError(f"{where} has {key} {cfg[key]!r}, not the sentence embedding; raycse cannot "
                             f"reproduce it")


def _dense(root: Path, rel: str) -> DenseSpec:
    cfg = _json(root / rel / "config.json")
    _on_sentence_embedding(cfg, root / rel)
    if cfg.get("use_residual"):
        raise ModelError(f"{root / rel} adds a residual connection (use_residual), which raycse cannot reproduce; "
                         f"use the model without that Dense")
    if not (root / rel / "model.safetensors").is_file():
        raise ModelError(f"{root / rel} has no model.safetensors (raycse does not unpickle pytorch_model.bin): "
                         f"save the model again with safe_serialization")
    name = cfg.get("activation_function", "torch.nn.modules.activation.Tanh")
    activation(name, root / rel / "config.json")
    spec = DenseSpec(rel, int(cfg["in_features"]), int(cfg["out_features"]), bool(cfg.get("bias", True)), name)
    # the shape from the weights' header, before a layer of the config's size is allocated (a config
    # from someone else may ask for any size)
    from safetensors import safe_open

    with safe_open(str(root / rel / "model.safetensors"), "pt") as weights:
        shape = (list(weights.get_slice("linear.weight").get_shape())
                 if "linear.weight" in weights.keys() else None)
    if shape != [spec.out_features, spec.in_features]:
        raise ModelError(f"{root / rel} declares {spec.in_features} -> {spec.out_features} features but its "
                         f"weights hold {shape or 'no linear.weight'}; copy or save the model again")
    return spec


def _st_config(cfg: dict, where: Path) -> dict:
    """The prompts, default prompt and similarity of ``config_sentence_transformers.json`` (checked:
    the file may come from someone else)."""
    out = {k: cfg[k] for k in ("prompts", "default_prompt_name", "similarity_fn_name") if k in cfg}
    prompts = out.get("prompts") or {}
    if not (isinstance(prompts, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items())):
        raise ModelError(f"{where} has prompts that are not a mapping of name to text; fix or drop them")
    default = out.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ModelError(f"{where} names the default prompt {default!r}, which its prompts ({', '.join(prompts) or 'none'}) "
                         f"lack; set default_prompt_name to one of them or to null")
    return out


def read_layout(root: Path, head_path: Optional[str] = None) -> Layout:
    """The layout of a model directory; ``head_path``: the Dense that is raycse's own MLP head."""
    layout = Layout()
    if (root / "config_sentence_transformers.json").is_file():
        layout.st_config = _st_config(_json(root / "config_sentence_transformers.json"),
                                      root / "config_sentence_transformers.json")
    if not (root / "modules.json").is_file():
        return layout
    modules = _json(root / "modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelError(f"{root / 'modules.json'} is not a list of modules; copy or save the model again")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    unknown = [m.get("type") for m, k in zip(modules, kinds) if k not in KNOWN_MODULES]
    if unknown or kinds[:1] != ["Transformer"] or kinds.count("Transformer") != 1 or kinds.count("Pooling") > 1:
        raise ModelError(f"{root / 'modules.json'} lists {', '.join(kinds)}; raycse supports Transformer, Pooling, "
                         f"then Dense and Normalize" + (f" (not {unknown[0]})" if unknown else ""))
    for m, kind in zip(modules, kinds):
        rel = _inside(root, str(m.get("path", "")), kind)
        if kind == "Transformer":
            layout.transformer_dir = rel
        elif kind == "Pooling":
            pooling = _json(root / rel / "config.json")
            layout.pooling = pooling_of(pooling, root / rel / "config.json")
            layout.include_prompt = bool(pooling.get("include_prompt", True))
        elif kind == "Normalize":
            if (root / rel / "config.json").is_file():
                _on_sentence_embedding(_json(root / rel / "config.json"), root / rel)
            layout.normalize = True
        elif layout.normalize:
            raise ModelError(f"{root / 'modules.json'} has a Dense after Normalize; raycse normalizes last")
        elif rel != head_path:
            layout.dense.append(_dense(root, rel))
    return layout


class FrozenDense(nn.Module):
    """A sentence-transformers Dense module, frozen: Linear + activation on the sentence embedding."""

    def __init__(self, spec: DenseSpec, root: Path):
        super().__init__()
        from safetensors.torch import load_file

        self.spec = spec
        self.linear = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
        self.activation = activation(spec.activation, root)
        state = load_file(str(root / spec.path / "model.safetensors"))
        try:
            self.linear.load_state_dict({k.split(".", 1)[1]: v for k, v in state.items() if k.startswith("linear.")})
        except RuntimeError as exc:
            raise ModelError(f"{root / spec.path} weights do not match its config: {str(exc).splitlines()[0]}") from None
        self.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.linear(x))


def st_modules():
    """sentence-transformers' module classes where ST 6 keeps them (``sentence_transformers.models`` is
    its deprecated alias, which a later release may drop)."""
    from sentence_transformers.sentence_transformer import modules

    return modules


@contextmanager
def quiet_libraries():
    """Loading and saving print no progress bars or INFO lines of the libraries (a checkpoint is saved every few
    steps; ``raycse eval`` and ``export`` load models on the user's terminal, where a "Loading weights" bar
    says nothing raycse's own lines do not)."""
    import logging

    from transformers.utils import logging as hf_logging

    st_logger = logging.getLogger("sentence_transformers")
    level, bars = st_logger.level, hf_logging.is_progress_bar_enabled()
    st_logger.setLevel(max(level, logging.WARNING))
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        st_logger.setLevel(level)
        if bars:
            hf_logging.enable_progress_bar()


def save_modules(path: Path, body: Path, *, pooling: str, include_prompt: bool, dense: list[tuple[nn.Linear, str]],
                 normalize: bool, st_config: dict, max_seq_length: int, trust_remote_code: bool) -> list[str]:
    """Write ``path`` through sentence-transformers' own classes: a Transformer loaded from ``body`` (an HF
    model directory raycse wrote), a Pooling, each ``(linear, activation class path)`` as a Dense, a
    Normalize, saved by ``SentenceTransformer(modules=...).save``, so modules.json and every module's
    config carry the names and format of the installed release. Returns each module's folder. (Callers
    wrap it in :func:`quiet_libraries`.)"""
    from sentence_transformers import SentenceTransformer

    m = st_modules()
    trust = {"trust_remote_code": True} if trust_remote_code else {}
    body_module = m.Transformer(str(body), max_seq_length=int(max_seq_length), model_kwargs=dict(trust),
                                processor_kwargs=dict(trust), config_kwargs=dict(trust))
    dim = body_module.get_embedding_dimension()
    modules = [body_module, m.Pooling(dim, pooling_mode="cls" if pooling == "cls_before_pooler" else pooling,
                                      include_prompt=include_prompt)]
    for linear, name in dense:
        weight = linear.weight.detach().cpu().clone()
        bias = linear.bias.detach().cpu().clone() if linear.bias is not None else None
        modules.append(m.Dense(linear.in_features, linear.out_features, bias=bias is not None,
                               activation_function=activation(name, path), init_weight=weight, init_bias=bias))
    if normalize:
        modules.append(m.Normalize())
    model = SentenceTransformer(modules=modules, device="cpu",
                                similarity_fn_name=st_config.get("similarity_fn_name") or "cosine")
    # the model's own prompts, as they were (the constructor would add empty query/document ones)
    model.prompts = dict(st_config.get("prompts") or {})
    model.default_prompt_name = st_config.get("default_prompt_name")
    model.save(str(path), create_model_card=False)  # raycse writes the card (raycse.model.card)
    return [str(entry["path"]) for entry in _json(path / "modules.json")]
