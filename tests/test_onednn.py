"""Float32 CPU inference linears on oneDNN (raycse.onednn): same values as F.linear, used only where no
gradient is needed and autocast is off, and the encoder's embeddings unchanged."""

import pytest
import torch
import torch.nn.functional as F

from raycse import onednn
from raycse.encoder import Encoder

pytestmark = pytest.mark.skipif(not onednn.available(), reason="this PyTorch build has no oneDNN")


def _ops(fn) -> set:
    with torch.profiler.profile() as prof:
        fn()
    return {e.name for e in prof.events()}


@pytest.mark.parametrize("shape", [(5, 24), (3, 7, 24)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_same_values_as_f_linear_and_runs_on_onednn(shape, with_bias):
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(shape, generator=g), torch.randn(40, 24, generator=g), torch.randn(40, generator=g)
    bias = b if with_bias else None
    with torch.no_grad():
        ref = F.linear(x, w, bias)
        with onednn.onednn_linear():
            got = F.linear(x, w, bias)
            ops = _ops(lambda: F.linear(x, w, bias))
    assert "mkldnn::_linear_pointwise" in ops and "aten::addmm" not in ops
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_gradients_autocast_and_disabled_fall_back_to_the_usual_path():
    x, lin = torch.randn(4, 8), torch.nn.Linear(8, 3)
    assert not isinstance(onednn.onednn_linear(), onednn._OneDNNLinear)  # grad enabled: nothing changes
    with torch.no_grad():
        assert not isinstance(onednn.onednn_linear(enabled=False), onednn._OneDNNLinear)
        with onednn.onednn_linear():
            with torch.enable_grad():  # a weight that needs its gradient keeps the differentiable op
                y = lin(x)
                assert y.grad_fn is not None
                y.sum().backward()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                assert lin(x).dtype == torch.bfloat16  # autocast still applies
    assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("unpad", [True, False])
def test_encoder_embeddings_unchanged(tiny_model, unpad):
    enc = Encoder.from_pretrained(str(tiny_model), pooling="mean")
    assert enc.onednn  # the default
    texts = ["the city", "a small village was built on the river", "king", "summer music festival"] * 2
    enc.unpad = unpad
    fast = enc.encode(texts, batch_size=3)
    enc.onednn = False
    plain = enc.encode(texts, batch_size=3)
    assert abs(plain).sum() > 0
    torch.testing.assert_close(torch.from_numpy(fast), torch.from_numpy(plain), atol=1e-5, rtol=1e-5)


def test_environment_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("RAYCSE_ONEDNN", "0")
    with torch.no_grad():
        assert not isinstance(onednn.onednn_linear(), onednn._OneDNNLinear)
    monkeypatch.setenv("RAYCSE_ONEDNN", "1")
    with torch.no_grad():
        assert isinstance(onednn.onednn_linear(), onednn._OneDNNLinear)
