"""BSC: symmetric batch-softmax contrastive loss on pairs (Chernyavskiy et al., 2021).

For a batch of pairs (q_i, a_i) with labels y_i and similarities S = norm(Q) norm(A)^T / tau:

    L0 = (1/n) sum_i y_i * ( -1/|P_i| sum_{j in P_i} log softmax_j(S_i.) )     rows: q_i over all a_j
    L1 = (1/n) sum_i y_i * ( -1/|P_i| sum_{j in P_i} log softmax_j(S^T_i.) )   rows: a_i over all q_j
    L_BSC = L0 + L1

P_i = { j : q_j is the same text as q_i (and y_j = 1 for L0) }: duplicated anchors are positives of
each other (SupCon form); without duplicates P_i = {i}. A labeled negative (y_i = 0) keeps its
a_i / q_i in every denominator but contributes no positive term, and still counts in the mean
over all n rows (as the authors' code does).

Normalization (Sec. 3.5, "L2 normalization by coordinates or in a min-max scale" across the batch,
as alternatives to per-vector L2): ``l2`` (per vector: cosine; tau ~ 0.1), ``coord_l2`` (each
coordinate divided by its L2 norm over the batch), ``coord`` (min-max scale: each coordinate divided
by its range over the batch, no centering, as the authors' code; tau ~ 1-3) or ``none``. Temperature fixed, or trainable as a scale (init 1.0,
logits = S * scale) with its own learning rate. Combo with regression on scored data:

    L = mu * L_BSC + (1 - mu) * mean_i (cos(q_i, a_i) - t_i)^2,   t_i = score_i normalized to [0, 1]

Unsupervised, (s, s) pairs with two dropout views make it a symmetric SimCSE. Across workers the
candidates (A for L0, Q for L1) are gathered with gradients, like SimCSE's.

Hard negatives (``data.negative_column``, raycse's extension for triplet data): the rows' negatives
N join A as candidates of L0 (never positives; gathered like A; the coordinate normalizations
take their statistics over A and N together); L1 is unchanged.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raycse.errors import ConfigError
from raycse.objectives.base import LossOutput, Objective, Pair, Params, positive
from raycse.objectives.contrastive import gather, gather_no_grad, local_offset

NORMALIZATIONS = ("l2", "coord_l2", "coord", "none")


@dataclass
class BSCParams(Params):
    tau: float = 0.1
    normalization: str = "l2"
    trainable_tau: bool = False
    tau_lr: float = 1e-3
    mu: float = 1.0  # weight of the BSC part; 1 - mu goes to the MSE on scores
    threshold: float = 0.5  # normalized score > threshold counts as a positive pair

    def validate(self) -> None:
        positive("tau", self.tau)
        positive("tau_lr", self.tau_lr)
        if self.normalization not in NORMALIZATIONS:
            raise ConfigError(f"objective.normalization must be one of {', '.join(NORMALIZATIONS)}, got {self.normalization!r}")
        if not 0.0 <= self.mu <= 1.0:
            raise ConfigError(f"objective.mu must be in [0, 1] (weight of BSC vs MSE), got {self.mu}")
        if not 0.0 <= self.threshold < 1.0:
            raise ConfigError(f"objective.threshold must be in [0, 1) on the normalized score, got {self.threshold}")


def text_key(text: str) -> int:
    """A stable id of a text, so duplicated anchors can be found on any worker."""
    return zlib.crc32(text.encode("utf-8")) & 0x7FFFFFFF


def coord_normalize(x: Tensor, batch: Tensor) -> Tensor:
    """Divide each coordinate by its range over ``batch`` (the global batch), without centering."""
    span = (batch.max(0).values - batch.min(0).values).clamp(min=1e-6)
    return x / span


def coord_l2_normalize(x: Tensor, batch: Tensor) -> Tensor:
    """Divide each coordinate by its L2 norm over ``batch`` (the global batch)."""
    return x / batch.norm(dim=0).clamp(min=1e-6)


def supcon_rows(logits: Tensor, pos: Tensor, row_weight: Tensor) -> Tensor:
    """(1/n) sum_i w_i * mean_{j in P_i} -log softmax(logits_i)_j; rows with no positive count as 0."""
    logp = logits.log_softmax(dim=1)
    count = pos.sum(1)
    per_row = -(logp * pos).sum(1) / count.clamp(min=1)
    weight = row_weight * (count > 0)
    return (per_row * weight).sum() / logits.shape[0]


def _scalar_scale_as_1d(module, state_dict, prefix, *_args) -> None:
    """A checkpoint written when the learned scale was 0-d loads into its 1-d parameter."""
    key = prefix + "scale"
    if key in state_dict and state_dict[key].dim() == 0:
        state_dict[key] = state_dict[key].reshape(1)


class BSC(Objective):
    name = "bsc"
    Params = BSCParams
    accepts = ("single", "pairs")
    takes_negatives = True

    def __init__(self, params: BSCParams):
        super().__init__(params)
        # 1-d (one element), not 0-d: FSDP2 shards no scalar parameter (--sharding fsdp)
        self.scale = nn.Parameter(torch.ones(1)) if params.trainable_tau else None
        self.register_load_state_dict_pre_hook(_scalar_scale_as_1d)

    def custom_lr(self) -> dict:
        return {"scale": self.params.tau_lr} if self.scale is not None else {}

    def collate(self, examples, tokenizer, max_length):
        unsupervised = isinstance(examples[0], str)  # (both views are the text column's)
        if unsupervised:  # (s, s) with two dropout views
            q = a = list(examples)
            scores, has_score, negs = [1.0] * len(examples), False, []
        else:
            pairs = [Pair(*e) for e in examples]
            q, a = [p.query for p in pairs], [p.positive for p in pairs]
            scores = [1.0 if p.score is None else float(p.score) for p in pairs]
            has_score = any(p.score is not None for p in pairs)
            negs = [t for p in pairs for t in p.negatives]
        if self.params.mu < 1.0 and not has_score:
            raise ConfigError("objective.mu < 1 needs scored pairs (data.label_column); set mu: 1.0 for unscored data")
        enc = self.tokenize(q + a + negs, tokenizer, max_length, pairs_from=None if unsupervised else len(q))
        enc["score"] = torch.tensor(scores, dtype=torch.float32)
        enc["q_key"] = torch.tensor([text_key(t) for t in q], dtype=torch.long)
        return enc

    def effective_scale(self) -> Tensor | float:
        return self.scale if self.scale is not None else 1.0

    def normalize(self, local: Tensor, gathered: Tensor) -> tuple[Tensor, Tensor]:
        if self.params.normalization == "l2":
            return F.normalize(local, dim=-1), F.normalize(gathered, dim=-1)
        if self.params.normalization == "coord":
            return coord_normalize(local, gathered), coord_normalize(gathered, gathered)
        if self.params.normalization == "coord_l2":
            return coord_l2_normalize(local, gathered), coord_l2_normalize(gathered, gathered)
        return local, gathered

    def loss(self, q: Tensor, a: Tensor, score: Tensor, q_key: Tensor,
             neg: Optional[Tensor] = None) -> tuple[Tensor, dict]:
        """BSC (+ MSE) on local q, a (n, d); candidates gathered from all workers. ``neg`` (m, d): the
        rows' hard negatives, gathered too: extra candidates of L0's rows (never positives)."""
        q, a = q.float(), a.float()
        n = q.shape[0]
        label = (score > self.params.threshold).float()
        q_all, a_all = gather(q), gather(a)
        key_all = gather_no_grad(q_key)
        label_all = gather_no_grad(label)
        q_n, q_all_n = self.normalize(q, q_all)
        cands = a_all if neg is None else torch.cat([a_all, gather(neg.float())])
        a_n, cands_n = self.normalize(a, cands)
        factor = self.effective_scale() / self.params.tau
        same = (q_key[:, None] == key_all[None, :]).float()  # (n, N) duplicated anchors
        own = torch.zeros_like(same)
        own[torch.arange(n), torch.arange(n) + local_offset(n)] = 1.0
        pos = torch.maximum(same, own)
        pos0 = torch.cat([pos * label_all[None, :], pos.new_zeros(n, cands.shape[0] - a_all.shape[0])], dim=1)
        l0 = supcon_rows(q_n @ cands_n.T * factor, pos0, label)
        l1 = supcon_rows(a_n @ q_all_n.T * factor, pos, label)
        bsc = l0 + l1
        metrics = {"bsc": bsc.detach()}
        mu = self.params.mu
        if mu >= 1.0:
            return bsc, metrics
        mse = (F.cosine_similarity(q, a, dim=-1) - score).pow(2).mean()
        metrics["mse"] = mse.detach()
        return mu * bsc + (1 - mu) * mse, metrics

    def forward(self, encoder, batch) -> LossOutput:
        n = batch["score"].shape[0]
        z = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch.get("token_type_ids"))
        loss, metrics = self.loss(z[:n], z[n:2 * n], batch["score"], batch["q_key"],
                                  z[2 * n:] if z.shape[0] > 2 * n else None)
        return LossOutput(loss, metrics)
