"""Guided in-batch negatives (GISTEmbed, Solatorio 2024, Sec. 3; sentence-transformers' GISTEmbedLoss).

A guide model scores every anchor against every candidate of the (gathered) batch. A candidate j that is
not anchor i's positive p_i is masked out of i's softmax when the guide finds it closer than the
positive, less a margin m (``objective.guide_margin``, 0 by default):

    masked(i, j)  <=>  j != p_i  and  cos(g(a_i), g(c_j)) > cos(g(a_i), g(c_{p_i})) - m

so a near-duplicate that kNN grouping, BSC's similar batches or ``raycse mine`` put beside its anchor
stops being pushed away as a negative. The guide's vectors ``g`` are computed once per corpus (the
starting model's with ``--guide initial``) and handed to each step with the batch; the objective's own
InfoNCE (:func:`raycse.objectives.contrastive.info_nce`, ``info_nce_hard``) reads them through
:func:`guided` while the step runs, for the calls whose anchors and candidates are the batch's rows:
SimCSE (unsupervised, pairs, hard negatives), CompCSE and LA(SER)^3. The gathered candidates' guide
vectors are gathered as the student's are, so two workers mask what one worker with the double batch
masks.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

# the guide of the step running now (a step runs one objective forward at a time, on one thread)
_active: list = []


@dataclass
class Guide:
    """The guide's vectors of this worker's batch, by column: ``text`` (n, d), ``pair`` (n, d) for pairs,
    ``negatives`` (n * k, d) for hard negatives; ``margin``: GISTEmbed's m. ``masked`` and ``seen`` count
    the candidates masked and those that could have been, over the step."""

    text: Tensor
    margin: float = 0.0
    pair: Optional[Tensor] = None
    negatives: Optional[Tensor] = None
    masked: list = field(default_factory=list)
    seen: list = field(default_factory=list)

    @property
    def rows(self) -> int:
        return int(self.text.shape[0])

    def fraction(self) -> Optional[Tensor]:
        """The share of the step's negatives masked (a 0-d tensor on the device), or None before any call."""
        if not self.seen:
            return None
        return torch.stack(self.masked).sum() / torch.stack(self.seen).sum().clamp(min=1)


@contextlib.contextmanager
def guided(guide: Optional[Guide]):
    """While the objective's forward runs: its InfoNCE calls mask what ``guide`` says (None: nothing)."""
    if guide is None:
        yield
        return
    _active.append(guide)
    try:
        yield
    finally:
        _active.pop()


def active() -> Optional[Guide]:
    return _active[-1] if _active else None


def exclusion(guide: Guide, anchors: Tensor, candidates: Tensor, targets: Tensor) -> Tensor:
    """GISTEmbed's mask, (n, M) bool: ``anchors`` (n, d) and ``candidates`` (M, d) are guide vectors
    (the candidates gathered from every worker), ``targets`` each anchor's positive among them."""
    sim = F.normalize(anchors.float(), dim=-1) @ F.normalize(candidates.float(), dim=-1).T
    rows = torch.arange(sim.shape[0], device=sim.device)
    threshold = sim[rows, targets] - guide.margin
    mask = sim > threshold[:, None]
    mask[rows, targets] = False
    guide.masked.append(mask.sum().float())
    guide.seen.append(torch.tensor(float(mask.numel() - mask.shape[0]), device=mask.device))
    return mask
