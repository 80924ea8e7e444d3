"""CompCSE: composition of phrase halves as the positive (Chanchani & Huang, 2023, Sec. 3).

The token sequence of each sentence is split into a left and a right half (``raycse.views.halves``,
each half with its own special tokens; the left one takes the extra token of an odd length); the
sentence and both halves go through the encoder *and the linear projector g* (the MLP head) in one
call, "in independent forward passes through the encoder and linear projector", and the projected
halves are aggregated into the positive of the sentence z_i = g(f(x_i)) (with dropout):

    l_i = g(f(left_i)),  r_i = g(f(right_i))
    compose = mean:   z+_i = (l_i + r_i) / 2                          (element-wise average; best for BERT)
    compose = sum:    z+_i = l_i + r_i
    compose = concat: z+_i = [l_i[:d/2], r_i[d/2:]]                    (first & last half; best for RoBERTa)
    compose = sbert:  z+_i = W [l_i, r_i, |l_i - r_i|] + b              (second-order features, projected to d)
    L = mean_i CE(sim(z_i[:d0], z+_j[:d0]) / tau, target = i)

``d0`` (DirectCLR) limits the loss to the first d0 coordinates during training; inference uses the
full vector; with ``concat`` it does not apply (Table 3). The sbert projection W is trained with the
model and dropped after training, like the head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from raycse.errors import ConfigError
from raycse.objectives.base import LossOutput, Objective, Params, positive
from raycse.objectives.contrastive import info_nce
from raycse.objectives.registry import register
from raycse.views import halves, special_ids


COMPOSE = ("mean", "sum", "concat", "sbert")


@dataclass
class CompCSEParams(Params):
    compose: str = "mean"  # mean | sum | concat | sbert (Table 3's aggregations)
    d0: Optional[int] = None  # None: all coordinates
    tau: float = 0.05

    def validate(self) -> None:
        if self.compose not in COMPOSE:
            raise ConfigError(f"objective.compose must be one of {', '.join(COMPOSE)}, got {self.compose!r}")
        if self.d0 is not None and self.d0 < 1:
            raise ConfigError(f"objective.d0 must be >= 1, got {self.d0}")
        if self.d0 is not None and self.compose == "concat":
            raise ConfigError("objective.d0 does not apply with compose: concat (its halves are coordinate ranges); "
                              "drop d0 or choose compose mean, sum or sbert")
        positive("tau", self.tau)


def compose(left: Tensor, right: Tensor, how: str, project: Optional[nn.Module] = None) -> Tensor:
    """The positive from the projected halves (see the module docstring)."""
    if how == "mean":
        return (left + right) / 2
    if how == "sum":
        return left + right
    if how == "sbert":
        return project(torch.cat([left, right, (left - right).abs()], dim=1))
    d = left.shape[1] // 2
    return torch.cat([left[:, :d], right[:, d:]], dim=1)


def pad_cat(batches: list[dict], pad_id: int) -> dict:
    """Stack batches of different widths into one (right padding)."""
    width = max(b["input_ids"].shape[1] for b in batches)
    ids = torch.cat([torch.nn.functional.pad(b["input_ids"], (0, width - b["input_ids"].shape[1]), value=pad_id)
                     for b in batches])
    mask = torch.cat([torch.nn.functional.pad(b["attention_mask"], (0, width - b["attention_mask"].shape[1]))
                      for b in batches])
    return {"input_ids": ids, "attention_mask": mask}


@register
class CompCSE(Objective):
    name = "compcse"
    Params = CompCSEParams
    sliceable = False  # HiCL cannot wrap it: it encodes halves through the pooled states and the head

    def __init__(self, params: CompCSEParams):
        super().__init__(params)
        self.project: Optional[nn.Linear] = None  # compose: sbert's (3d -> d) projection

    def setup(self, encoder) -> None:
        if self.params.d0 is not None and self.params.d0 > encoder.hidden_size:
            raise ConfigError(f"objective.d0={self.params.d0} exceeds the hidden size {encoder.hidden_size}")
        if self.params.compose == "sbert":
            self.project = nn.Linear(3 * encoder.hidden_size, encoder.hidden_size)

    def collate(self, texts, tokenizer, max_length):
        ids = special_ids(tokenizer)
        full = self.tokenize(texts, tokenizer, max_length)
        left, right = halves(full["input_ids"], full["attention_mask"], ids)
        full = {k: v for k, v in full.items() if k != "token_type_ids"}
        return pad_cat([full, left.batch(), right.batch()], ids[2])

    def loss(self, z: Tensor, pos: Tensor) -> Tensor:
        d0 = self.params.d0 or z.shape[1]
        return info_nce(z[:, :d0], pos[:, :d0], self.params.tau)

    def forward(self, encoder, batch) -> LossOutput:
        n = batch["input_ids"].shape[0] // 3
        # sentence and halves through encoder and projector alike, then the halves are aggregated
        g = encoder.head(encoder.pooled(batch["input_ids"], batch["attention_mask"]))
        z, left, right = g[:n], g[n:2 * n], g[2 * n:]
        return LossOutput(self.loss(z, compose(left, right, self.params.compose, self.project)))
