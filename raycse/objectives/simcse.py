"""SimCSE (Gao et al., 2021): contrastive learning of sentence embeddings.

Unsupervised (Sec. 3), on single sentences: dropout is the augmentation.

    L = mean_i  -log  exp(sim(z1_i, z2_i) / tau) / sum_j exp(sim(z1_i, z2_j) / tau)

z1 and z2 are the same sentences encoded twice in one forward call (different dropout masks).
Only cross-view similarities enter; j runs over the global batch (all workers).

Supervised (Sec. 5), on pairs (x_i, x_i+), e.g. NLI entailment, optionally with hard negatives x_i-
(``data.negative_column``, e.g. contradictions; several columns give several per row):

    L = mean_i -log e^{s(h_i, h_i+)/tau} / sum_j ( e^{s(h_i, h_j+)/tau} + alpha^{1[i=j]} sum_m e^{s(h_i, h_jm-)/tau} )

every anchor against all positives and all hard negatives of the global batch; ``hard_negative_weight``
is the appendix's alpha on the row's own hard negatives (1: the paper's default). Pair scores, if the
data has them, are not used: every pair is a positive.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from raycse.errors import ConfigError
from raycse.objectives.base import LossOutput, Objective, Pair, Params, positive, stack_twice
from raycse.objectives.contrastive import info_nce, info_nce_hard


@dataclass
class SimCSEParams(Params):
    tau: float = 0.05
    hard_negative_weight: float = 1.0  # alpha of the appendix (supervised, with hard negatives)

    def validate(self) -> None:
        positive("tau", self.tau, " (SimCSE uses 0.05)")
        if self.hard_negative_weight < 0:
            raise ConfigError(f"objective.hard_negative_weight must be >= 0, got {self.hard_negative_weight}")


class SimCSE(Objective):
    name = "simcse"
    guided_negatives = True
    Params = SimCSEParams
    accepts = ("single", "pairs")
    takes_negatives = True

    def collate(self, examples, tokenizer, max_length):
        if isinstance(examples[0], str):  # unsupervised
            return self.tokenize(examples, tokenizer, max_length)
        pairs = [Pair(*e) for e in examples]
        q, a = [p.query for p in pairs], [p.positive for p in pairs]
        negs = [t for p in pairs for t in p.negatives]
        enc = self.tokenize(q + a + negs, tokenizer, max_length, pairs_from=len(q))
        enc["pairs"] = len(q)  # anchors, then positives, then k negatives per anchor (a number: no read-back)
        return enc

    def loss(self, z1: Tensor, z2: Tensor) -> Tensor:
        return info_nce(z1, z2, self.params.tau)

    def supervised_loss(self, h: Tensor, pos: Tensor, neg: Tensor | None) -> Tensor:
        if neg is None:
            return info_nce(h, pos, self.params.tau)
        return info_nce_hard(h, pos, neg, self.params.tau, self.params.hard_negative_weight)

    def forward(self, encoder, batch) -> LossOutput:
        if "pairs" not in batch:
            n = self.batch_size_of(batch)
            z = encoder(**stack_twice(batch))
            return LossOutput(self.loss(z[:n], z[n:]))
        n = int(batch["pairs"])
        z = encoder(**{k: v for k, v in batch.items() if k != "pairs"})
        k = (z.shape[0] - 2 * n) // n
        neg = z[2 * n:].reshape(n, k, -1) if k else None
        return LossOutput(self.supervised_loss(z[:n], z[n:2 * n], neg))
