"""Views of the text built on token ids: HiCL's segments, CompCSE's halves, LA(SER)^3's elongation.

All functions take a right-padded batch as the tokenizer makes it (``[CLS] tokens [SEP] pad...``,
exactly one special token at each end, as BERT/RoBERTa tokenizers do) and return a new batch in
the same layout, with the special tokens re-added per piece. Slicing is vectorised: no Python loop
per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from raycse.errors import ConfigError


@dataclass
class Pieces:
    """A batch of pieces cut from n sequences: piece k belongs to sequence ``owner[k]``."""

    input_ids: Tensor  # (P, W) with [CLS] ... [SEP] and padding
    attention_mask: Tensor  # (P, W)
    owner: Tensor  # (P,) index of the source sequence
    length: Tensor  # (P,) content tokens in the piece (special tokens excluded)

    def batch(self) -> dict:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}


def special_ids(tokenizer) -> tuple[int, int, int]:
    """(start, end, pad) token ids, checking the one-token-each-side layout the views rely on."""
    probe = tokenizer("a")["input_ids"]
    start, end = probe[0], probe[-1]
    if tokenizer.num_special_tokens_to_add() != 2 or start == end:
        raise ConfigError("token views need a tokenizer that adds one special token at each end (BERT/RoBERTa style)")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return start, end, pad


def content_lengths(attention_mask: Tensor) -> Tensor:
    return (attention_mask.sum(1) - 2).clamp(min=0)


def slice_pieces(input_ids: Tensor, attention_mask: Tensor, slice_length: Tensor | int, ids: tuple[int, int, int],
                 max_pieces: int | None = None) -> Pieces:
    """Cut each sequence's content into consecutive chunks of ``slice_length`` tokens (queue rule).

    Sequence i (content length c_i) gives ``1 + (c_i - 1) // L_i`` pieces, the last holding the
    1..L_i leftover tokens; ``slice_length`` may differ per sequence (a tensor), which is how CompCSE's
    halves are cut. A sequence with no content gives one empty piece ([CLS][SEP]).
    """
    start_id, end_id, pad_id = ids
    n = input_ids.shape[0]
    device = input_ids.device
    c = content_lengths(attention_mask)
    L = torch.as_tensor(slice_length, device=device).expand(n).clamp(min=1)
    count = torch.where(c > 0, 1 + (c - 1).clamp(min=0) // L, torch.ones_like(c))
    if max_pieces is not None:
        count = count.clamp(max=max_pieces)
    owner = torch.repeat_interleave(torch.arange(n, device=device), count)
    first = torch.cumsum(count, 0) - count  # index of each sequence's first piece
    k = torch.arange(owner.shape[0], device=device) - first[owner]  # piece number within its sequence
    Lk = L[owner]
    begin = 1 + k * Lk  # position in input_ids (after [CLS])
    length = torch.minimum(Lk, c[owner] - k * Lk).clamp(min=0)
    width = int(length.max()) if length.numel() else 0
    cols = torch.arange(width, device=device)
    pos = (begin[:, None] + cols[None, :]).clamp(max=input_ids.shape[1] - 1)
    valid = cols[None, :] < length[:, None]
    body = torch.where(valid, input_ids[owner[:, None], pos], torch.full_like(pos, pad_id))
    P = owner.shape[0]
    out = torch.full((P, width + 2), pad_id, dtype=input_ids.dtype, device=device)
    out[:, 0] = start_id
    out[:, 1:width + 1] = body
    out[torch.arange(P, device=device), length + 1] = end_id
    mask = (torch.arange(width + 2, device=device)[None, :] < (length + 2)[:, None]).to(attention_mask.dtype)
    return Pieces(out, mask, owner, length)


def halves(input_ids: Tensor, attention_mask: Tensor, ids: tuple[int, int, int]) -> tuple[Pieces, Pieces]:
    """CompCSE's left and right halves (left gets the extra token of an odd length), each with its
    own special tokens; a 1-token sentence has an empty right half."""
    c = content_lengths(attention_mask)
    half = (c + 1) // 2
    both = slice_pieces(input_ids, attention_mask, half.clamp(min=1), ids, max_pieces=2)
    n = input_ids.shape[0]
    # rows with a single piece (c <= 1) need an empty right piece
    counts = torch.bincount(both.owner, minlength=n)
    first = torch.cumsum(counts, 0) - counts
    left = _take(both, first)
    right_idx = torch.where(counts > 1, first + 1, first)
    right = _take(both, right_idx)
    empty = counts < 2
    if bool(empty.any()):
        right.input_ids = right.input_ids.clone()
        right.attention_mask = right.attention_mask.clone()
        right.input_ids[empty] = ids[2]
        right.input_ids[empty, 0] = ids[0]
        right.input_ids[empty, 1] = ids[1]
        right.attention_mask[empty] = 0
        right.attention_mask[empty, :2] = 1
        right.length = torch.where(empty, torch.zeros_like(right.length), right.length)
    return left, right


def _take(p: Pieces, idx: Tensor) -> Pieces:
    width = int(p.length[idx].max()) + 2 if idx.numel() else 2
    return Pieces(p.input_ids[idx, :width], p.attention_mask[idx, :width], p.owner[idx], p.length[idx])


def elongate(input_ids: Tensor, attention_mask: Tensor, repeats: Tensor, max_length: int,
             ids: tuple[int, int, int]) -> tuple[dict, Tensor]:
    """Copy-and-concat: each sequence's content repeated ``repeats[i]`` times, capped so that the
    result (with its two special tokens) fits ``max_length``. Returns the batch and the m used."""
    start_id, end_id, pad_id = ids
    n = input_ids.shape[0]
    device = input_ids.device
    c = content_lengths(attention_mask).clamp(min=1)
    m = torch.minimum(repeats.to(device).clamp(min=1), ((max_length - 2) // c).clamp(min=1))
    total = torch.minimum(c * m, torch.full_like(c, max_length - 2))
    width = int(total.max())
    cols = torch.arange(width, device=device)
    src = 1 + cols[None, :] % c[:, None]
    valid = cols[None, :] < total[:, None]
    body = torch.where(valid, input_ids.gather(1, src.clamp(max=input_ids.shape[1] - 1)), torch.full_like(src, pad_id))
    out = torch.full((n, width + 2), pad_id, dtype=input_ids.dtype, device=device)
    out[:, 0] = start_id
    out[:, 1:width + 1] = body
    out[torch.arange(n, device=device), total + 1] = end_id
    mask = (torch.arange(width + 2, device=device)[None, :] < (total + 2)[:, None]).to(attention_mask.dtype)
    return {"input_ids": out, "attention_mask": mask}, m


def random_repeats(attention_mask: Tensor, max_length: int, generator: torch.Generator | None = None) -> Tensor:
    """m_i uniform in [1, floor((max_length - 2) / len_i)] (LA(SER)^3's random elongation)."""
    c = content_lengths(attention_mask).clamp(min=1)
    high = ((max_length - 2) // c).clamp(min=1)
    u = torch.rand(c.shape, generator=generator)
    return (u * high).floor().long().clamp(max=high - 1) + 1


def segment_mean(z: Tensor, owner: Tensor, length: Tensor, n: int, weighted: bool = True) -> Tensor:
    """h_i = sum_j z_ij w_ij / sum_j w_ij with w = piece length (weighted) or 1."""
    w = length.to(z.dtype).clamp(min=1) if weighted else torch.ones_like(length, dtype=z.dtype)
    num = torch.zeros(n, z.shape[1], dtype=z.dtype, device=z.device).index_add(0, owner, z * w[:, None])
    den = torch.zeros(n, dtype=z.dtype, device=z.device).index_add(0, owner, w)
    return num / den[:, None]
