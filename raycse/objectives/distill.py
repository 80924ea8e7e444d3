"""Distillation from a teacher's embeddings: the term added to any objective (``--teacher MODEL``).

    L = L_objective + w * L_distill        (w: ``objective.distill_weight``)

with s the student's embeddings of the batch's sentences and t the teacher's (computed once per corpus,
:mod:`raycse.grouping.references`), ``objective.distill`` one of:

- ``kl`` (Hinton et al. 2015; sentence-transformers' DistillKLDivLoss; FlagEmbedding's teacher scores):
  each anchor's softmax over its in-batch similarities, the teacher's as the target,

      p^T_ij = softmax_j(cos(t_i, t'_j) / tau_T),   p^S_ij = softmax_j(cos(s_i, s'_j) / tau_S)
      L_kl = 1/n sum_i sum_j p^T_ij (log p^T_ij - log p^S_ij)

  over the candidates j of the gathered batch: for pairs, every pair's second text (t', s'); for single
  sentences, every other sentence (j != i: a sentence's similarity to itself is 1 to both models and
  would hold most of each row's mass). tau_S is ``objective.distill_tau``, tau_T ``objective.teacher_tau``.
  Unlike sentence-transformers' version no tau^2 factor: these logits are cosines over tau, whose tau is
  the scale of the scores, not a softening of raw logits; ``distill_weight`` sets the term's size. The
  dimensions of teacher and student need not be equal.
- ``mse`` (Reimers & Gurevych 2020; sentence-transformers' MSELoss): the student's embedding against the
  teacher's, mean over rows and coordinates, of every column distilled: L_mse = mean (s - t)^2. Equal
  dimensions only.
- ``margin_mse`` (Hofstaetter et al. 2020; sentence-transformers' MarginMSELoss), for pairs with hard
  negatives: the student's margin between the positive and each hard negative against the teacher's,

      L = 1/(n k) sum_i sum_m ((cos(s_i, s+_i) - cos(s_i, s-_im)) - (cos(t_i, t+_i) - cos(t_i, t-_im)))^2

  (cosine for both models, where Hofstaetter's models score by dot product: the margins of two models
  with different norms are comparable only so).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from raycse.objectives.contrastive import gather, gather_no_grad, local_offset

KINDS = ("kl", "mse", "margin_mse")


def _cos(a: Tensor, b: Tensor) -> Tensor:
    return F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T


def kl_term(student: Tensor, teacher: Tensor, student_pair: Optional[Tensor], teacher_pair: Optional[Tensor],
            student_tau: float, teacher_tau: float) -> Tensor:
    """L_kl for this worker's anchors against the gathered candidates (the pair column's, else the
    sentences' own without themselves); gradients reach every worker's student rows, as InfoNCE's do."""
    n = student.shape[0]
    cand_s = gather(student_pair if student_pair is not None else student)
    cand_t = gather_no_grad(teacher_pair if teacher_pair is not None else teacher)
    logits_s, logits_t = _cos(student, cand_s) / student_tau, _cos(teacher, cand_t) / teacher_tau
    if student_pair is None:  # a sentence against itself: no information, and most of the mass
        own = torch.arange(n, device=student.device)
        own_col = own + local_offset(n)
        logits_s = logits_s.clone()
        logits_s[own, own_col] = float("-inf")
        logits_t[own, own_col] = float("-inf")
    log_p_s = F.log_softmax(logits_s, dim=-1)
    log_p_t = F.log_softmax(logits_t, dim=-1)
    p_t = log_p_t.exp()
    none = p_t == 0  # (the left-out diagonal: 0 log 0 counts 0, and no -inf - -inf)
    return (p_t * (log_p_t.masked_fill(none, 0.0) - log_p_s.masked_fill(none, 0.0))).sum(dim=-1).mean()


def mse_term(students: list[Tensor], teachers: list[Tensor]) -> Tensor:
    """L_mse over every column distilled (rows of all columns together)."""
    return F.mse_loss(torch.cat([s.float() for s in students]), torch.cat([t.float() for t in teachers]))


def margin_mse_term(student: Tensor, student_pos: Tensor, student_neg: Tensor, teacher: Tensor,
                    teacher_pos: Tensor, teacher_neg: Tensor) -> Tensor:
    """L_margin_mse: ``*_neg`` are (n, k, d), k hard negatives per row."""
    def margins(a, p, negs):
        a = F.normalize(a.float(), dim=-1)
        pos = (a * F.normalize(p.float(), dim=-1)).sum(-1, keepdim=True)  # (n, 1)
        neg = torch.einsum("nd,nkd->nk", a, F.normalize(negs.float(), dim=-1))  # (n, k)
        return pos - neg

    return F.mse_loss(margins(student, student_pos, student_neg), margins(teacher, teacher_pos, teacher_neg))
