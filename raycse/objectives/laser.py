"""LA(SER)^3: length-agnostic sentence embeddings by self-reference (Xiao et al., 2023, "Length is a Curse and a Blessing for Document-level Semantics").

Elongation = copy-and-concat: the text's tokens repeated m times, m drawn per input uniformly from
[1, floor(max_len / len)] so the result fits the max length (``m_mode: random``), or a fixed m
capped the same way (``fixed``).

    self-reference : anchor = a sentence of the text,       positive = its elongated copy
    intra-reference: anchor = a sentence, elongated,        positive = the rest of the document
    L = mean_i CE(sim(anchor_i, positive_j) / tau, target = i)      (in-batch negatives, gathered)

Which sentence (``anchor``): the **first** of each document, as the paper's main experiments take
it (Sec. 4, "we take the first sentence of each document"), for both modes by default; a **random**
one is the Sec. 5.1 ablation; self-reference can also take the whole ``line`` (on a
sentence-per-line corpus the three are the same sentence). Each corpus line is a document, split into sentences at . ! ? followed by
space; a one-sentence document is its own rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import torch

from raycse.errors import ConfigError
from raycse.objectives.base import LossOutput, Objective, Params, positive
from raycse.objectives.contrastive import info_nce
from raycse.objectives.views import elongate, random_repeats, special_ids

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


ANCHORS = ("line", "first", "random")


def split_document(doc: str, pick: int = 0) -> tuple[str, str]:
    """(sentence number ``pick`` (taken modulo the count), the other sentences in order); a
    one-sentence document is its own rest."""
    parts = [s for s in SENTENCE_END.split(doc.strip()) if s.strip()] or [doc.strip()]
    i = pick % len(parts)
    rest = " ".join(parts[:i] + parts[i + 1:])
    return parts[i], rest or parts[i]


def pick_sentences(texts: list[str], anchor: str) -> list[int]:
    """Which sentence of each text is the anchor: 0 (first) or a uniform random one."""
    if anchor != "random":
        return [0] * len(texts)
    counts = [max(1, len([s for s in SENTENCE_END.split(t.strip()) if s.strip()])) for t in texts]
    return [int(torch.randint(c, ())) for c in counts]


@dataclass
class LaserParams(Params):
    mode: str = "self"  # self | intra
    m_mode: str = "random"  # random | fixed
    m: int = 2  # the fixed m
    elongation_max_length: Optional[int] = None  # None: model.max_length
    tau: float = 0.05
    anchor: str = "first"  # first (the paper's main setting) | random (Sec. 5.1) | line (self-reference only)

    def validate(self) -> None:
        if self.mode not in ("self", "intra"):
            raise ConfigError(f"objective.mode must be self or intra, got {self.mode!r}")
        if self.m_mode not in ("random", "fixed"):
            raise ConfigError(f"objective.m_mode must be random or fixed, got {self.m_mode!r}")
        if self.m < 1:
            raise ConfigError(f"objective.m must be >= 1, got {self.m}")
        if self.elongation_max_length is not None and self.elongation_max_length < 3:
            raise ConfigError(f"objective.elongation_max_length must be >= 3, got {self.elongation_max_length}")
        positive("tau", self.tau, " (LA(SER)^3 uses 0.05)")
        if self.anchor not in ANCHORS:
            raise ConfigError(f"objective.anchor must be one of {', '.join(ANCHORS)}, got {self.anchor!r}")
        if self.mode == "intra" and self.anchor == "line":
            raise ConfigError("objective.anchor line needs mode self (intra-reference anchors a sentence against "
                              "the rest of the line); choose first or random")


class Laser(Objective):
    name = "laser"
    guided_negatives = True
    derives_widths = True  # the repeats
    Params = LaserParams

    @property
    def collate_draws_random(self) -> bool:  # random elongation factors, or a random anchor sentence
        return self.params.m_mode == "random" or self.params.anchor == "random"

    def collate(self, texts, tokenizer, max_length):
        p = self.params
        limit = p.elongation_max_length or max_length
        ids = special_ids(tokenizer)
        how = p.anchor
        if how != "line":
            picked, rest = zip(*(split_document(t, i) for t, i in zip(texts, pick_sentences(texts, how))))
        if p.mode == "self":
            anchor = self.tokenize(texts if how == "line" else list(picked), tokenizer, max_length)
            to_elongate, positive_batch = anchor, None
        else:
            to_elongate = self.tokenize(list(picked), tokenizer, max_length)
            positive_batch = self.tokenize(list(rest), tokenizer, max_length)
        if p.m_mode == "random":
            m = random_repeats(to_elongate["attention_mask"], limit)
        else:
            m = torch.full((len(texts),), p.m, dtype=torch.long)
        long, used = elongate(to_elongate["input_ids"], to_elongate["attention_mask"], m, limit, ids)
        if p.mode == "self":
            out = {**{f"a_{k}": v for k, v in anchor.items() if k != "token_type_ids"},
                   **{f"p_{k}": v for k, v in long.items()}}
        else:
            out = {**{f"a_{k}": v for k, v in long.items()},
                   **{f"p_{k}": v for k, v in positive_batch.items() if k != "token_type_ids"}}
        out["m"] = used
        return out

    def loss(self, anchor, positive):
        return info_nce(anchor, positive, self.params.tau)

    def forward(self, encoder, batch) -> LossOutput:
        a = encoder(input_ids=batch["a_input_ids"], attention_mask=batch["a_attention_mask"])
        p = encoder(input_ids=batch["p_input_ids"], attention_mask=batch["p_attention_mask"])
        return LossOutput(self.loss(a, p), {"mean_m": batch["m"].float().mean()})
