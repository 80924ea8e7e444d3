"""SimCSE (Gao et al., 2021): unsupervised contrastive learning with dropout as augmentation.

    L = mean_i  -log  exp(sim(z1_i, z2_i) / tau) / sum_j exp(sim(z1_i, z2_j) / tau)

z1 and z2 are the same sentences encoded twice in one forward call (different dropout masks).
Only cross-view similarities enter; j runs over the global batch (all workers).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from raycse.objectives.base import LossOutput, Objective, Params, positive, stack_twice
from raycse.objectives.contrastive import info_nce
from raycse.objectives.registry import register


@dataclass
class SimCSEParams(Params):
    tau: float = 0.05

    def validate(self) -> None:
        positive("tau", self.tau, " (SimCSE uses 0.05)")


@register
class SimCSE(Objective):
    name = "simcse"
    Params = SimCSEParams

    def collate(self, texts, tokenizer, max_length):
        return self.tokenize(texts, tokenizer, max_length)

    def loss(self, z1: Tensor, z2: Tensor) -> Tensor:
        return info_nce(z1, z2, self.params.tau)

    def forward(self, encoder, batch) -> LossOutput:
        n = self.batch_size_of(batch)
        z = encoder(**stack_twice(batch))
        return LossOutput(self.loss(z[:n], z[n:]))
