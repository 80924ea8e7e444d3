"""CompCSE: composition of phrase halves as the positive (Chanchani & Huang, 2023).

The token sequence of each sentence is split into a left and a right half (``raycse.views.halves``,
each half with its own special tokens); the sentence and both halves go through the encoder in one
call. The positive of the full sentence z_i (with dropout) is the composition of its halves,
composed before the MLP head, which is then applied to both sides:

    compose = mean:   p_i = (h_left_i + h_right_i) / 2                      (best for BERT)
    compose = concat: p_i = [h_left_i[:d/2], h_right_i[d/2:]]                (best for RoBERTa)
    L = mean_i CE(sim(z_i[:d0], p_j[:d0]) / tau, target = i)

``d0`` (DirectCLR) limits the loss to the first d0 coordinates during training; inference uses the
full vector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from raycse.errors import ConfigError
from raycse.objectives.base import LossOutput, Objective, Params, positive
from raycse.objectives.contrastive import info_nce
from raycse.objectives.registry import register
from raycse.views import halves, special_ids


@dataclass
class CompCSEParams(Params):
    compose: str = "mean"  # mean | concat
    d0: Optional[int] = None  # None: all coordinates
    temperature: float = 0.05

    def validate(self) -> None:
        if self.compose not in ("mean", "concat"):
            raise ConfigError(f"objective.compose must be mean or concat, got {self.compose!r}")
        if self.d0 is not None and self.d0 < 1:
            raise ConfigError(f"objective.d0 must be >= 1, got {self.d0}")
        positive("temperature", self.temperature)


def compose(left: Tensor, right: Tensor, how: str) -> Tensor:
    if how == "mean":
        return (left + right) / 2
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

    def setup(self, encoder) -> None:
        if self.params.d0 is not None and self.params.d0 > encoder.hidden_size:
            raise ConfigError(f"objective.d0={self.params.d0} exceeds the hidden size {encoder.hidden_size}")

    def collate(self, texts, tokenizer, max_length):
        ids = special_ids(tokenizer)
        full = self.tokenize(texts, tokenizer, max_length)
        left, right = halves(full["input_ids"], full["attention_mask"], ids)
        full = {k: v for k, v in full.items() if k != "token_type_ids"}
        return pad_cat([full, left.batch(), right.batch()], ids[2])

    def loss(self, z: Tensor, pos: Tensor) -> Tensor:
        d0 = self.params.d0 or z.shape[1]
        return info_nce(z[:, :d0], pos[:, :d0], self.params.temperature)

    def forward(self, encoder, batch) -> LossOutput:
        n = batch["input_ids"].shape[0] // 3
        raw = encoder.pooled(batch["input_ids"], batch["attention_mask"])
        z, left, right = raw[:n], raw[n:2 * n], raw[2 * n:]
        # the head goes on the sentence and on the composed halves
        return LossOutput(self.loss(encoder.head(z), encoder.head(compose(left, right, self.params.compose))))
