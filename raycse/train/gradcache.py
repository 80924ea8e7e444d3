"""GradCache (Gao, Zhang, Han & Callan, 2021): a large contrastive batch in bounded memory.

``train.cache_chunk_size: N``. The objective runs as usual, but every call it makes to the encoder's
pooled vectors goes through :class:`ChunkedEncoder`:

1. pass 1: the rows of each call are encoded in chunks of N *without a graph*; the RNG state before
   each chunk is recorded; the call returns the concatenated vectors as a leaf that requires grad;
2. the loss is computed on the full batch (cross-worker gathered candidates included) and
   back-propagated: this fills the gradient of every leaf, and of everything the objective computes
   on top of the vectors (the MLP head, CompCSE's projection, a trainable tau, SG-OPT's head and
   regulariser);
3. pass 2: each chunk is encoded again *with a graph*, from its recorded RNG state (same dropout
   masks, same random views), and back-propagated with its slice of the leaf's gradient.

The parameter gradients equal the uncached step's (``tests/test_gradcache.py``, 1e-5); peak
activation memory is that of one chunk. Randomness the objective draws outside encoder calls
happens once, in pass 1. On several workers the step bypasses DDP's forward (its hooks expect one
backward per forward) and averages the gradients itself, which is what DDP does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn


def rng_state() -> tuple:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return torch.get_rng_state(), cuda


def set_rng_state(state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


@dataclass
class Call:
    """One recorded call to ``pooled``: its inputs, each chunk's RNG state, and the leaf it returned."""

    inputs: dict
    bounds: list[tuple[int, int]]
    states: list[tuple]
    leaf: Tensor


class ChunkedEncoder:
    """Stands in for the encoder inside ``objective.forward`` during a cached step."""

    def __init__(self, encoder: nn.Module, chunk: int):
        self._encoder, self._chunk, self.calls = encoder, chunk, []

    def __getattr__(self, name):  # hidden_size, tokenizer, backbone, head, forward_options, ...
        return getattr(self._encoder, name)

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Optional[Tensor] = None) -> Tensor:
        return self._encoder.head(self.pooled(input_ids, attention_mask, token_type_ids))

    def forward(self, *args, **kwargs) -> Tensor:
        return self(*args, **kwargs)

    def pooled(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Optional[Tensor] = None) -> Tensor:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        rows = input_ids.shape[0]
        bounds = [(s, min(s + self._chunk, rows)) for s in range(0, rows, self._chunk)]
        states, parts = [], []
        with torch.no_grad():
            for s, e in bounds:
                states.append(rng_state())
                parts.append(self._encoder.pooled(**{k: v[s:e] for k, v in inputs.items()}))
        leaf = torch.cat(parts).detach().requires_grad_(True)
        self.calls.append(Call(inputs, bounds, states, leaf))
        return leaf


def replay(encoder: nn.Module, calls: list[Call], check: bool = False) -> None:
    """Pass 2: each chunk again with a graph, from its recorded RNG state, backward with its gradient."""
    for call in calls:
        if call.leaf.grad is None:  # the loss did not use this call's vectors
            continue
        for (s, e), state in zip(call.bounds, call.states):
            set_rng_state(state)
            z = encoder.pooled(**{k: v[s:e] for k, v in call.inputs.items()})
            if check and not torch.allclose(z.detach().float(), call.leaf[s:e].detach().float(), atol=1e-5):
                raise RuntimeError("GradCache: pass 2 differs from pass 1 (a random state was not replayed)")
            z.backward(call.leaf.grad[s:e].to(z.dtype))


def average_gradients(module: nn.Module) -> None:
    """DDP's gradient average, for a step that did not go through DDP's forward. Every rank reduces
    every trainable parameter, in the same order (a missing gradient counts as zeros)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    world = dist.get_world_size()
    params = [p for p in module.parameters() if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[offset:offset + n].view_as(g).clone()
        offset += n


def cached_step(core: nn.Module, batch: dict, chunk: int, autocast_ctx, scale=None, check: bool = False):
    """Forward and backward of one batch with GradCache; returns the objective's LossOutput.

    ``core``: the unwrapped TrainModule (encoder + objective); ``autocast_ctx``: a callable giving the
    run's autocast context; ``scale``: the fp16 GradScaler's ``scale`` (or None)."""
    proxy = ChunkedEncoder(core.encoder, chunk)
    with autocast_ctx():
        out = core.objective(proxy, batch)
    after = rng_state()
    loss = scale(out.loss) if scale is not None else out.loss
    loss.backward()
    with autocast_ctx():
        replay(core.encoder, proxy.calls, check)
    set_rng_state(after)  # the next step draws what it would have drawn without the replay
    average_gradients(core)
    return out
