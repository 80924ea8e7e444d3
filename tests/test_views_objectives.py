"""HiCL, LA(SER)^3 and CompCSE against plain computations of their formulas."""

import math

import pytest
import torch

from raycse.errors import ConfigError
from raycse.objectives import registry
from raycse.objectives.contrastive import cosine_logits
from raycse.objectives.laser import split_document


def plain_masked_nce(z1, z2, owner, tau):
    """Loop form of HiCL's local loss: denominator = own second view + other sequences' segments."""
    logits = cosine_logits(z1, z2, tau)
    total = 0.0
    for i in range(len(owner)):
        keep = [j for j in range(len(owner)) if j == i or owner[j] != owner[i]]
        total += -(logits[i, i].item() - math.log(sum(math.exp(logits[i, j].item()) for j in keep)))
    return total / len(owner)


def test_hicl_local_loss_masks_same_sequence_segments():
    torch.manual_seed(0)
    z1, z2 = torch.randn(5, 4), torch.randn(5, 4)
    owner = torch.tensor([0, 0, 0, 1, 2])
    obj = registry.build("hicl", {"alpha": 0.1, "tau": 0.1})
    assert obj.local_loss(z1, z2, owner).item() == pytest.approx(plain_masked_nce(z1, z2, owner.tolist(), 0.1), rel=1e-5)


def test_hicl_entailment_loss_targets_own_sequence():
    torch.manual_seed(1)
    z, h = torch.randn(4, 3), torch.randn(2, 3)
    owner = torch.tensor([0, 0, 1, 1])
    obj = registry.build("hicl", {"alpha": 0.1, "beta": 1e-4, "tau": 0.5})
    logits = cosine_logits(z, h, 0.5)
    want = sum(-(logits[k, owner[k]].item() - math.log(sum(math.exp(x) for x in logits[k].tolist())))
               for k in range(4)) / 4
    assert obj.entailment_loss(z, h, owner).item() == pytest.approx(want, rel=1e-5)


def test_hicl_alpha_zero_equals_base_when_every_sequence_fits_one_segment(tiny_model_no_dropout):
    from raycse.model.encoder import Encoder

    enc = Encoder.from_pretrained(str(tiny_model_no_dropout), pooling="mean").train()
    texts = ["the city river was built", "a king", "summer music festival in the large old city", "north"]
    hicl = registry.build("hicl", {"alpha": 0.0, "slice_length": 64})
    hicl.setup(enc)
    simcse = registry.build("simcse", {})
    batch = simcse.collate(texts, enc.tokenizer, 64)
    assert hicl(enc, batch).loss.item() == pytest.approx(simcse(enc, batch).loss.item(), abs=1e-5)


def test_hicl_slices_long_sequences_and_pools_weighted(tiny_model_no_dropout):
    from raycse.model.encoder import Encoder
    from raycse.objectives.hicl import SegmentedEncoder
    from raycse.objectives.views import special_ids

    enc = Encoder.from_pretrained(str(tiny_model_no_dropout), pooling="mean").eval()
    long_text = " ".join(["river city music"] * 10)  # 30 tokens -> segments of 8: 8, 8, 8, 6
    batch = enc.tokenize([long_text, "a king"], max_length=64)
    proxy = SegmentedEncoder(enc, 8, True, special_ids(enc.tokenizer))
    with torch.no_grad():
        h = proxy(**batch)
        pieces, z, _, _ = proxy.calls[0]
    assert pieces.length.tolist() == [8, 8, 8, 6, 2]
    want = (z[:4] * torch.tensor([8.0, 8, 8, 6])[:, None]).sum(0) / 30
    assert torch.allclose(h[0], want, atol=1e-6) and torch.allclose(h[1], z[4], atol=1e-6)


class Recorder(torch.nn.Module):
    """The real encoder, with every call's inputs and outputs kept (to rebuild the loss by hand)."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder, self.tokenizer, self.calls = encoder, encoder.tokenizer, []

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        self.calls.append((input_ids, attention_mask, out))
        return out


def test_hicl_entailment_pairs_each_segment_with_its_sequence_from_the_same_view(tiny_model):
    """HiCLv2 (appendix eq. 3): -log exp(sim(h_ij, h_i)/tau) / sum_k exp(sim(h_ij, h_k)/tau) with h_i
    pooled from the same forward pass (dropout view) as h_ij. Rebuilt by loops from the segments
    the encoder returned: queue-rule segments of L tokens, length-weighted mean per sequence."""
    from raycse.model.encoder import Encoder

    enc = Encoder.from_pretrained(str(tiny_model), pooling="mean").train()  # dropout on: the views differ
    texts = ["the city river was built in the north", "a king", "summer music festival in the large old city"]
    L, tau = 3, 0.5
    obj = registry.build("hicl", {"alpha": 0.1, "beta": 0.2, "slice_length": L, "tau": tau})
    obj.setup(enc)
    rec = Recorder(enc)
    torch.manual_seed(0)
    out = obj(rec, obj.collate(texts, enc.tokenizer, 32))
    (_, _, z), = rec.calls  # one encoder call: both views of every segment
    counts = [len(enc.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    segs = [(i, min(L, c - j * L)) for i, c in enumerate(counts) for j in range(1 + (c - 1) // L)]
    assert z.shape[0] == 2 * len(segs)
    z1 = z[:len(segs)].tolist()  # view 1 of every segment, in sequence order

    def pooled(view: list) -> list:
        return [[sum(view[s][d] * n for s, (i, n) in enumerate(segs) if i == seq) / counts[seq]
                 for d in range(len(view[0]))] for seq in range(len(texts))]

    def cos(u, v):
        return sum(a * b for a, b in zip(u, v)) / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))

    h1 = pooled(z1)
    want = 0.0
    for s, (i, _) in enumerate(segs):
        want += -(cos(z1[s], h1[i]) / tau - math.log(sum(math.exp(cos(z1[s], h) / tau) for h in h1)))
    assert out.metrics["entailment"] == pytest.approx(want / len(segs), rel=1e-4)
    h2 = pooled(z[len(segs):].tolist())  # the other view's sequence vectors give another value
    other = sum(-(cos(z1[s], h2[i]) / tau - math.log(sum(math.exp(cos(z1[s], h) / tau) for h in h2)))
                for s, (i, _) in enumerate(segs)) / len(segs)
    assert abs(other - want / len(segs)) > 1e-3


@pytest.mark.parametrize("base", ["simcse", "bsc", "laser"])
def test_hicl_accepts_the_bases_it_can_slice(base):
    assert registry.build("hicl", {"base": base}).base.name == base


@pytest.mark.parametrize("base", ["compcse", "sgopt", "hicl"])
def test_hicl_refuses_bases_it_cannot_slice_before_anything_starts(base):
    with pytest.raises(ConfigError) as err:
        registry.build("hicl", {"base": base})
    assert str(err.value) == f"objective.base '{base}' cannot be sliced by HiCL; choose one of: bsc, laser, simcse"


def test_hicl_one_temperature_for_every_term():
    """A search that sets HiCL's tau (search_spaces/combined.yaml) sets it for the global term too."""
    obj = registry.build("hicl", {"tau": 0.2})
    assert obj.base.params.tau == 0.2 and obj.tau == 0.2
    over_bsc = registry.build("hicl", {"base": "bsc"})  # unset: the base's own default everywhere
    assert over_bsc.base.params.tau == 0.1 and over_bsc.tau == 0.1
    own = registry.build("hicl", {"tau": 0.2, "base_params": {"tau": 0.05}})
    assert own.base.params.tau == 0.05 and own.tau == 0.2  # both named: each as asked


def test_hicl_knobs():
    with pytest.raises(ConfigError, match="alpha \\+ beta <= 1"):
        registry.build("hicl", {"alpha": 0.8, "beta": 0.3})
    with pytest.raises(ConfigError, match="slice_length must be >= 1"):
        registry.build("hicl", {"slice_length": 0})
    with pytest.raises(ConfigError, match="no knob"):
        registry.build("hicl", {"base": "simcse", "base_params": {"alpha": 1}})
    assert registry.build("hicl", {"base": "bsc", "base_params": {"mu": 1.0}}).accepts == ("single", "pairs")


def test_laser_self_reference_batch_and_loss(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    obj = registry.build("laser", {"m_mode": "fixed", "m": 3})
    batch = obj.collate(["the city", "a small king was born"], tok, 16)
    assert batch["m"].tolist() == [3, 2]  # 5 tokens x 3 would not fit 14 content slots
    assert batch["p_attention_mask"].sum(1).tolist() == [2 * 3 + 2, 5 * 2 + 2]
    assert (batch["p_attention_mask"].sum(1) <= 16).all()
    torch.manual_seed(0)
    a, p = torch.randn(3, 4), torch.randn(3, 4)
    logits = cosine_logits(a, p, 0.05)
    want = sum(-(logits[i, i].item() - math.log(sum(math.exp(x) for x in logits[i].tolist()))) for i in range(3)) / 3
    assert obj.loss(a, p).item() == pytest.approx(want, rel=1e-5)


def test_laser_intra_reference_splits_documents(tiny_model):
    from transformers import AutoTokenizer

    assert split_document("The city was built. It grew fast! Then it fell.") == ("The city was built.", "It grew fast! Then it fell.")
    assert split_document("One sentence only") == ("One sentence only", "One sentence only")
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    obj = registry.build("laser", {"mode": "intra"})
    batch = obj.collate(["the city. a king was born. north", "music"], tok, 32)
    assert batch["p_attention_mask"][0].sum() == len(tok("a king was born. north")["input_ids"])


@pytest.mark.parametrize("how, d0, at", [("mean", None, "head"), ("sum", 16, "head"), ("concat", None, "head"),
                                         ("sbert", 16, "head"), ("mean", 0.5, "encoder"), ("sbert", None, "encoder"),
                                         ("concat", None, "encoder")])
def test_compcse_positive_aggregates_projected_halves(tiny_model_no_dropout, how, d0, at):
    """Sec. 3 (compose_at head): the halves go through the encoder *and the linear projector*, then
    their projected vectors are aggregated (Table 3's variants); Fig. 1 and the authors' code
    (compose_at encoder): the encoder's vectors of the halves are aggregated, then projected. d0 0.5
    is half the 32 coordinates. Plain computation: each text encoded on its own."""
    from raycse.model.encoder import Encoder

    enc = Encoder.from_pretrained(str(tiny_model_no_dropout), pooling="cls", mlp_head="train_only").train()
    obj = registry.build("compcse", {"compose": how, "d0": d0, "tau": 0.1, "compose_at": at})
    obj.setup(enc)
    texts = ["the city river was built", "a king", "summer music festival"]
    batch = obj.collate(texts, enc.tokenizer, 32)
    assert batch["input_ids"].shape[0] == 9
    got = obj(enc, batch).loss
    halves_text = [("the city river", "was built"), ("a", "king"), ("summer music", "festival")]
    with torch.no_grad():
        f = lambda xs: enc.backbone(**enc.tokenize(xs)).last_hidden_state[:, 0]  # noqa: E731
        g = lambda xs: enc.mlp(f(xs))  # noqa: E731
        z = g(texts)
        pos = []
        for (left_text, right_text) in halves_text:
            u, v = (g([left_text])[0], g([right_text])[0]) if at == "head" else (f([left_text])[0], f([right_text])[0])
            if how == "mean":
                pos.append([(a + b) / 2 for a, b in zip(u.tolist(), v.tolist())])
            elif how == "sum":
                pos.append([a + b for a, b in zip(u.tolist(), v.tolist())])
            elif how == "concat":  # first half of the left vector's coordinates, last half of the right's
                pos.append(u.tolist()[:16] + v.tolist()[16:])
            else:  # (u, v, |u - v|) projected back to d
                feats = u.tolist() + v.tolist() + [abs(a - b) for a, b in zip(u.tolist(), v.tolist())]
                w, b = obj.project.weight.tolist(), obj.project.bias.tolist()
                pos.append([sum(x * y for x, y in zip(row, feats)) + bias for row, bias in zip(w, b)])
        pos = torch.tensor(pos) if at == "head" else enc.mlp(torch.tensor(pos))
        k = {None: 32, 0.5: 16}.get(d0, d0)
        logits = cosine_logits(z[:, :k], pos[:, :k], 0.1)
    want = sum(-(logits[i, i].item() - math.log(sum(math.exp(x) for x in logits[i].tolist()))) for i in range(3)) / 3
    assert got.item() == pytest.approx(want, rel=1e-4)


def test_compcse_knobs(tiny_model_no_dropout):
    from raycse.model.encoder import Encoder

    enc = Encoder.from_pretrained(str(tiny_model_no_dropout), pooling="cls", mlp_head="train_only")
    with pytest.raises(ConfigError, match="exceeds the embedding size"):
        registry.build("compcse", {"d0": 64}).setup(enc)
    with pytest.raises(ConfigError, match="d0 does not apply with compose: concat"):
        registry.build("compcse", {"compose": "concat", "d0": 16})
    with pytest.raises(ConfigError, match="compose must be one of mean, sum, concat, sbert"):
        registry.build("compcse", {"compose": "max"})
    with pytest.raises(ConfigError, match="compose_at must be one of head, encoder"):
        registry.build("compcse", {"compose_at": "loss"})
    with pytest.raises(ConfigError, match="d0 must be a fraction in"):
        registry.build("compcse", {"d0": 1.5})
    with pytest.raises(ConfigError, match="d0 must be a fraction in"):
        registry.build("compcse", {"d0": 0})


@pytest.mark.parametrize("base, params, examples", [
    ("bsc", {"mu": 0.5}, [("the city river", "a river city", 0.9), ("a king", "north road", 0.1),
                          ("summer music festival in the city", "music in summer", 0.7)]),
    ("laser", {"m_mode": "fixed", "m": 2}, ["the city river was built", "a king", "summer music festival"]),
])
def test_hicl_wraps_other_bases_without_a_new_class(tiny_model, base, params, examples):
    from raycse.model.encoder import Encoder

    enc = Encoder.from_pretrained(str(tiny_model), pooling="mean").train()
    obj = registry.build("hicl", {"base": base, "base_params": params, "alpha": 0.1, "beta": 0.01, "slice_length": 2})
    obj.setup(enc)
    out = obj(enc, obj.collate(examples, enc.tokenizer, 32))
    assert torch.isfinite(out.loss) and {"global", "local", "entailment"} <= set(out.metrics)
    out.loss.backward()
    assert enc.backbone.encoder.layer[0].output.dense.weight.grad is not None


def test_laser_random_elongation_factor_is_uniform_over_its_range(tiny_model):
    """Sec. 3 of LA(SER)^3: for each input m is drawn uniformly from [1, floor(max_len / len)].
    The distribution of the m the batches use, not only its range: a chi-square test per length."""
    from scipy.stats import chisquare
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    obj = registry.build("laser", {"m_mode": "random"})
    texts = {2: "the city", 5: "a small king was born", 7: "the north river city was built early"}
    torch.manual_seed(0)
    for n_tokens, text in texts.items():
        assert len(tok(text, add_special_tokens=False)["input_ids"]) == n_tokens
        ms = torch.cat([obj.collate([text] * 500, tok, 32)["m"] for _ in range(6)]).tolist()
        high = 30 // n_tokens  # 32 - [CLS] - [SEP] content slots
        counts = [ms.count(m) for m in range(1, high + 1)]
        assert sum(counts) == len(ms)  # nothing outside [1, high]
        assert chisquare(counts).pvalue > 1e-3, (n_tokens, counts)


def test_laser_anchor_sentence_first_or_random(tiny_model):
    """Intra-reference anchors the first sentence (main experiments) or a random one (Sec. 5.1),
    the positive being the rest of the document; self-reference can anchor the first sentence of
    a multi-sentence line."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    doc = "the city was built. a king was born! north road"
    sentences = ["the city was built.", "a king was born!", "north road"]

    def decode(ids, mask):
        return tok.decode(ids[mask.bool()][1:-1])

    seen = {}
    torch.manual_seed(1)
    obj = registry.build("laser", {"mode": "intra", "anchor": "random", "m_mode": "fixed", "m": 1})
    for _ in range(300):
        b = obj.collate([doc], tok, 64)
        anchor, positive = decode(b["a_input_ids"][0], b["a_attention_mask"][0]), \
            decode(b["p_input_ids"][0], b["p_attention_mask"][0])
        seen[anchor] = seen.get(anchor, 0) + 1
        i = [tok.decode(tok(s)["input_ids"][1:-1]) for s in sentences].index(anchor)
        rest = " ".join(s for j, s in enumerate(sentences) if j != i)
        assert positive == tok.decode(tok(rest)["input_ids"][1:-1])
    assert len(seen) == 3 and min(seen.values()) > 60, seen  # each sentence about a third of the time

    first = registry.build("laser", {"mode": "intra", "m_mode": "fixed", "m": 1}).collate([doc], tok, 64)
    assert decode(first["a_input_ids"][0], first["a_attention_mask"][0]) == "the city was built."
    own = registry.build("laser", {"anchor": "first", "m_mode": "fixed", "m": 2}).collate([doc], tok, 64)
    assert decode(own["a_input_ids"][0], own["a_attention_mask"][0]) == "the city was built."
    assert decode(own["p_input_ids"][0], own["p_attention_mask"][0]) == "the city was built. the city was built."
    # the default, as the paper's main experiments: the first sentence of each document, in both modes
    default = registry.build("laser", {"m_mode": "fixed", "m": 1}).collate([doc], tok, 64)
    assert decode(default["a_input_ids"][0], default["a_attention_mask"][0]) == "the city was built."
    line = registry.build("laser", {"anchor": "line", "m_mode": "fixed", "m": 1}).collate([doc], tok, 64)
    assert decode(line["a_input_ids"][0], line["a_attention_mask"][0]) == tok.decode(tok(doc)["input_ids"][1:-1])
    with pytest.raises(ConfigError, match="anchor line needs mode self"):
        registry.build("laser", {"mode": "intra", "anchor": "line"})


# ---- CompCSE subsampling (ablation): extra rows from spans of phrases, written from the words
SENTENCE_PHRASES = ["In the north,", "the old city grew;", "its river port", "(the largest) expanded", "and trade rose."]


def _words_rows(how: str) -> set:
    """The ablation's rows from its words, as (anchor, left part, right part) phrase tuples."""
    C = SENTENCE_PHRASES
    n = len(C)
    out = set()
    if how == "adjacent":  # each unique pair of the non-overlapping phrases
        for i in range(n):
            for j in range(n):
                if i < j and not (i == 0 and j == n - 1 and n == 2):
                    out.add((C[i] + " " + C[j], C[i], C[j]))
    elif how == "overlapping":  # pairs of spans that may overlap: neither holds the other, their union is a span
        spans = [frozenset(range(a, b)) for a in range(n) for b in range(a + 1, n + 1)]
        for A in spans:
            for B in spans:
                union = A | B
                if A <= B or B <= A or min(A) > min(B):
                    continue
                if sorted(union) != list(range(min(union), max(union) + 1)) or len(union) == n:
                    continue
                join = lambda s: " ".join(C[k] for k in sorted(s))  # noqa: E731
                out.add((join(union), join(A), join(B)))
    else:  # C recursively partitioned in half (left takes the odd one); every part below the root
        todo = [list(C)]
        while todo:
            part = todo.pop()
            if len(part) < 2:
                continue
            cut = math.ceil(len(part) / 2)
            if part != C:
                out.add((" ".join(part), " ".join(part[:cut]), " ".join(part[cut:])))
            todo += [part[:cut], part[cut:]]
    return out


@pytest.mark.parametrize("how", ["adjacent", "overlapping", "subsuming"])
def test_compcse_subsample_rows_follow_the_ablation(how):
    import numpy as np

    from raycse.objectives.compcse import FIELD

    text = " ".join(SENTENCE_PHRASES[:3]) + " " + SENTENCE_PHRASES[3] + " - " + SENTENCE_PHRASES[4]
    expander = registry.get("compcse").row_expander(registry.build_params("compcse", {"subsample": how,
                                                                                      "subsample_max": 1000}))
    rows = expander(text, np.random.default_rng(0))
    assert len(rows) == len(set(rows))
    got = {tuple(r.split(FIELD)) for r in rows}
    want = _words_rows(how)
    assert got == want and len(want) >= 2
    assert all(a != text for a, _, _ in got)  # never the whole sentence again
    capped = expander.func(text, np.random.default_rng(0), how=how, limit=2)
    assert len(capped) == 2 and set(capped) <= set(rows)
    seen = {tuple(expander.func(text, np.random.default_rng(s), how=how, limit=1)) for s in range(40)}
    assert len(seen) == min(len(want), len(seen)) and len(seen) > 1  # the cap picks at random
    assert registry.get("compcse").row_expander(registry.build_params("compcse", {})) is None
    assert expander("no clause punctuation here", np.random.default_rng(0)) == []
    with pytest.raises(ConfigError, match="subsample must be one of none, adjacent, overlapping, subsuming"):
        registry.build("compcse", {"subsample": "random"})
    with pytest.raises(ConfigError, match="subsample_max must be >= 1"):
        registry.build("compcse", {"subsample": "adjacent", "subsample_max": 0})


def test_compcse_subsampled_row_composes_its_own_parts(tiny_model_no_dropout):
    """An extra row's positive is the composition of its two parts, each through encoder and projector
    on its own; a plain sentence in the same batch keeps its token halves."""
    from raycse.model.encoder import Encoder
    from raycse.objectives.compcse import FIELD

    enc = Encoder.from_pretrained(str(tiny_model_no_dropout), pooling="cls", mlp_head="train_only").train()
    obj = registry.build("compcse", {"tau": 0.1, "subsample": "adjacent"})
    obj.setup(enc)
    texts = ["the city river was built", FIELD.join(["a king north road", "a king", "north road"]), "summer music"]
    got = obj(enc, obj.collate(texts, enc.tokenizer, 32)).loss
    anchors = ["the city river was built", "a king north road", "summer music"]
    parts = [("the city river", "was built"), ("a king", "north road"), ("summer", "music")]
    with torch.no_grad():
        g = lambda xs: enc.mlp(enc.backbone(**enc.tokenize(xs)).last_hidden_state[:, 0])  # noqa: E731
        z = g(anchors)
        pos = torch.stack([(g([a])[0] + g([b])[0]) / 2 for a, b in parts])
        logits = cosine_logits(z, pos, 0.1)
    want = sum(-(logits[i, i].item() - math.log(sum(math.exp(x) for x in logits[i].tolist()))) for i in range(3)) / 3
    assert got.item() == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize("name, params, examples", [
    ("simcse", {}, "texts"), ("sgopt", {}, "texts"), ("compcse", {}, "texts"), ("bsc", {}, "pairs"),
    ("laser", {}, "texts"), ("laser", {"m_mode": "fixed"}, "texts"), ("laser", {"m_mode": "fixed", "anchor": "random",
                                                                               "mode": "intra"}, "texts"),
    ("hicl", {}, "texts"), ("hicl", {"base": "laser"}, "texts"), ("hicl", {"base": "bsc"}, "pairs"),
])
def test_collates_that_draw_random_numbers_stay_in_the_training_thread(tiny_model, name, params, examples):
    """train.collate_ahead tokenizes on a helper thread only where collate leaves torch's generator
    alone (else the dropout stream would depend on thread timing): the flag must say what collate does."""
    from transformers import AutoTokenizer

    from raycse.train.ahead import wanted

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    texts = ["the city river was built. a king came", "a small village. the north road", "summer music festival"] * 3
    rows = texts if examples == "texts" else [(t, t[::-1], 0.5) for t in texts]
    obj = registry.build(name, params)
    state = torch.get_rng_state()
    obj.collate(rows, tok, 32)
    drew = not torch.equal(state, torch.get_rng_state())
    assert obj.collate_draws_random == drew
    assert wanted("true", obj, "cpu") == wanted("auto", obj, "cuda") == (not drew)
    assert not wanted("auto", obj, "cpu") and not wanted("false", obj, "cuda")
