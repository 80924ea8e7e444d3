"""CompCSE: composition of phrase halves as the positive (Chanchani & Huang, 2023, Sec. 3).

The token sequence of each sentence is split into a left and a right half (``raycse.objectives.views.halves``,
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

``compose_at`` places the aggregation, where the paper contradicts itself: ``head`` (the default)
aggregates the projected halves as Sec. 3's words say (above); ``encoder`` aggregates the encoder's
vectors of the halves and projects the result, as Fig. 1 and the authors' code do:

    compose_at = encoder:  z+_i = g(compose(f(left_i), f(right_i)))

``d0`` (DirectCLR) limits the loss to the first d0 coordinates during training; inference uses the
full vector; with ``concat`` it does not apply (Table 3). d0 below 1 is a fraction of the embedding
size (the paper's {192, 256, 384} of BERT-base's 768 are 0.25, 0.33, 0.5), 1 and above a count. The
sbert projection W is trained with the model and dropped after training, like the head.

Subsampling (the ablation's extra training rows; the positive of a row still comes only from its own
text). C = the non-overlapping phrases of a sentence; the paper used a discourse parser, raycse cuts
at clause punctuation (after , ; :, before an opening parenthesis, at a spaced dash), an offline
stand-in. Each extra row is a span of the sentence (its anchor) and the two parts whose projected
vectors are composed into its positive, in place of the token halves:

    adjacent:    each unique pair (c_i, c_j), i < j, of the phrases of C; anchor "c_i c_j"
    overlapping: each pair of contiguous phrase runs (A, B) that overlap or touch (A starts and ends
                 before B; B starts at most one phrase after A ends); anchor = their union
    subsuming:   C recursively partitioned in half: every node below the root gives (node, its halves)

A span covering the whole sentence is left out (the sentence itself is already a row: the same text
twice in a batch would be a false negative). ``subsample_max`` extra rows per sentence at most
(a random choice, seeded; the paper gives no cap). The rows are made where the corpus is read, so
they are shuffled, deduplicated, counted (``extra_rows``) and batched like any other row.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from raycse.errors import ConfigError
from raycse.objectives.base import LossOutput, Objective, Params, positive
from raycse.objectives.contrastive import info_nce
from raycse.objectives.views import halves, special_ids


COMPOSE = ("mean", "sum", "concat", "sbert")
COMPOSE_AT = ("head", "encoder")
SUBSAMPLE = ("none", "adjacent", "overlapping", "subsuming")
# Separates an extra row's anchor and its two parts in the corpus text (no cleaned text holds it:
# stray ones are replaced by spaces before a row is expanded)
FIELD = "\x1f"
_CLAUSE = re.compile(r"(?<=[,;:])\s+|\s+(?=\()|\s+[-\u2013\u2014]+\s+")


@dataclass
class CompCSEParams(Params):
    compose: str = "mean"  # mean | sum | concat | sbert (Table 3's aggregations)
    compose_at: str = "head"  # head: aggregate the projected halves (Sec. 3) | encoder: project the aggregate (Fig. 1)
    d0: Optional[float] = None  # None: all coordinates; < 1: a fraction of the embedding size; >= 1: a count
    tau: float = 0.05
    subsample: str = "none"  # none | adjacent | overlapping | subsuming (extra rows; see the docstring)
    subsample_max: int = 4  # extra rows per sentence at most

    def validate(self) -> None:
        if self.subsample not in SUBSAMPLE:
            raise ConfigError(f"objective.subsample must be one of {', '.join(SUBSAMPLE)}, got {self.subsample!r}")
        if self.subsample_max < 1:
            raise ConfigError(f"objective.subsample_max must be >= 1, got {self.subsample_max}")
        if self.compose not in COMPOSE:
            raise ConfigError(f"objective.compose must be one of {', '.join(COMPOSE)}, got {self.compose!r}")
        if self.compose_at not in COMPOSE_AT:
            raise ConfigError(f"objective.compose_at must be one of {', '.join(COMPOSE_AT)}, got {self.compose_at!r}")
        if self.d0 is not None and not (0 < self.d0 < 1 or (self.d0 >= 1 and self.d0 == int(self.d0))):
            raise ConfigError(f"objective.d0 must be a fraction in (0, 1) of the embedding size or a whole number "
                              f"of coordinates, got {self.d0}")
        if self.d0 is not None and self.compose == "concat":
            raise ConfigError("objective.d0 does not apply with compose: concat (its halves are coordinate ranges); "
                              "drop d0 or choose compose mean, sum or sbert")
        positive("tau", self.tau)


def phrases(text: str) -> list[str]:
    """C: the sentence cut at clause punctuation (the stand-in for the paper's discourse parser)."""
    return [p.strip() for p in _CLAUSE.split(text) if p.strip()]


def _first_half(lo: int, hi: int) -> tuple[int, int]:
    """The left half of phrases lo..hi (it takes the extra phrase of an odd count, as the token halves do)."""
    return lo, lo + (hi - lo) // 2


def _halving(lo: int, hi: int) -> list[tuple]:
    """Every node below lo..hi of the recursive halving, as (node, left half, right half) runs."""
    if hi <= lo:
        return []
    _, mid = _first_half(lo, hi)
    out = []
    for a, b in ((lo, mid), (mid + 1, hi)):
        if b > a:
            out.append(((a, b), _first_half(a, b), (_first_half(a, b)[1] + 1, b)))
        out.extend(_halving(a, b))
    return out


def span_pairs(n: int, how: str) -> list[tuple]:
    """(anchor phrase indices, left run, right run) for a sentence of n phrases; runs are (first, last)."""
    if how == "adjacent":
        rows = [([i, j], (i, i), (j, j)) for i, j in itertools.combinations(range(n), 2)]
    elif how == "overlapping":
        runs = [(a, b) for a in range(n) for b in range(a, n)]
        rows = [(list(range(a, d + 1)), (a, b), (c, d)) for (a, b), (c, d) in itertools.product(runs, runs)
                if a < c <= b + 1 and b < d]
    else:
        rows = [(list(range(node[0], node[1] + 1)), left, right) for node, left, right in _halving(0, n - 1)]
    return [r for r in rows if len(r[0]) < n]  # the whole sentence is already a row


def span_rows(text: str, rng, how: str, limit: int) -> list[str]:
    """The extra rows of one sentence, each ``anchor FIELD left FIELD right``."""
    cut = phrases(text.replace(FIELD, " "))
    rows = span_pairs(len(cut), how)
    if len(rows) > limit:
        rows = [rows[i] for i in sorted(rng.choice(len(rows), size=limit, replace=False))]

    def run(r: tuple) -> str:
        return " ".join(cut[r[0]:r[1] + 1])

    return [FIELD.join([" ".join(cut[i] for i in anchor), run(left), run(right)]) for anchor, left, right in rows]


def put_rows(batch: dict, rows: list[int], new: dict, pad_id: int) -> dict:
    """``batch`` with its rows ``rows`` replaced by ``new``'s (both right-padded, widened to fit)."""
    width = max(batch["input_ids"].shape[1], new["input_ids"].shape[1])

    def widen(b, key, value):
        return torch.nn.functional.pad(b[key], (0, width - b[key].shape[1]), value=value)

    ids, mask = widen(batch, "input_ids", pad_id), widen(batch, "attention_mask", 0)
    ids[rows], mask[rows] = widen(new, "input_ids", pad_id), widen(new, "attention_mask", 0)
    return {"input_ids": ids, "attention_mask": mask}


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


class CompCSE(Objective):
    name = "compcse"
    guided_negatives = True
    Params = CompCSEParams
    derives_widths = True  # the halves
    sliceable = False  # HiCL cannot wrap it: it encodes halves through the pooled states and the head

    def __init__(self, params: CompCSEParams):
        super().__init__(params)
        self.project: Optional[nn.Linear] = None  # compose: sbert's (3d -> d) projection
        self.d0: Optional[int] = None  # params.d0 in coordinates, once the embedding size is known

    @classmethod
    def row_expander(cls, params: CompCSEParams):
        if params.subsample == "none":
            return None
        return functools.partial(span_rows, how=params.subsample, limit=params.subsample_max)

    def setup(self, encoder) -> None:
        dim = encoder.embedding_size
        if self.params.d0 is not None and self.params.d0 > dim:
            raise ConfigError(f"objective.d0={self.params.d0:g} exceeds the embedding size {dim}")
        self.d0 = resolve_d0(self.params.d0, dim)
        if self.params.compose == "sbert":
            self.project = nn.Linear(3 * dim, dim)

    def matryoshka_refusal(self) -> Optional[str]:
        if self.params.compose == "sbert" and self.params.compose_at == "head":
            return ("compose sbert projects the full-width projected halves (3d -> d); set compose_at: encoder, or "
                    "compose mean, sum or concat")
        return None

    def collate(self, texts, tokenizer, max_length):
        ids = special_ids(tokenizer)
        fields = [t.split(FIELD) for t in texts]  # a subsampled row: anchor, left part, right part
        full = self.tokenize([f[0] for f in fields], tokenizer, max_length)
        halved = halves(full["input_ids"], full["attention_mask"], ids)
        left, right = halved[0].batch(), halved[1].batch()
        spans = [i for i, f in enumerate(fields) if len(f) == 3]
        if spans:  # their parts are the phrases, each tokenized on its own, not the token halves
            parts = [self.tokenize([fields[i][k] for i in spans], tokenizer, max_length) for k in (1, 2)]
            left, right = put_rows(left, spans, parts[0], ids[2]), put_rows(right, spans, parts[1], ids[2])
        full = {k: v for k, v in full.items() if k != "token_type_ids"}
        return pad_cat([full, left, right], ids[2])

    def loss(self, z: Tensor, pos: Tensor) -> Tensor:
        # (a fraction is a share of the width at hand: under Matryoshka, of each prefix)
        d0 = min(resolve_d0(self.params.d0, z.shape[1]) or z.shape[1], z.shape[1])
        return info_nce(z[:, :d0], pos[:, :d0], self.params.tau)

    def forward(self, encoder, batch) -> LossOutput:
        n = batch["input_ids"].shape[0] // 3
        f = encoder.pooled(batch["input_ids"], batch["attention_mask"])  # sentence and halves in one call
        p = self.params
        if p.compose_at == "head":  # each through the projector, then the projected halves aggregated
            g = encoder.head(f)
            z, pos = g[:n], compose(g[n:2 * n], g[2 * n:], p.compose, self.project)
        else:  # the halves aggregated, then the aggregate through the projector
            z, pos = encoder.head(f[:n]), encoder.head(compose(f[n:2 * n], f[2 * n:], p.compose, self.project))
        return LossOutput(self.loss(z, pos))


def resolve_d0(d0: Optional[float], dim: int) -> Optional[int]:
    """d0 as a number of coordinates: a fraction of ``dim`` below 1 (at least 1), a count from 1."""
    if d0 is None:
        return None
    return max(1, round(d0 * dim)) if d0 < 1 else int(d0)
