"""A Train worker's memory, estimated before Ray starts, and the run refused where it will not fit.

Each data-parallel worker holds (fp32 weights, AdamW; half of the first three with ``--model-dtype bf16``):
- the weights, 4 bytes a parameter (SG-OPT's frozen copy once more);
- the gradients, 4 bytes a trainable parameter, and DDP's gradient buckets as much again with several workers;
- AdamW's two moments, 8 bytes a trainable parameter;
- the activations autograd keeps between a step's forward and its backward. These are counted, not guessed:
  the model's own forward runs on the meta device (shapes, no memory, no weights) at the run's rows a worker
  (batch x the sentences each example adds) and ``--max-length`` tokens, every token real, and a saved-tensor
  hook adds up what autograd saves (with ``--gradient-checkpointing``: each layer's input, and one layer's
  activations for its recomputation);
- the backward's working memory: :data:`WORKING_LAYERS` layers' activations (one more under checkpointing,
  the layer being recomputed), and the optimizer step's: :data:`STEP_COPIES` fp32 copies of the trainable
  parameters (AdamW's temporaries beside the gradients and moments), as measured
  (benchmarks/results/speed-cpu.md, "Memory estimate": within 25% of the measured peak for MiniLM and a
  150M-parameter Qwen3, with and without checkpointing).

Sharded (``--sharding fsdp``, N workers): the weights, gradients and AdamW state above are each 1/N a worker, plus
what FSDP2 holds whole while it computes: the root group (embeddings, heads: everything outside the transformer
blocks) through the step, and two blocks' weights (the one running and the next, gathered ahead) and one block's
gradients before they are reduce-scattered. With ``train.fsdp_offload: cpu`` on GPUs, the shards and AdamW live in
host memory and only what is held whole counts against the GPU.

Tokens at full length make it an upper bound where sentences are shorter (raycse's unpadded BERT layers keep
only real tokens).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from raycse.config import RunConfig
from raycse.errors import ConfigError

WORKING_LAYERS = 2
STEP_COPIES = 2
GB = 1 << 30


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a worker holds, by part; ``rows`` x ``tokens``: the activations' shape."""

    params: int
    trainable: int
    weights: int
    gradients: int
    optimizer: int
    activations: int
    rows: int
    tokens: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations

    def breakdown(self) -> str:
        parts = (("weights", self.weights), ("gradients", self.gradients), ("AdamW", self.optimizer),
                 (f"activations of {self.rows} x {self.tokens} tokens", self.activations))  # (AdamW: moments and step)
        return ", ".join(f"{what} {size / GB:.2f}" for what, size in parts)


def rows_per_worker(run: RunConfig) -> int:
    """Sentences a worker encodes with gradients at once: two views of each sentence, or the pair's two
    sentences, and each hard negative; under GradCache, one chunk."""
    t = run.train
    negatives = max(len(d.negative_columns) if d.negative_column else 0  # (a mixture: its widest source's)
                    for d in [s.data for s in run.source_runs().values()] or [run.data])
    return t.cache_chunk_size if t.cache_chunk_size is not None else t.batch_size * (2 + negatives)


def estimate(run: RunConfig, model_path: str) -> Optional[MemoryEstimate]:
    """A worker's memory for ``run`` (resolved) on the model at ``model_path``; None where the model cannot be
    built on the meta device here (a hub name not in the cache, a model of its own code)."""
    from raycse.model.loading import empty_backbone_of

    # (eager attention keeps each layer's attention weights, batch x heads x length^2; SDPA and flash attention none)
    eager = {"attn_implementation": "eager"} if run.model.attention == "eager" else None
    backbone = empty_backbone_of(model_path, eager)
    if backbone is None:
        return None
    params = sum(p.numel() for p in backbone.parameters())
    layers = int(getattr(backbone.config, "num_hidden_layers", 0) or 0)
    rows, tokens = rows_per_worker(run), run.model.max_length
    full = _saved_bytes(backbone, rows, tokens, keeps_attention(run, backbone))
    if full is None:
        return None
    per_layer = full // layers if layers else full
    working, kept = WORKING_LAYERS * per_layer, full
    if run.train.gradient_checkpointing and layers:
        # each layer keeps its input alone (the embeddings' output and every layer's: layers + 1 hidden states),
        # and the layer being recomputed holds its own activations once more
        hidden = int(getattr(backbone.config, "hidden_size", 0) or 0)
        kept = 4 * rows * tokens * hidden * (layers + 1) + per_layer
    trainable = _trainable(backbone, run)
    frozen = params if run.objective.name == "sgopt" else 0
    t = run.train
    if t.sharding == "fsdp":
        return _sharded(run, backbone, params, frozen, trainable, kept + working, rows, tokens)
    buckets = 2 if t.num_workers > 1 else 1
    b = weight_bytes(run, backbone.config)
    return MemoryEstimate(params=params, trainable=trainable, weights=b * (params + frozen),
                          gradients=b * trainable * buckets, optimizer=(2 + STEP_COPIES) * b * trainable,
                          activations=kept + working,
                          rows=rows, tokens=tokens)


def _sharded(run: RunConfig, backbone, params: int, frozen: int, trainable: int, activations: int, rows: int,
             tokens: int) -> MemoryEstimate:
    """A sharded worker's part (module docstring): 1/N of each, and what FSDP2 holds whole while it computes."""
    from raycse.train.sharding import blocks

    t, n, b = run.train, run.train.num_workers, weight_bytes(run, backbone.config)
    sizes = [sum(p.numel() for p in b.parameters()) for b in blocks(backbone)] or [params]
    block, root = max(sizes), params - sum(sizes)
    held = b * ((params + frozen) // n), b * (trainable // n), (2 + STEP_COPIES) * b * (trainable // n)
    if t.fsdp_offload == "cpu" and t.use_gpu:  # (in host memory)
        held = (0, 0, 0)
    return MemoryEstimate(params=params, trainable=trainable, weights=held[0] + b * (root + 2 * block),
                          gradients=held[1] + b * block, optimizer=held[2], activations=activations,
                          rows=rows, tokens=tokens)


def weight_bytes(run: RunConfig, config) -> int:
    """Bytes a weight (and its gradient, and each AdamW moment: kept in the weight's dtype) takes: 2 where the model
    loads in bf16 (model.dtype bf16, or auto on a checkpoint stored in 16 bits), else 4."""
    stored = str(getattr(config, "dtype", None) or "")  # (transformers >= 5: torch_dtype only warns)
    half = run.model.dtype == "bf16" or (run.model.dtype == "auto" and stored.endswith(("bfloat16", "float16")))
    return 2 if half else 4


def _trainable(backbone, run: RunConfig) -> int:
    if not run.model.lora:
        return sum(p.numel() for n, p in backbone.named_parameters() if not n.startswith("pooler."))
    from raycse.model.adapters import add_lora

    wrapped = add_lora(backbone, run.model.lora)
    return sum(p.numel() for p in wrapped.parameters() if p.requires_grad)


def keeps_attention(run: RunConfig, backbone) -> bool:
    """Whether the run's attention keeps its weights (batch x heads x length^2 a layer) for the backward: eager
    attention does, and so does attention with dropout on CPUs (PyTorch's SDPA falls back to its plain softmax there,
    as raycse's unpadded BERT layers draw their dropout on the weights); SDPA's fused kernels and flash attention keep
    none (the meta device's SDPA, a plain softmax, would count them all the same)."""
    config = backbone.config
    dropout = getattr(config, "attention_probs_dropout_prob", None) or getattr(config, "attention_dropout", 0.0)
    return run.model.attention == "eager" or (not run.train.use_gpu and float(dropout or 0.0) > 0)


def _saved_bytes(backbone, rows: int, tokens: int, attention: bool = True) -> Optional[int]:
    """What autograd keeps in one training forward of ``backbone`` (on the meta device) at ``rows`` x ``tokens``:
    each saved tensor once (a tensor, or the tensor it is a view of, saved by several ops is held once), the
    parameters left out (they are the weights, counted as such); ``attention`` False: without the attention
    weights (:func:`keeps_attention`). Where the model's own code refuses the meta device (transformers 5.0's
    rotary embeddings ask autocast about it), the same forward runs on fake CPU tensors (shapes without memory)
    instead."""
    import torch

    found = _forward_saved(backbone, torch.zeros(rows, tokens, dtype=torch.long, device="meta"), attention)
    return found if found is not None else fake_saved_bytes(backbone.config, rows, tokens, attention)


def fake_saved_bytes(config, rows: int, tokens: int, attention: bool = True) -> Optional[int]:
    """:func:`_saved_bytes` of the model of ``config`` built and run on fake CPU tensors; None where this torch has
    none or the model cannot be built from its config here."""
    import torch
    from transformers import AutoModel

    from raycse.platform import compat

    fake = compat.fake_tensor_mode()
    if fake is None:
        return None
    with fake:
        try:
            twin = AutoModel.from_config(config, trust_remote_code=False)
        except Exception:  # noqa: BLE001 - a model of its own classes: no estimate
            return None
        return _forward_saved(twin, torch.zeros(rows, tokens, dtype=torch.long), attention)


def _forward_saved(backbone, ids, attention: bool = True) -> Optional[int]:
    """Bytes autograd saves in ``backbone``'s training forward of ``ids`` (see :func:`_saved_bytes`); None where
    the forward fails on tensors without values."""
    import torch

    params = {id(p) for p in backbone.parameters()}
    held: dict = {}
    tokens = ids.shape[-1]

    def pack(t):
        base = t._base if t._base is not None else t
        weights = base.dim() == 4 and tuple(base.shape[-2:]) == (tokens, tokens)  # (batch, heads, query, key)
        if id(base) not in params and (attention or not weights):
            held[id(base)] = max(held.get(id(base), 0), base.numel() * base.element_size())
        return t

    backbone.train()
    try:  # (no attention mask: every token real; a mask's checks read values, which meta tensors have none of)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            backbone(input_ids=ids)
    except Exception:  # noqa: BLE001 - a model whose forward needs real values: no estimate
        return None
    return sum(held.values())


def worker_memory(run: RunConfig) -> Optional[tuple[int, str]]:
    """(bytes, what they are) a worker may use, where this machine's private Ray runs the workers: its GPU's memory
    times the worker's share of it, or its memory shared by the workers; None on a cluster (RAY_ADDRESS), whose
    nodes are not known before Ray starts."""
    import torch

    t = run.train
    if os.environ.get("RAY_ADDRESS"):
        return None
    if t.use_gpu and torch.cuda.is_available():
        share = t.gpu_share or 1.0
        total = torch.cuda.get_device_properties(0).total_memory
        return int(total * min(share, 1.0)), f"{min(share, 1.0):g} of a {total / GB:.0f} GB GPU"
    total = host_memory()
    if total is None:
        return None
    return total // t.num_workers, f"this machine's {total / GB:.0f} GB shared by {t.num_workers} worker(s)"


def host_memory() -> Optional[int]:
    """This machine's memory in bytes, where its private Ray runs the workers; None on a cluster (RAY_ADDRESS)."""
    if os.environ.get("RAY_ADDRESS"):
        return None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(run: RunConfig, model_path: str) -> Optional[MemoryEstimate]:
    """Refuse, in one line and before Ray starts, a run whose workers will not fit their memory (train.memory_check
    false skips it); the estimate (None where there is none)."""
    if not run.train.memory_check:
        return None
    found = estimate(run, model_path)
    room = worker_memory(run) if found is not None else None
    if found is None or room is None or found.total <= room[0]:
        return found
    t, fixes = run.train, []
    if t.sharding != "fsdp":
        fixes.append("--sharding fsdp" + (" on 2 or more workers" if t.num_workers == 1 else ""))
    if not t.gradient_checkpointing:
        fixes.append("--gradient-checkpointing")
    if not run.model.lora:
        fixes.append("LoRA (--lora '{r: 8}')")
    if t.cache_chunk_size is None:
        fixes.append("GradCache (--set train.cache_chunk_size=32)")
    fixes += ["a smaller --batch-size or --max-length"] + (["fewer --num-workers"] if not t.use_gpu
                                                             and t.num_workers > 1 else [])
    raise ConfigError(f"each worker needs about {found.total / GB:.1f} GB ({found.breakdown()} GB) and has "
                      f"{room[0] / GB:.1f} GB ({room[1]}); try {', '.join(fixes)} (or --set train.memory_check=false "
                      f"if the estimate is wrong)")
