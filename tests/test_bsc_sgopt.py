"""BSC and SG-OPT against plain re-implementations of their formulas on small tensors."""

import math

import pytest
import torch

from raycse.errors import ConfigError
from raycse.objectives import registry
from raycse.objectives.bsc import text_key


# ---------------------------------------------------------------------------------------- BSC
def plain_bsc(q, a, y, keys, tau, norm="l2", negs=()):
    """Two-direction log-softmax with label mask and duplicate anchors, written with Python loops.
    ``negs``: hard negatives, extra columns of the q -> a direction only (normalized with the a's)."""
    n, d = len(q), len(q[0])
    a = list(a) + list(negs)

    def l2(v):
        s = math.sqrt(sum(x * x for x in v))
        return [x / s for x in v]

    if norm == "l2":
        qn, an = [l2(v) for v in q], [l2(v) for v in a]
    elif norm == "coord":
        def coord(m):
            spans = [max(r[k] for r in m) - min(r[k] for r in m) for k in range(d)]
            return [[r[k] / spans[k] for k in range(d)] for r in m]
        qn, an = coord(q), coord(a)
    elif norm == "coord_l2":  # Sec. 3.5: L2 normalization by coordinates, across the batch
        def coord_l2(m):
            norms = [math.sqrt(sum(r[k] ** 2 for r in m)) for k in range(d)]
            return [[r[k] / norms[k] for k in range(d)] for r in m]
        qn, an = coord_l2(q), coord_l2(a)
    else:
        qn, an = q, a
    dot = lambda u, v: sum(x * w for x, w in zip(u, v))  # noqa: E731

    def direction(rows, cols, col_label_matters):
        total = 0.0
        for i in range(n):
            if not y[i]:
                continue
            logits = [dot(rows[i], cols[j]) / tau for j in range(len(cols))]
            lse = math.log(sum(math.exp(s) for s in logits))
            pos = [j for j in range(n) if (keys[j] == keys[i] or j == i) and (y[j] or not col_label_matters)]
            total += -sum(logits[j] - lse for j in pos) / len(pos)
        return total / n

    return direction(qn, an, True) + direction(an[:n], qn, False)


@pytest.mark.parametrize("norm", ["l2", "coord_l2"])
def test_bsc_hard_negatives_join_the_first_directions_candidates(norm):
    torch.manual_seed(3)
    q, a, neg = torch.randn(4, 5), torch.randn(4, 5), torch.randn(8, 5)
    score = torch.tensor([1.0, 1.0, 0.0, 1.0])
    keys = torch.arange(4)
    got = _bsc(tau=0.2, normalization=norm).loss(q, a, score, keys, neg)[0].item()
    want = plain_bsc(q.tolist(), a.tolist(), [1, 1, 0, 1], keys.tolist(), 0.2, norm, negs=neg.tolist())
    assert got == pytest.approx(want, rel=1e-5)
    assert abs(want - plain_bsc(q.tolist(), a.tolist(), [1, 1, 0, 1], keys.tolist(), 0.2, norm)) > 1e-3


def _bsc(**kw):
    return registry.build("bsc", kw)


@pytest.mark.parametrize("norm, tau", [("l2", 0.1), ("coord", 2.0), ("coord_l2", 0.5), ("none", 1.0)])
def test_bsc_matches_plain_two_direction_softmax(norm, tau):
    torch.manual_seed(0)
    q, a = torch.randn(5, 4), torch.randn(5, 4)
    score = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])  # two labeled negatives
    keys = torch.arange(5)
    got = _bsc(tau=tau, normalization=norm).loss(q, a, score, keys)[0].item()
    want = plain_bsc(q.tolist(), a.tolist(), [1, 0, 1, 1, 0], keys.tolist(), tau, norm)
    assert got == pytest.approx(want, rel=1e-5)


def test_bsc_duplicate_anchors_are_positives_of_each_other():
    torch.manual_seed(1)
    q, a = torch.randn(4, 3), torch.randn(4, 3)
    q[2] = q[0] + 0.3 * torch.randn(3)  # the same question twice (another dropout view)
    keys = torch.tensor([text_key("q0"), text_key("q1"), text_key("q0"), text_key("q3")])
    score = torch.ones(4)
    obj = _bsc(tau=0.1)
    got = obj.loss(q, a, score, keys)[0].item()
    want = plain_bsc(q.tolist(), a.tolist(), [1] * 4, keys.tolist(), 0.1)
    assert got == pytest.approx(want, rel=1e-5)
    # ... and that differs from treating them as negatives
    assert got != pytest.approx(obj.loss(q, a, score, torch.arange(4))[0].item(), rel=1e-3)


def test_bsc_combo_with_mse_on_scores():
    torch.manual_seed(2)
    q, a = torch.randn(3, 4), torch.randn(3, 4)
    score = torch.tensor([0.9, 0.2, 0.7])
    obj = _bsc(tau=0.1, mu=0.5, threshold=0.5)
    got = obj.loss(q, a, score, torch.arange(3))[0].item()
    bsc = plain_bsc(q.tolist(), a.tolist(), [1, 0, 1], [0, 1, 2], 0.1)
    mse = sum((torch.cosine_similarity(q[i], a[i], dim=0).item() - score[i].item()) ** 2 for i in range(3)) / 3
    assert got == pytest.approx(0.5 * bsc + 0.5 * mse, rel=1e-5)


def test_bsc_trainable_tau_gets_a_gradient_and_moves():
    torch.manual_seed(3)
    obj = _bsc(tau=0.5, trainable_tau=True, tau_lr=0.1)
    assert obj.custom_lr() == {"scale": 0.1}
    q, a = torch.randn(6, 4), torch.randn(6, 4)
    a = q + 0.1 * a  # positives are close: a sharper softmax lowers the loss
    opt = torch.optim.SGD(obj.parameters(), lr=0.1)
    loss, _ = obj.loss(q, a, torch.ones(6), torch.arange(6))
    loss.backward()
    assert obj.scale.grad is not None and obj.scale.grad.abs().item() > 0
    opt.step()
    assert obj.scale.item() != 1.0


def test_bsc_knob_validation():
    for bad, match in (({"mu": 1.5}, "mu must be in"), ({"normalization": "zscore"}, "normalization must be one of"),
                       ({"tau": 0}, "tau must be > 0"), ({"threshold": 1.0}, "threshold")):
        with pytest.raises(ConfigError, match=match):
            _bsc(**bad)


# ---------------------------------------------------------------------------------------- SG-OPT
def plain_opt3(fc, fh, tau):
    """L_opt3 with loops over (i, k): -log e(c_i,h_ik) / (e(c_i,h_ik) + sum_{m!=i} sum_n e(c_i,h_mn))."""
    b, views = len(fh), len(fh[0])

    def e(u, v):
        cos = sum(x * y for x, y in zip(u, v)) / (math.sqrt(sum(x * x for x in u)) * math.sqrt(sum(y * y for y in v)))
        return math.exp(cos / tau)

    total = 0.0
    for i in range(b):
        neg = sum(e(fc[i], fh[m][n]) for m in range(b) if m != i for n in range(views))
        for k in range(views):
            p = e(fc[i], fh[i][k])
            total += -math.log(p / (p + neg))
    return total / (b * views)


@pytest.fixture
def sgopt(tiny_model_no_dropout):
    from raycse.model.encoder import Encoder

    enc = Encoder.from_pretrained(str(tiny_model_no_dropout), pooling="cls_before_pooler")
    obj = registry.build("sgopt", {"tau": 0.1, "lam": 0.1, "proj_hidden": 16})
    obj.setup(enc)
    return enc, obj


def test_sgopt_loss_matches_plain_loop(sgopt):
    _, obj = sgopt
    torch.manual_seed(4)
    c, h = torch.randn(3, 32), torch.randn(3, 4, 32)
    got = obj.loss(c, h).item()
    with torch.no_grad():
        want = plain_opt3(obj.head(c).tolist(), obj.head(h).tolist(), 0.1)
    assert got == pytest.approx(want, rel=1e-5)


def test_sgopt_without_projection_head_compares_the_raw_vectors(tiny_model_no_dropout):
    """proj_hidden 0 (the ablation without a head): L_opt3 by loops on c and h themselves."""
    from raycse.model.encoder import Encoder

    enc = Encoder.from_pretrained(str(tiny_model_no_dropout), pooling="cls_before_pooler")
    obj = registry.build("sgopt", {"tau": 0.1, "proj_hidden": 0})
    obj.setup(enc)
    assert not list(obj.head.parameters())
    torch.manual_seed(5)
    c, h = torch.randn(3, 32), torch.randn(3, 4, 32)
    assert obj.loss(c, h).item() == pytest.approx(plain_opt3(c.tolist(), h.tolist(), 0.1), rel=1e-5)
    with pytest.raises(ConfigError, match="proj_hidden must be >= 0"):
        registry.build("sgopt", {"proj_hidden": -1})


def test_sgopt_head_is_footnote_4s_mlp_with_gelu_after_each_linear(sgopt):
    """f written from footnote 4 ("a two-layered MLP ... Each linear layer in the MLP is followed by
    a GELU function"), on the head's own two weight matrices, then L_opt3 by loops."""
    _, obj = sgopt
    linears = [m for m in obj.head.modules() if isinstance(m, torch.nn.Linear)]
    assert [tuple(m.weight.shape) for m in linears] == [(16, 32), (32, 16)]  # d -> hidden -> d
    (w1, b1), (w2, b2) = [(m.weight.tolist(), m.bias.tolist()) for m in linears]

    def gelu(x):
        return 0.5 * x * (1 + math.erf(x / math.sqrt(2)))

    def f(x):
        hidden = [gelu(sum(w * v for w, v in zip(row, x)) + b) for row, b in zip(w1, b1)]
        return [gelu(sum(w * v for w, v in zip(row, hidden)) + b) for row, b in zip(w2, b2)]

    torch.manual_seed(5)
    c, h = torch.randn(3, 32), torch.randn(3, 3, 32)
    want = plain_opt3([f(x) for x in c.tolist()], [[f(x) for x in views] for views in h.tolist()], 0.1)
    assert obj.loss(c, h).item() == pytest.approx(want, rel=1e-5)
    assert obj.params.layer_pooling == "max"  # Sec. 3.1's p is max pooling


def plain_sampled(fc, fh, pick, tau, variant):
    """Sec. 3.2's L_opt2, L_opt1 and L_base with loops, h_i = the layer sigma picked for sentence i."""
    b = len(fc)
    h = [fh[i][pick[i]] for i in range(b)]

    def phi(u, v):
        cos = sum(x * y for x, y in zip(u, v)) / (math.sqrt(sum(x * x for x in u)) * math.sqrt(sum(y * y for y in v)))
        return math.exp(cos / tau)

    if variant == "opt2":
        return sum(-math.log(phi(fc[i], h[i]) / sum(phi(fc[i], h[j]) for j in range(b))) for i in range(b)) / b
    if variant == "opt1":
        return sum(-math.log(phi(fc[i], h[i]) / (sum(phi(fc[i], fc[j]) for j in range(b) if j != i)
                                                  + sum(phi(fc[i], h[j]) for j in range(b)))) for i in range(b)) / b
    x = fc + h  # X = {c_i} U {h_i}; mu pairs c_i with h_i
    total = 0.0
    for m in range(2 * b):
        partner = m + b if m < b else m - b
        total += -math.log(phi(x[m], x[partner]) / sum(phi(x[m], x[n]) for n in range(2 * b) if n != m))
    return total / (2 * b)


@pytest.mark.parametrize("variant", ["opt2", "opt1", "base"])
def test_sgopt_ablation_objectives_match_their_formulas(tiny_model_no_dropout, variant):
    from raycse.model.encoder import Encoder

    enc = Encoder.from_pretrained(str(tiny_model_no_dropout), pooling="cls_before_pooler")
    obj = registry.build("sgopt", {"tau": 0.1, "proj_hidden": 16, "variant": variant})
    obj.setup(enc)
    torch.manual_seed(6)
    c, h = torch.randn(4, 32), torch.randn(4, 3, 32)
    pick = torch.tensor([0, 2, 1, 2])
    got = obj.sampled_loss(c, h, pick).item()
    with torch.no_grad():
        want = plain_sampled(obj.head(c).tolist(), obj.head(h).tolist(), pick.tolist(), 0.1, variant)
    assert got == pytest.approx(want, rel=1e-5)
    out = obj(enc, enc.tokenize(["the city river", "a king", "north road"]))  # sigma samples inside
    assert torch.isfinite(out.loss) and variant in out.metrics


def test_sgopt_layer_sampler_is_uniform(sgopt):
    """sigma picks one layer per sentence uniformly over the range (chi-square over 3,000 picks)."""
    from scipy.stats import chisquare

    _, obj = sgopt
    torch.manual_seed(8)
    picks = torch.cat([obj.sample_layers(100, 3, torch.device("cpu")) for _ in range(30)]).tolist()
    counts = [picks.count(k) for k in range(3)]
    assert sum(counts) == 3000 and chisquare(counts).pvalue > 1e-3, counts


def test_sgopt_views_cover_every_layer_and_pool(sgopt):
    enc, obj = sgopt
    batch = enc.tokenize(["the city river", "a king"])
    h = obj.views(batch)
    assert h.shape == (2, 3, 32)  # embedding output + 2 layers
    with torch.no_grad():
        hs = obj.frozen(**batch, output_hidden_states=True).hidden_states
    m = batch["attention_mask"][1].bool()
    for k in range(3):  # max pooling over sentence 1's real tokens, per coordinate
        want = [max(hs[k][1][t][j].item() for t in range(len(m)) if m[t]) for j in range(32)]
        assert h[1, k].tolist() == pytest.approx(want, abs=1e-6)
    obj.params.layer_pooling = "mean"
    assert torch.allclose(obj.views(batch)[1, 2], hs[2][1][m].mean(0), atol=1e-6)


def test_sgopt_regularizer_zero_at_start_frozen_copy_never_changes(sgopt):
    from raycse.train.module import TrainModule

    enc, obj = sgopt
    module = TrainModule(enc, obj).train()
    assert obj.regularizer(enc).item() == 0.0
    assert not obj.frozen.training and not any(p.requires_grad for p in obj.frozen.parameters())
    assert not any(p.requires_grad for p in enc.backbone.embeddings.parameters())
    before = [p.clone() for p in obj.frozen.parameters()]
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-2)
    batch = obj.collate(["the city river", "a small king", "summer music", "old stone bridge"], enc.tokenizer, 16)
    for _ in range(2):
        out = module(batch)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(before, obj.frozen.parameters()))
    assert obj.regularizer(enc).item() > 0
    # only T is saved: the frozen copy and the projection head are not part of the encoder
    assert not any(k.startswith(("frozen", "head")) for k in enc.state_dict())


def test_sgopt_knob_validation(tiny_model_no_dropout):
    from raycse.model.encoder import Encoder

    with pytest.raises(ConfigError, match="layer_pooling"):
        registry.build("sgopt", {"layer_pooling": "sum"})
    with pytest.raises(ConfigError, match="lam must be >= 0"):
        registry.build("sgopt", {"lam": -1})
    obj = registry.build("sgopt", {"layer_end": 9})
    with pytest.raises(ConfigError, match="has 2 layers"):
        obj.setup(Encoder.from_pretrained(str(tiny_model_no_dropout)))


def test_bsc_unsupervised_sentences_become_symmetric_simcse(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    obj = _bsc(tau=0.05)
    batch = obj.collate(["the city", "a king", "the city"], tok, 16)
    n = 3
    assert torch.equal(batch["input_ids"][:n], batch["input_ids"][n:])  # (s, s): two dropout views
    assert batch["score"].tolist() == [1.0, 1.0, 1.0]
    assert batch["q_key"][0] == batch["q_key"][2] != batch["q_key"][1]  # duplicates found by text
    with pytest.raises(ConfigError, match="mu < 1 needs scored pairs"):
        _bsc(mu=0.5).collate(["a", "b"], tok, 16)


def test_a_checkpoint_with_the_earlier_0d_learned_scale_resumes():
    """BSC's learned scale is 1-d (FSDP2 shards no 0-d parameter); a checkpoint of an earlier release, its scale and
    AdamW's moments 0-d, loads into it and the next step runs."""
    import torch

    from raycse.objectives.bsc import BSC, BSCParams
    from raycse.train.checkpoints.files import shape_state_as_parameters

    obj = BSC(BSCParams(trainable_tau=True))
    assert obj.scale.shape == (1,)
    obj.load_state_dict({"scale": torch.tensor(1.25)})
    assert obj.scale.tolist() == [1.25]
    opt = torch.optim.AdamW(obj.parameters(), lr=0.1)
    old = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.tensor(0.5), "exp_avg_sq": torch.tensor(0.25)}},
           "param_groups": [{**{k: v for k, v in opt.param_groups[0].items() if k != "params"}, "params": [0]}]}
    opt.load_state_dict(old)
    shape_state_as_parameters(opt)
    assert opt.state[obj.scale]["exp_avg"].shape == (1,) and opt.state[obj.scale]["step"].shape == ()
    obj.scale.grad = torch.ones(1)
    opt.step()
    assert obj.scale.shape == (1,) and obj.scale.item() != 1.25
