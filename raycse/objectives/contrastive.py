"""The contrastive core every objective shares.

InfoNCE over cosine similarities with a temperature tau, with the candidate set gathered from
all data-parallel workers.

Gradient semantics across workers (chosen, documented, tested): candidates are gathered with torch's
all-gather with autograd (:func:`raycse.platform.compat.all_gather_autograd`), which carries gradients
back to the worker that produced each row. Each worker computes the mean loss of its *local* anchors
against the *global* candidate set; DDP then averages parameter gradients over workers. Together this is
exactly the gradient of the global-batch loss, so ``W`` workers x batch ``b`` train like one
worker with batch ``W*b`` (``tests/test_distributed.py`` checks loss and gradients to 1e-5).
SimCSE's own code gathers without gradient and puts the local slice back, which drops the
cross-worker terms; we pay one extra reduce-scatter in backward to keep them.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from raycse.objectives.guide import active, exclusion


def world() -> tuple[int, int]:
    """(rank, world_size) of the default process group, (0, 1) when not distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather(x: Tensor) -> Tensor:
    """Concatenate ``x`` from every worker, rank-major, keeping gradients to every source row (the in-batch
    negatives of the whole global batch).

    Args:
        x: (n, ...) this worker's rows; the same shape on every worker (the train loop gives equal batches).

    Returns:
        (world * n, ...): every worker's rows, this worker's at ``local_offset(n)``; ``x`` itself on one worker.

    Raises:
        RuntimeError: from torch.distributed, where the workers' shapes differ.

    >>> import torch
    >>> gather(torch.ones(2, 3)).shape  # (one worker, outside a run: its own rows)
    torch.Size([2, 3])
    """
    _, size = world()
    if size == 1:
        return x
    from raycse.platform.compat import all_gather_autograd

    if _via_host(x):  # (.cpu() and .to() carry the gradient back to the device)
        return all_gather_autograd(x.contiguous().cpu()).to(x.device)
    return all_gather_autograd(x.contiguous())


def gather_no_grad(x: Tensor) -> Tensor:
    """Concatenate ``x`` (labels, ids) from every worker, rank-major, without autograd."""
    _, size = world()
    if size == 1:
        return x
    src = x.contiguous().cpu() if _via_host(x) else x.contiguous()
    out = [torch.empty_like(src) for _ in range(size)]
    dist.all_gather(out, src)
    return torch.cat(out).to(x.device)


def _via_host(x: Tensor) -> bool:
    """gloo all-gathers CPU tensors only: workers sharing a GPU (gloo, see train.gpus_per_worker)
    gather CUDA rows through host memory."""
    return x.device.type != "cpu" and dist.get_backend() != "nccl"


def local_offset(local_n: int) -> int:
    """Index of this worker's first row in a gathered (rank-major) tensor."""
    rank, _ = world()
    return rank * local_n


def cosine_logits(a: Tensor, b: Tensor, tau: float | Tensor) -> Tensor:
    """``sim(a_i, b_j) / tau`` for all i, j (cosine similarity), computed in float32 for a stable softmax.

    Args:
        a: (n, d) rows.
        b: (m, d) rows.
        tau: the temperature (a number, or a learned 0-d or 1-element tensor).

    Returns:
        (n, m) float32 logits.

    Raises:
        RuntimeError: rows of different widths.

    >>> import torch
    >>> cosine_logits(torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 0.0], [0.0, 1.0]]), 0.5)
    tensor([[2., 0.]])
    """
    a = F.normalize(a.float(), dim=-1)
    b = F.normalize(b.float(), dim=-1)
    return a @ b.T / tau


def info_nce(
    anchors: Tensor,
    candidates: Tensor,
    tau: float | Tensor,
    targets: Optional[Tensor] = None,
    exclude: Optional[Tensor] = None,
    gather_candidates: bool = True,
) -> Tensor:
    """InfoNCE: ``mean_i CE(sim(anchor_i, candidate_j) / tau, target_i)`` (SimCSE's loss, papers.md section 1),
    the candidates gathered from every worker; a guide, where the run has one, masks its false negatives.

    Args:
        anchors: (n, d) local anchors.
        candidates: (m, d) local candidates; gathered from all workers when ``gather_candidates``.
        tau: the temperature (> 0).
        targets: index of each anchor's positive in the (gathered) candidates. Default: the
            diagonal, offset by this worker's rank (``rank * m + i``).
        exclude: optional bool (n, M) mask of candidates that are neither positive nor negative
            (removed from the denominator), e.g. HiCL's same-sequence segments.
        gather_candidates: gather the candidates from every worker (default) or use this worker's alone.

    Returns:
        The 0-d mean cross-entropy.

    Raises:
        RuntimeError: shapes that do not match (anchors against candidates, targets against anchors).

    >>> import torch
    >>> z = torch.eye(3)
    >>> round(info_nce(z, z, tau=0.05).item(), 6)  # each anchor's own row is the one most like it
    0.0
    >>> round(info_nce(z, z.roll(1, 0), tau=1.0).item(), 4)  # (its positive now scores 0 against a 1)
    1.5514
    """
    local_m = candidates.shape[0]
    if gather_candidates:
        candidates = gather(candidates)
    logits = cosine_logits(anchors, candidates, tau)
    if targets is None:
        offset = local_offset(local_m) if gather_candidates else 0
        targets = torch.arange(anchors.shape[0], device=anchors.device) + offset
    guide = active()
    if guide is not None and gather_candidates and anchors.shape[0] == guide.rows == local_m:
        # the batch's rows against the (gathered) batch's: GISTEmbed's mask (raycse.objectives.guide)
        own = gather_no_grad(guide.pair if guide.pair is not None else guide.text)
        mask = exclusion(guide, guide.text, own, targets)
        exclude = mask if exclude is None else exclude | mask
    if exclude is not None:
        logits = logits.masked_fill(exclude, float("-inf"))
    return F.cross_entropy(logits, targets)


def info_nce_hard(anchors: Tensor, positives: Tensor, negatives: Tensor, tau: float | Tensor,
                  own_weight: float = 1.0) -> Tensor:
    """Supervised SimCSE's loss (Gao et al. 2021, Sec. 5 and appendix): every anchor against all
    positives and all hard negatives of the global batch; the hard negatives of its own row weighted
    by ``own_weight`` (alpha):

        -log e^{s(h_i, h_i+)/tau} / sum_j ( e^{s(h_i, h_j+)/tau} + alpha^{1[i=j]} sum_m e^{s(h_i, h_jm-)/tau} )

    Args:
        anchors: (n, d) this worker's anchors.
        positives: (n, d) their positives, gathered from all workers.
        negatives: (n, k, d), k hard negatives per row, gathered from all workers like the positives.
        tau: the temperature (> 0).
        own_weight: alpha, the weight of a row's own hard negatives (1: as the others; 0: left out).

    Returns:
        The 0-d mean cross-entropy.

    Raises:
        RuntimeError: shapes that do not match.

    >>> import torch
    >>> z = torch.eye(2)
    >>> round(info_nce_hard(z, z, -z.unsqueeze(1), tau=0.05).item(), 4)  # positives alike, negatives opposite
    0.0
    """
    n, k = negatives.shape[0], negatives.shape[1]
    pos_all = gather(positives)
    neg_all = gather(negatives.reshape(n * k, -1))
    logits = cosine_logits(anchors, torch.cat([pos_all, neg_all]), tau)
    rows = torch.arange(n, device=anchors.device)
    offset = local_offset(n)
    if own_weight != 1.0:  # alpha * e^x = e^{x + log alpha}; alpha = 0 drops them
        own = pos_all.shape[0] + (rows + offset)[:, None] * k + torch.arange(k, device=anchors.device)[None, :]
        shift = torch.zeros_like(logits)
        shift[rows[:, None], own] = math.log(own_weight) if own_weight > 0 else float("-inf")
        logits = logits + shift
    guide = active()
    if guide is not None and guide.rows == n and guide.pair is not None and guide.negatives is not None:
        candidates = torch.cat([gather_no_grad(guide.pair), gather_no_grad(guide.negatives)])
        logits = logits.masked_fill(exclusion(guide, guide.text, candidates, rows + offset), float("-inf"))
    return F.cross_entropy(logits, rows + offset)
