"""Float32 CPU linears on oneDNN (raycse.model.onednn): same values and gradients as F.linear, autocast left
alone, and the encoder's embeddings and training gradients unchanged."""

import pytest
import torch
import torch.nn.functional as F

from raycse.model import onednn
from raycse.model.encoder import Encoder

# Whether a machine *uses* oneDNN is its probe's verdict (noisy on a busy 2-core box); what is tested here
# is that the path, when used, is right: forced on, skipped only where PyTorch lacks the op.
pytestmark = pytest.mark.skipif(not onednn.op_works(), reason="this PyTorch build has no usable oneDNN linear")


@pytest.fixture(autouse=True)
def _onednn_forced_on(monkeypatch):
    monkeypatch.setenv("RAYCSE_ONEDNN", "1")


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


@pytest.mark.parametrize("shape", [(5, 24), (3, 7, 24)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_gradients_equal_f_linear(shape, with_bias):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g).requires_grad_()
    w = torch.randn(40, 24, generator=g).requires_grad_()
    b = torch.randn(40, generator=g).requires_grad_() if with_bias else None
    upstream = torch.randn(shape[:-1] + (40,), generator=g)
    inputs = [x, w] + ([b] if with_bias else [])
    ref = torch.autograd.grad(F.linear(x, w, b), inputs, upstream)
    with onednn.onednn_linear():
        y = F.linear(x, w, b)
    assert type(y.grad_fn).__name__ == "_LinearBackward"  # raycse's oneDNN function, not addmm's backward
    for got, want in zip(torch.autograd.grad(y, inputs, upstream), ref):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_autocast_and_disabled_keep_the_usual_path():
    x, lin = torch.randn(4, 8), torch.nn.Linear(8, 3)
    assert not isinstance(onednn.onednn_linear(enabled=False), onednn._OneDNNLinear)
    with onednn.onednn_linear():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lin(x)
        assert y.dtype == torch.bfloat16 and type(y.grad_fn).__name__ != "_LinearBackward"
        z = lin(x)  # float32 without autocast: oneDNN
        assert type(z.grad_fn).__name__ == "_LinearBackward"


def test_encoder_training_step_same_gradients(tiny_model_no_dropout):
    enc = Encoder.from_pretrained(str(tiny_model_no_dropout), pooling="mean").train()
    batch = enc.tokenize(["the city", "a small village was built on the river", "king", "summer music festival"])
    grads = []
    for flag in (True, False):
        enc.onednn = flag
        enc.zero_grad()
        enc(**batch).pow(2).sum().backward()
        grads.append({n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for name, g in grads[1].items():
        torch.testing.assert_close(grads[0][name], g, atol=1e-5, rtol=1e-4, msg=name)


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
    assert not isinstance(onednn.onednn_linear(), onednn._OneDNNLinear)
    monkeypatch.setenv("RAYCSE_ONEDNN", "1")
    assert isinstance(onednn.onednn_linear(), onednn._OneDNNLinear)
