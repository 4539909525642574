"""oneDNN-packed linear layers for encoders at CPU inference (nn/cpu_linear.py): equal to F.linear (+ the
activation) to fp32 rounding, only where they apply, and never stale after an in-place weight update."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnlab
from attnlab.nn import cpu_linear
from attnlab.nn.cpu_linear import forget_packed, module_linear

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.fixture(autouse=True)
def packed_on(monkeypatch):
    """The packed path runs where the CPU has AVX512 (packed_is_faster); its equalities are checked on any."""
    monkeypatch.setattr(cpu_linear, "ENABLED", True)


def test_the_path_follows_the_cpu(monkeypatch):
    assert cpu_linear.packed_is_faster({"avx2", "avx512f"}) and not cpu_linear.packed_is_faster({"avx2", "fma"})
    monkeypatch.setattr(cpu_linear, "ENABLED", False)
    with torch.no_grad():
        assert module_linear(nn.Linear(8, 4), torch.randn(2, 8)) is None  # torch's own product


@pytest.mark.parametrize("activation,ref", [(None, lambda y: y), ("gelu", F.gelu), ("relu", F.relu),
                                            ("gelu_tanh", lambda y: F.gelu(y, approximate="tanh"))])
def test_packed_equals_linear(activation, ref):
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(64, 96)
    x = torch.randn(3, 11, 64, generator=g)
    with torch.no_grad():
        out = module_linear(lin, x, activation)
        torch.testing.assert_close(out, ref(lin(x)), rtol=1e-5, atol=1e-5)
        lin.weight.mul_(2)  # an in-place update bumps the version: the packed copy is rebuilt
        torch.testing.assert_close(module_linear(lin, x, activation), ref(lin(x)), rtol=1e-5, atol=1e-5)
    assert module_linear(lin, x) is None  # autograd on: the plain path
    with torch.no_grad():
        assert module_linear(lin, x.double()) is None and module_linear(lin.double(), x.double()) is None
        lin.float().register_forward_hook(lambda *a: None)
        assert module_linear(lin, x) is None  # a hook must see the module called


def test_encoder_uses_it_and_stays_equal_through_training_and_copies():
    torch.manual_seed(0)
    cfg = attnlab.preset("bert-tiny", vocab_size=100, max_position_embeddings=32)
    model = attnlab.Encoder(cfg).eval()
    ids = torch.randint(0, 100, (2, 9))
    with torch.no_grad():
        packed = model(ids).last_hidden_state
    plain = model(ids).last_hidden_state.detach()  # autograd on: every product the plain way
    assert not torch.equal(packed, plain)  # the packed products ran (another summation order)
    torch.testing.assert_close(packed, plain, rtol=1e-5, atol=1e-5)
    clone = copy.deepcopy(model)  # the packed copies live outside the modules: deepcopy works
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    model.train()  # a fused step does not bump versions; train()/eval() drop the packed copies
    model(ids).last_hidden_state.sum().backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        after = model(ids).last_hidden_state
        forget_packed(*model.modules())
        fresh = model(ids).last_hidden_state
        torch.testing.assert_close(after, fresh, rtol=0, atol=0)
        assert not torch.allclose(after, clone(ids).last_hidden_state)
