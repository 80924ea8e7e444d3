"""Token views: HiCL slicing (queue rule), CompCSE halves, LA(SER)^3 elongation."""

import torch

from raycse.objectives.views import elongate, halves, random_repeats, segment_mean, slice_pieces

IDS = (101, 102, 0)  # [CLS], [SEP], [PAD]


def batch(lengths, width=None):
    width = width or max(lengths) + 2
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, 0], ids[i, n + 1] = 101, 102
        ids[i, 1:n + 1] = torch.arange(1000 * (i + 1), 1000 * (i + 1) + n)
        mask[i, :n + 2] = 1
    return ids, mask


def test_queue_rule_70_tokens_at_L32_gives_32_32_6():
    ids, mask = batch([70, 5, 32, 33])
    p = slice_pieces(ids, mask, 32, IDS)
    assert p.owner.tolist() == [0, 0, 0, 1, 2, 3, 3]
    assert p.length.tolist() == [32, 32, 6, 5, 32, 32, 1]
    # every piece: [CLS] its tokens in order [SEP], padding after
    seq0 = torch.cat([p.input_ids[k, 1:p.length[k] + 1] for k in range(3)])
    assert torch.equal(seq0, ids[0, 1:71])
    for k in range(len(p.owner)):
        n = int(p.length[k])
        assert p.input_ids[k, 0] == 101 and p.input_ids[k, n + 1] == 102
        assert p.attention_mask[k].sum() == n + 2


def test_l_i_formula():
    for c in range(1, 100):
        ids, mask = batch([c])
        assert len(slice_pieces(ids, mask, 16, IDS).owner) == 1 + (c - 1) // 16


def test_halves_split_tokens_with_own_special_tokens():
    ids, mask = batch([7, 1, 4])
    left, right = halves(ids, mask, IDS)
    assert left.length.tolist() == [4, 1, 2] and right.length.tolist() == [3, 0, 2]
    assert torch.equal(torch.cat([left.input_ids[0, 1:5], right.input_ids[0, 1:4]]), ids[0, 1:8])
    assert right.input_ids[1, :2].tolist() == [101, 102] and right.attention_mask[1].sum() == 2


def test_elongation_repeats_and_never_exceeds_max_length():
    ids, mask = batch([3, 10, 40])
    out, m = elongate(ids, mask, torch.tensor([2, 5, 3]), max_length=32, ids=IDS)
    assert m.tolist() == [2, 3, 1]  # 5 copies of 10 tokens and 3 of 40 do not fit 30 content slots
    assert out["input_ids"][0, 1:7].tolist() == ids[0, 1:4].tolist() * 2
    assert (out["attention_mask"].sum(1) <= 32).all()
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        r = random_repeats(mask, 32, g)
        assert (r >= 1).all() and (r * torch.tensor([3, 10, 40]).clamp(max=30) <= torch.tensor([30, 30, 40])).all()
        out, _ = elongate(ids, mask, r, 32, IDS)
        assert out["input_ids"].shape[1] <= 32


def test_segment_mean_weighted_and_unweighted():
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    owner, length = torch.tensor([0, 0, 1]), torch.tensor([3, 1, 5])
    w = segment_mean(z, owner, length, 2)
    assert torch.allclose(w[0], torch.tensor([0.75, 0.25])) and torch.allclose(w[1], z[2])
    u = segment_mean(z, owner, length, 2, weighted=False)
    assert torch.allclose(u[0], torch.tensor([0.5, 0.5]))
