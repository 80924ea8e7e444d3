"""SG-OPT: self-guided contrastive learning (Kim et al., 2021), loss L_opt3 and its ablations.

A frozen copy F of the encoder provides the views: for each layer k in the chosen range
(0 = embedding output) the pooled hidden states h_ik of sentence i. The trained copy T (its
embedding layer frozen) gives c_i. Both go through one shared projection head f and, with
e(u, v) = exp(sim(f(u), f(v)) / tau),

    L_opt3 = 1/(b(l+1)) sum_i sum_k -log e(c_i, h_ik) / ( e(c_i, h_ik) + sum_{m != i} sum_n e(c_i, h_mn) )
    L = L_opt3 + lambda * sum_params ||theta_T - theta_F||^2

No c-c and no h-h terms; the negatives of anchor i (every view of every other sentence, gathered
from all workers) are shared by its l+1 positives.

The ablation's objectives (Sec. 3.2, ``variant``), with sigma picking one layer k_i per sentence
uniformly from the range and h_i = h_{i,k_i}:

    base: X = {c_i} U {h_i}; for each x_m: -log phi(x_m, mu(x_m)) / sum_{n != m} phi(x_m, x_n),
          mu pairing c_i <-> h_i; mean over the 2b anchors
    opt1: -log phi(c_i, h_i) / ( sum_{j != i} phi(c_i, c_j) + sum_j phi(c_i, h_j) )
    opt2: -log phi(c_i, h_i) / sum_j phi(c_i, h_j)
    opt3: the loss above (every layer of F, no sampling)

Paper details (Kim et al. 2021): f is "a two-layered MLP whose hidden size is 4096. Each linear
layer in the MLP is followed by a GELU function" (footnote 4): Linear(d, 4096), GELU, Linear(4096,
d), GELU; ``proj_hidden: 0`` drops it (f = identity: the ablation without a projection head). The pooling p of the views is max pooling (Sec. 3.1, the default here); the appendix's
SentEval runs use mean pooling (``layer_pooling: mean``, with ``layer_start`` to skip early layers).

Choices, deliberate: F runs in eval mode (no dropout) under ``torch.no_grad`` so its forward stores
no activations (the authors' code leaves F in train mode by accident); c_i uses the encoder's
pooling (the paper's [CLS]: ``--pooling cls_before_pooler``); only T is saved, F and f are dropped.
Memory: F is a second full copy of the weights (all-MiniLM-L6-v2: 22.7M params = 91 MB in fp32;
BERT-base: 440 MB) with no gradients or optimizer state, plus f (2 x d x 4096 params).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raycse.errors import ConfigError
from raycse.model.unpad import backbone_forward
from raycse.objectives.base import LossOutput, Objective, Params, positive
from raycse.objectives.contrastive import cosine_logits, gather, local_offset

LAYER_POOLINGS = ("max", "mean")
VARIANTS = ("opt3", "opt2", "opt1", "base")


@dataclass
class SGOPTParams(Params):
    tau: float = 0.01
    lam: float = 0.1  # weight of the regularizer sum ||theta_T - theta_F||^2 ("lambda")
    layer_pooling: str = "max"  # Sec. 3.1; the appendix's SentEval setting uses mean
    layer_start: int = 0  # 0 = the embedding output
    layer_end: Optional[int] = None  # inclusive; None = the last layer
    proj_hidden: int = 4096
    variant: str = "opt3"  # opt3 (the method) | opt2 | opt1 | base: Sec. 3.2's ablation

    def validate(self) -> None:
        positive("tau", self.tau, " (SG-OPT uses 0.01)")
        if self.lam < 0:
            raise ConfigError(f"objective.lam must be >= 0, got {self.lam}")
        if self.layer_pooling not in LAYER_POOLINGS:
            raise ConfigError(f"objective.layer_pooling must be one of {', '.join(LAYER_POOLINGS)}, got {self.layer_pooling!r}")
        if self.layer_start < 0 or (self.layer_end is not None and self.layer_end < self.layer_start):
            raise ConfigError(f"objective layer range [{self.layer_start}, {self.layer_end}] is empty or negative")
        if self.variant not in VARIANTS:
            raise ConfigError(f"objective.variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if self.proj_hidden < 0:
            raise ConfigError(f"objective.proj_hidden must be >= 0 (0: no projection head), got {self.proj_hidden}")


def pool_layers(hidden_states: tuple[Tensor, ...], mask: Tensor, how: str) -> Tensor:
    """(b, L, d) per layer -> (b, layers, d) by masked mean or max over tokens."""
    h = torch.stack(hidden_states, dim=1)  # (b, layers, t, d)
    m = mask[:, None, :, None].to(h.dtype)
    if how == "mean":
        return (h * m).sum(2) / m.sum(2).clamp(min=1e-9)
    return h.masked_fill(m == 0, torch.finfo(h.dtype).min).max(2).values


class ProjectionHead(nn.Module):
    """f of footnote 4: each of the two linear layers is followed by a GELU."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim), nn.GELU())

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class SGOPT(Objective):
    name = "sgopt"
    Params = SGOPTParams
    sliceable = False  # HiCL cannot wrap it: its views come from every layer of the whole sequence

    def __init__(self, params: SGOPTParams):
        super().__init__(params)
        self.frozen: Optional[nn.Module] = None
        self.head: Optional[nn.Module] = None

    def setup(self, encoder) -> None:
        """Copy the encoder's backbone into F (frozen) and freeze T's embedding layer."""
        if len(getattr(encoder, "dense", ())):  # c would be projected, F's layers not: two spaces
            raise ConfigError("sgopt compares the sentence vector with the backbone's hidden layers, and this model "
                              "maps its vector through Dense modules after pooling; use a model without them")
        self.frozen = copy.deepcopy(encoder.backbone).eval()
        self.frozen.requires_grad_(False)
        embeddings = getattr(encoder.backbone, "embeddings", None)
        if embeddings is None:
            raise ConfigError("sgopt needs a backbone with an .embeddings module (BERT-style encoders)")
        embeddings.requires_grad_(False)
        # proj_hidden 0: the "without projection head" ablation, f = identity
        self.head = (ProjectionHead(encoder.hidden_size, self.params.proj_hidden) if self.params.proj_hidden
                     else nn.Identity())
        n_layers = int(encoder.backbone.config.num_hidden_layers)
        end = self.params.layer_end if self.params.layer_end is not None else n_layers
        if end > n_layers:
            raise ConfigError(f"objective.layer_end={end} but the model has {n_layers} layers (0..{n_layers})")
        self.layers = slice(self.params.layer_start, end + 1)

    def matryoshka_refusal(self) -> Optional[str]:
        return ("its projection head scores the embedding against the frozen copy's full-width hidden layers; drop "
                "matryoshka_dims or choose another objective")

    def lora_refusal(self) -> Optional[str]:
        if self.params.lam > 0:  # with adapters, T's weights are F's plus (alpha / r) B A: the sum is not Sec. 3's
            return ("its regularizer lam * sum ||theta_T - theta_F||^2 compares every backbone weight with the frozen "
                    "copy's, and LoRA trains none of them; set objective.lam=0 or drop model.lora")
        return None

    def train(self, mode: bool = True):
        super().train(mode)
        if self.frozen is not None:
            self.frozen.eval()  # F never uses dropout
        return self

    def collate(self, texts, tokenizer, max_length):
        return self.tokenize(texts, tokenizer, max_length)

    def views(self, batch: dict, **options) -> Tensor:
        """F's pooled layers; ``options``: how T runs (``Encoder.forward_options``: unpadded, oneDNN), same values."""
        with torch.no_grad():
            out = backbone_forward(self.frozen, batch["input_ids"], batch["attention_mask"],
                                   batch.get("token_type_ids"), output_hidden_states=True, **options)
        return pool_layers(out.hidden_states[self.layers], batch["attention_mask"], self.params.layer_pooling)

    def loss(self, c: Tensor, h: Tensor) -> Tensor:
        """L_opt3 for c (b, d) and views h (b, l+1, d), with the projection head applied here."""
        b, views, _ = h.shape
        fc = self.head(c.float())
        fh = gather(self.head(h.float()).reshape(b * views, -1))  # (B*(l+1), d), rank-major
        logits = cosine_logits(fc, fh, self.params.tau).view(b, -1, views)  # (b, B, l+1)
        own = torch.arange(b, device=c.device) + local_offset(b)
        pos = logits[torch.arange(b), own]  # (b, l+1): s(c_i, h_ik)
        others = logits.clone()
        others[torch.arange(b), own] = float("-inf")
        neg = torch.logsumexp(others.flatten(1), dim=1, keepdim=True)  # log sum_{m != i, n} e(c_i, h_mn)
        return (torch.logaddexp(pos, neg) - pos).mean()

    @staticmethod
    def sample_layers(b: int, views: int, device) -> Tensor:
        """sigma: one layer of the range per sentence, uniformly."""
        return torch.randint(views, (b,), device=device)

    def sampled_loss(self, c: Tensor, h: Tensor, pick: Optional[Tensor] = None) -> Tensor:
        """L_opt2, L_opt1 or L_base on one layer per sentence (sigma: ``pick``, uniform by default)."""
        b, views, _ = h.shape
        if pick is None:
            pick = self.sample_layers(b, views, h.device)
        fc = self.head(c.float())
        fh = self.head(h[torch.arange(b, device=h.device), pick].float())
        tau, own = self.params.tau, torch.arange(b, device=c.device) + local_offset(b)
        fc_all, fh_all = gather(fc), gather(fh)
        ch = cosine_logits(fc, fh_all, tau)  # (b, B): phi(c_i, h_j)
        if self.params.variant == "opt2":
            return F.cross_entropy(ch, own)
        cc = cosine_logits(fc, fc_all, tau)
        cc[torch.arange(b), own] = float("-inf")  # no phi(c_i, c_i)
        if self.params.variant == "opt1":
            return F.cross_entropy(torch.cat([ch, cc], dim=1), own)
        # base: anchors c_i and h_i over X = {c} U {h} without themselves; the partner is the positive
        hc = cosine_logits(fh, fc_all, tau)
        hh = cosine_logits(fh, fh_all, tau)
        hh[torch.arange(b), own] = float("-inf")
        return (F.cross_entropy(torch.cat([ch, cc], dim=1), own)
                + F.cross_entropy(torch.cat([hc, hh], dim=1), own)) / 2

    def regularizer(self, encoder) -> Tensor:
        total = 0.0
        for p_t, p_f in zip(encoder.backbone.parameters(), self.frozen.parameters()):
            if p_t.requires_grad:
                term = (p_t - p_f).pow(2).sum()
                # a sharded run's block weights are each worker's shard (DTensor) outside their forward: the
                # sum of the shards' sums is the whole weight's (an all-reduce; its gradient stays with the shard)
                total = total + (term.full_tensor() if hasattr(term, "full_tensor") else term)
        return total

    def forward(self, encoder, batch) -> LossOutput:
        c = encoder(**batch)
        h = self.views(batch, **encoder.forward_options())
        variant = self.params.variant
        contrast = self.loss(c, h) if variant == "opt3" else self.sampled_loss(c, h)
        reg = self.regularizer(encoder) if self.params.lam > 0 else torch.zeros((), device=c.device)
        return LossOutput(contrast + self.params.lam * reg,
                          {variant: contrast.detach(), "reg": reg.detach()})
