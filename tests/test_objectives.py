"""Each objective against its formula, computed a second, plain way on small tensors."""

import math

import pytest
import torch

from raycse.errors import ConfigError
from raycse.objectives import registry
from raycse.objectives.contrastive import cosine_logits, info_nce


def plain_simcse(z1, z2, tau):
    """Scalar loops over the SimCSE formula: -log e^{s_ii/tau} / sum_j e^{s_ij/tau}, mean over i."""
    n = len(z1)
    total = 0.0
    for i in range(n):
        def s(a, b):
            dot = sum(x * y for x, y in zip(a, b))
            return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))
        num = math.exp(s(z1[i], z2[i]) / tau)
        den = sum(math.exp(s(z1[i], z2[j]) / tau) for j in range(n))
        total += -math.log(num / den)
    return total / n


def test_simcse_loss_matches_plain_formula():
    torch.manual_seed(0)
    z1, z2 = torch.randn(5, 7), torch.randn(5, 7)
    obj = registry.build("simcse", {"tau": 0.05})
    got = obj.loss(z1, z2).item()
    want = plain_simcse(z1.tolist(), z2.tolist(), 0.05)
    assert got == pytest.approx(want, rel=1e-5)


def test_simcse_hand_computed_two_by_two():
    # Orthogonal unit vectors: sim = 1 on the diagonal, 0 off it.
    z = torch.eye(2)
    obj = registry.build("simcse", {"tau": 0.5})
    want = -math.log(math.exp(2.0) / (math.exp(2.0) + math.exp(0.0)))
    assert obj.loss(z, z).item() == pytest.approx(want, rel=1e-6)


def test_simcse_uses_only_cross_view_terms():
    # Making z1 rows identical to each other must not change the loss if only z1-z2 sims count,
    # which we check against the plain formula (a z1-z1 term would add e^{1/tau} terms).
    torch.manual_seed(1)
    z1 = torch.randn(1, 4).repeat(3, 1)
    z2 = torch.randn(3, 4)
    obj = registry.build("simcse", {"tau": 0.1})
    assert obj.loss(z1, z2).item() == pytest.approx(plain_simcse(z1.tolist(), z2.tolist(), 0.1), rel=1e-5)


def test_info_nce_exclude_mask_removes_terms_from_denominator():
    torch.manual_seed(2)
    a, c = torch.randn(3, 4), torch.randn(3, 4)
    exclude = torch.tensor([[False, True, False], [False, False, False], [True, False, False]])
    got = info_nce(a, c, 0.2, exclude=exclude).item()
    logits = cosine_logits(a, c, 0.2)
    total = 0.0
    for i in range(3):
        den = sum(math.exp(logits[i, j].item()) for j in range(3) if not exclude[i, j])
        total += -(logits[i, i].item() - math.log(den))
    assert got == pytest.approx(total / 3, rel=1e-5)


def test_info_nce_gradient_reaches_both_views():
    a = torch.randn(4, 3, requires_grad=True)
    c = torch.randn(4, 3, requires_grad=True)
    info_nce(a, c, 0.05).backward()
    assert a.grad.abs().sum() > 0 and c.grad.abs().sum() > 0


@pytest.mark.parametrize("bad", [0, -0.1, "abc"])
def test_temperature_out_of_range_is_a_clear_error(bad):
    with pytest.raises(ConfigError, match="tau"):
        registry.build("simcse", {"tau": bad})


def test_unknown_knob_and_unknown_objective():
    with pytest.raises(ConfigError, match="no knob 'alpha'"):
        registry.build("simcse", {"alpha": 0.1})
    with pytest.raises(ConfigError, match="unknown objective"):
        registry.build("nope", {})


def test_a_renamed_knob_names_its_new_name():
    with pytest.raises(ConfigError) as err:
        registry.build("simcse", {"temperature": 0.05})
    assert "has no knob 'temperature' ('temperature' is now 'tau')" in str(err.value)


def test_each_objective_holds_its_own_prompts():
    """An objective's column prompts are its own: one run's prompts never reach another objective (a
    class-level dict was shared by every instance)."""
    a, b = registry.build("simcse", {"tau": 0.05}), registry.build("hicl", {})
    a.prompts["text"] = "query: "
    assert b.prompts == {} and registry.build("simcse", {"tau": 0.05}).prompts == {}
