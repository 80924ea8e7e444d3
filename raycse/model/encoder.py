"""The encoder: a Hugging Face model plus a pooler and SimCSE's optional MLP head (where a model comes from, and what
is read of it before its weights: raycse.model.loading, whose names are importable from here too).

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
from typing import Iterable, Optional

import numpy as np
import torch
from torch import Tensor, nn

from raycse.errors import ModelError
from raycse.model.loading import (RAYCSE_META, check_max_length, check_tokenizer, empty_backbone, layout_of,
                                  load_dtype, load_failure, read_meta, read_st_meta, resolve_model, st_pooling)
from raycse.model.loading import embedded_model_path  # noqa: F401 - (the path model cards and scripts import it by)
from raycse.model.unpad import backbone_forward, supports_unpadding

# A training column's prompt, by the name sentence-transformers' encode_query / encode_document look for
PROMPT_NAMES = {"text": "query", "pair": "document"}
PROMPT_LEFT_OUT = ("the model's Pooling leaves a prompt's tokens out (include_prompt false), which raycse does not "
                   "do; set include_prompt true in its 1_Pooling/config.json, or use the model without prompts")
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
                        dtype: Optional[str] = None, weights: bool = True,
                        attention: Optional[dict] = None) -> "Encoder":
        """Load any HF encoder or sentence-transformers model (its pooling, Dense and Normalize modules);
        a directory saved by raycse restores its MLP head too. A model's own Python (``auto_map``) runs
        only with ``trust_remote_code``; without it such a model is refused (:func:`check_remote_code`).
        ``backend`` ``onnx`` or ``openvino`` runs the transformer from the folder's exported file
        (``raycse export``; ``onnx_file``: which ``onnx/*.onnx``) under the same pooling and modules
        (:mod:`raycse.model.exported`), for inference only. ``dtype`` (fp32, bf16 or auto: the checkpoint's
        own) loads the weights in it directly; None: the library's default. ``weights`` False: the transformer's
        architecture on the meta device, no weights read (a sharded worker that receives its shards).
        ``attention``: the attention kernels (:func:`raycse.model.loading.attention_kwargs`; None: the library's).

        >>> enc = Encoder.from_pretrained("default")  # the embedded all-MiniLM-L6-v2
        >>> enc.encode(["a sentence"]).shape
        (1, 384)
        """
        from raycse.model.st_format import FrozenDense

        trust = bool(trust_remote_code)
        path = Path(resolve_model(name_or_path, trust))
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        meta = read_meta(path)
        head = meta.get("mlp_module", "2_Dense" if meta.get("mlp_head") == "always" else None)
        layout = layout_of(path)
        body = path / layout.transformer_dir
        meta = {**read_st_meta(body), **meta}
        try:
            tokenizer = AutoTokenizer.from_pretrained(body, trust_remote_code=trust)
        except Exception as exc:
            raise ModelError(f"cannot load model from {body}: {load_failure(exc)}") from None
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
                        backbone = AutoModel.from_pretrained(body, trust_remote_code=trust, **load_dtype(dtype),
                                                             **(attention or {}))
                    else:
                        config = AutoConfig.from_pretrained(body, trust_remote_code=trust)
                        backbone = empty_backbone(config, trust, dtype or "fp32", attention).train(False)
            except Exception as exc:
                raise ModelError(f"cannot load model from {body}: {load_failure(exc)}") from None
        pooling = pooling or meta.get("pooling") or st_pooling(layout.pooling) or "cls"
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


def _default_max_length(backbone: nn.Module, tokenizer) -> int:
    limit = getattr(backbone.config, "max_position_embeddings", 512) or 512
    tok = getattr(tokenizer, "model_max_length", limit) or limit
    return int(min(limit, tok, 512))
