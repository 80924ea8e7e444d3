"""Unpadded ("packed") forward pass for BERT-family encoders, and a cheaper dropout for CPUs.

A training batch padded to its longest sentence spends a third of its tokens on padding (wiki
text at max length 32; BENCHMARKS.md). Everything in a BERT layer except attention is
position-wise (the Q/K/V and output projections, the feed-forward block, LayerNorm, dropout), so
it can run on the real tokens alone, packed into one ``(tokens, hidden)`` matrix. Only the
attention core needs a per-sentence layout: Q/K/V are gathered into a padded
``(batch, heads, length, head_dim)`` tensor (one ``index_select``; padding slots read some real
row, masked as keys and dropped as queries), attention runs there with the key mask (eager maths
while training with attention dropout, so the dropout can use the mask below;
``scaled_dot_product_attention`` otherwise) and the real rows are gathered back. Padding then
costs two row gathers per layer instead of 12 d^2 multiply-adds per padded token, and the big
matmuls stay big (one call for the whole batch).

The layers used are the model's own modules (``layer.attention.output``, ``layer.intermediate``,
``layer.output``) with its weights, so saving, loading and DDP see an ordinary HF model; the only
code re-done here is the self-attention block, which follows ``BertSelfAttention`` (scaling
1/sqrt(head_dim), dropout on the attention probabilities while training). The result equals the
padded HF forward on every real token (tested to 1e-5, gradients too).

Dropout: on CPU, ``bernoulli_`` draws one 32-bit number per element from a serial generator and
took ~19% of a training step (all-MiniLM-L6-v2, batch 64, bf16). :func:`dropout` takes four 15-bit
draws from each 64-bit word instead, ~4x cheaper for the masks of a BERT layer (BENCHMARKS.md);
the drop probability becomes round(p * 32768) / 32768 (0.1 -> 0.100006) and the kept values are scaled by
the exact inverse of the keep rate, so E[dropout(x)] = x as with ``nn.Dropout``. GPUs keep
PyTorch's own dropout.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raycse.model.onednn import onednn_linear

# Architectures whose layers have BERT's structure (RoBERTa's embeddings derive position ids from
# the padded ids, which is why the embeddings still run on the padded batch).
SUPPORTED_TYPES = ("bert", "roberta", "xlm-roberta")
_LAYER_PARTS = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output",
                "intermediate", "output")


_BITS = 15
# The packed token count is rounded up to a multiple of this with extra rows (copies of position 0,
# dropped at the end; see unpadded_forward).
# Why: oneDNN caches one primitive per matmul shape (up to 1,024); a new token count every batch
# filled that cache step after step and reused none of it (benchmarks/results/speed-cpu.md). A few
# dozen shapes are reused instead, for <= 63 extra rows per matmul.
TOKEN_MULTIPLE = 64


def keep_mask(shape: tuple, p: float, device: torch.device) -> Tensor:
    """Bernoulli(1 - p) keep mask: each random int64 (63 uniform bits) read as four int16 whose
    low 15 bits are the draws."""
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_()  # [0, 2^63)
    draws = words.view(torch.int16)[:n] & ((1 << _BITS) - 1)
    return (draws >= round(p * (1 << _BITS))).view(shape)


class _MaskedScale(torch.autograd.Function):
    """x * keep * scale, keeping only the boolean mask for the backward pass."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout (see the module docstring); ``F.dropout`` off the CPU."""
    if not training or p <= 0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    dropped = round(p * (1 << _BITS))
    if dropped >= 1 << _BITS:
        return torch.zeros_like(x)
    return _MaskedScale.apply(x, keep_mask(tuple(x.shape), p, x.device), (1 << _BITS) / ((1 << _BITS) - dropped))


class FastDropout(nn.Dropout):
    """``nn.Dropout`` with :func:`dropout`'s cheaper mask (same p, same train/eval behaviour)."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


def use_fast_dropout(model: nn.Module) -> int:
    """Swap every plain ``nn.Dropout`` in ``model`` for :class:`FastDropout`; returns how many.

    Dropout has no weights, so saved models are unchanged."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                setattr(parent, name, FastDropout(child.p, child.inplace))
                swapped += 1
    return swapped


def supports_unpadding(backbone: nn.Module) -> bool:
    """True for an encoder-only BERT/RoBERTa-style model with absolute positions."""
    cfg = getattr(backbone, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED_TYPES:
        return False
    if getattr(cfg, "is_decoder", False) or getattr(cfg, "add_cross_attention", False):
        return False
    if getattr(cfg, "position_embedding_type", "absolute") != "absolute":
        return False
    layers = getattr(getattr(backbone, "encoder", None), "layer", None)
    if not hasattr(backbone, "embeddings") or not layers:
        return False
    return all(_has(layer, part) for layer in layers for part in _LAYER_PARTS)


def _has(module: nn.Module, dotted: str) -> bool:
    for name in dotted.split("."):
        module = getattr(module, name, None)
        if module is None:
            return False
    return True


def backbone_forward(backbone: nn.Module, input_ids: Tensor, attention_mask: Tensor,
                     token_type_ids: Optional[Tensor] = None, output_hidden_states: bool = False,
                     unpad: bool = False, onednn: bool = False, checkpoint: bool = False):
    """The HF model's output, through :func:`unpadded_forward` when ``unpad`` (same values), with float32
    CPU linears on oneDNN when ``onednn`` (:mod:`raycse.model.onednn`; equal to float32 rounding).
    ``checkpoint``: the unpadded layers' activations recomputed in the backward pass instead of kept (the
    padded path's are, where the model's own gradient checkpointing is enabled)."""
    with onednn_linear(onednn and input_ids.device.type == "cpu"):
        if unpad:
            return unpadded_forward(backbone, input_ids, attention_mask, token_type_ids, output_hidden_states,
                                    checkpoint)
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        return backbone(**kwargs, output_hidden_states=output_hidden_states)


def unpadded_forward(backbone: nn.Module, input_ids: Tensor, attention_mask: Tensor,
                     token_type_ids: Optional[Tensor] = None, output_hidden_states: bool = False,
                     checkpoint: bool = False):
    """The HF model's ``last_hidden_state`` (and ``hidden_states``), computed on real tokens only; with
    ``checkpoint`` (and gradients on), each layer through ``torch.utils.checkpoint`` (non-reentrant, the RNG
    state kept, so dropout draws the same masks when the layer is recomputed: the same gradients).

    Returns a ``BaseModelOutput`` whose tensors have the usual padded ``(batch, length, hidden)``
    shape, zeros at padded positions (poolers mask them anyway).
    """
    from transformers.modeling_outputs import BaseModelOutput

    batch, length = input_ids.shape
    flat_mask = attention_mask.reshape(-1)
    keep = flat_mask.nonzero().squeeze(1)  # flat positions of real tokens
    real = keep.numel()
    key_mask = attention_mask.bool()[:, None, None, :]
    # Packed rows = the real tokens, then up to TOKEN_MULTIPLE - 1 extra rows that repeat position 0:
    # position-wise layers keep them finite, attention never reads them, and they are dropped at the end.
    rows = F.pad(keep, (0, -real % TOKEN_MULTIPLE))
    # Packed row read by each padded-layout position. Padding reads a real token's row (finite values;
    # as a key it is masked, as a query its output is dropped), so no zero fill and scatter per layer.
    slot = (flat_mask.cumsum(0) - 1).clamp_(min=0)

    def padded(x: Tensor) -> Tensor:  # packed rows -> padded layout, zeros at padding (returned states)
        return x.new_zeros(batch * length, x.shape[-1]).index_copy(0, keep, x[:real]).view(batch, length, -1)

    # Embeddings on the padded batch (cheap, and model-specific position ids stay the model's own).
    x = backbone.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
    x = x.reshape(batch * length, -1).index_select(0, rows)
    states = [x]
    recompute = checkpoint and torch.is_grad_enabled()
    for layer in backbone.encoder.layer:
        if recompute:
            from torch.utils.checkpoint import checkpoint as recomputed

            x = recomputed(_layer, layer, x, slot, rows, key_mask, batch, length, use_reentrant=False)
        else:
            x = _layer(layer, x, slot, rows, key_mask, batch, length)
        states.append(x)
    return BaseModelOutput(last_hidden_state=padded(x),
                           hidden_states=tuple(padded(s) for s in states) if output_hidden_states else None)


def _layer(layer: nn.Module, x: Tensor, slot: Tensor, rows: Tensor, key_mask: Tensor, batch: int, length: int) -> Tensor:
    attn = layer.attention.self
    heads = attn.num_attention_heads
    head_dim = attn.attention_head_size
    projections = (attn.query, attn.key, attn.value)
    if all(type(p) is nn.Linear for p in projections):  # one fused (tokens, 3h) matmul instead of three
        weight = torch.cat([p.weight for p in projections])
        bias = torch.cat([p.bias for p in projections]) if attn.query.bias is not None else None
        qkv = F.linear(x, weight, bias)
    else:  # wrapped projections (LoRA's W x + (alpha / r) B A x) run as their modules: their weight alone is W
        qkv = torch.cat([p(x) for p in projections], dim=-1)
    qkv = qkv.index_select(0, slot)  # packed -> padded layout
    qkv = qkv.view(batch, length, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
    scale = getattr(attn, "scaling", head_dim ** -0.5)
    p = attn.dropout.p if attn.training else 0.0
    if p > 0:  # BertSelfAttention's eager maths, so the attention dropout can use the cheaper mask
        scores = torch.matmul(qkv[0], qkv[1].transpose(-1, -2)).mul_(scale).masked_fill_(~key_mask, float("-inf"))
        context = torch.matmul(dropout(scores.softmax(-1), p), qkv[2])
    else:
        context = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=key_mask, scale=scale)
    context = context.transpose(1, 2).reshape(batch * length, heads * head_dim).index_select(0, rows)
    hidden = layer.attention.output(context, x)  # dense + dropout + residual LayerNorm
    return layer.output(layer.intermediate(hidden), hidden)
