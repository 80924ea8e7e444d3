"""An objective of your own, outside raycse: unsupervised SimCSE made symmetric.

SimCSE (Gao et al., 2021, Sec. 3) scores each first dropout view against every second view. This
one also scores each second view against every first view and averages the two directions, as
sentence-transformers' MultipleNegativesSymmetricRankingLoss does for pairs:

    L = 1/2 mean_i [ -log e^{s(z1_i, z2_i)/tau} / sum_j e^{s(z1_i, z2_j)/tau}
                     -log e^{s(z2_i, z1_i)/tau} / sum_j e^{s(z2_i, z1_j)/tau} ]

with s the cosine and j over the global batch (every worker's rows: ``info_nce`` gathers them).

Train with it, from the folder that holds this file on PYTHONPATH:

    PYTHONPATH=examples raycse train --objective symmetric_simcse:SymmetricSimCSE --set objective.tau=0.05 ...

or register it under a short name from your own package's pyproject.toml:

    [project.entry-points."raycse.objectives"]
    symmetric_simcse = "my_pkg.symmetric_simcse:SymmetricSimCSE"

What an objective is: a ``Params`` dataclass (its knobs, checked in ``validate``), ``collate`` (the
texts of a batch -> tensors) and ``forward`` (encoder + batch -> loss), on
``raycse.api.Objective``.
"""

from __future__ import annotations

from dataclasses import dataclass

from raycse.api import LossOutput, Objective, Params, info_nce, positive, stack_twice


@dataclass
class SymmetricParams(Params):
    tau: float = 0.05  # the temperature of both directions

    def validate(self) -> None:
        positive("tau", self.tau)


class SymmetricSimCSE(Objective):
    name = "symmetric_simcse"
    Params = SymmetricParams
    accepts = ("single",)

    def collate(self, texts, tokenizer, max_length):
        return self.tokenize(texts, tokenizer, max_length)

    def forward(self, encoder, batch) -> LossOutput:
        n = self.batch_size_of(batch)
        z = encoder(**stack_twice(batch))  # both dropout views in one call, identical padding
        z1, z2 = z[:n], z[n:]
        forward, backward = info_nce(z1, z2, self.params.tau), info_nce(z2, z1, self.params.tau)
        return LossOutput((forward + backward) / 2, {"forward": forward.detach(), "backward": backward.detach()})
