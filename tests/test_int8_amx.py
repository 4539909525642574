"""The int8 product on AMX (csrc/int8_amx.c): the exact integer sum with the scaling, bias and GELU fused in;
Int8Linear takes it where its shape fills whole tiles, `_int_mm` elsewhere; real MiniLM through it keeps the
cosine bar. On a CPU without AMX-INT8 (or an OS that does not grant the tiles) these tests skip: the kernel
cannot run there, and the layer's other paths are tested in test_int8.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnlab.nn.int8 as int8_mod
from attnlab.nn import kernels
from attnlab.nn.int8 import Int8Linear, quantize_rows
from attnlab.nn.kernel_signatures import int8_packed_bytes
from test_int8 import _gemm_reference, extreme_product_case, layer_on_one_and_two_threads, minilm_int8_cosine

pytestmark = pytest.mark.skipif(bool(kernels.kernel_reason("int8_amx")),
                                reason=f"the AMX int8 product cannot run here: {kernels.kernel_reason('int8_amx')}")


def _packed(w: torch.Tensor) -> torch.Tensor:
    k, n = w.shape
    out = torch.empty(int8_packed_bytes(k, n), dtype=torch.int8)
    kernels.call("int8_pack_b", w, k, n, out, torch.empty(n, dtype=torch.int32))
    return out


@pytest.mark.parametrize("m,k,n", [(1, 64, 16), (31, 64, 48), (33, 128, 32), (70, 384, 1152), (45, 1536, 384)])
def test_int8_amx_gemm_is_the_exact_integer_product(m, k, n):
    """Every edge of the 32 x 32 block: rows fewer than a block, one more than a block, not a multiple of 16;
    an odd number of 16-column panels (48: a last panel alone); codes and weights at -128 and 127 (the int32
    sums stay exact); with and without bias; GELU in the store equal to torch's of the exact result."""
    g, q, w, scale, wscale = extreme_product_case(m, k, n)
    packed = _packed(w)
    for bias in (None, torch.randn(n, generator=g)):
        ref = _gemm_reference(q, scale, w, wscale, bias)
        for act in (0, 1):
            y = torch.full((m, n), float("nan"))
            kernels.call("int8_amx_gemm", q, scale, m, k, packed, wscale, bias, n, y, act)
            want = F.gelu(ref) if act else ref
            torch.testing.assert_close(y.double(), want, rtol=1e-6, atol=1e-5)


def test_int8_amx_gemm_door_refuses_partial_tiles():
    q, w = torch.zeros(4, 96, dtype=torch.int8), torch.zeros(96, 32, dtype=torch.int8)
    with pytest.raises(ValueError, match="K a multiple of 64 and N of 16"):
        kernels.call("int8_amx_gemm", q, torch.ones(4), 4, 96, _packed(w), torch.ones(32), None, 32,
                     torch.empty(4, 32), 0)
    q, w = torch.zeros(4, 64, dtype=torch.int8), torch.zeros(64, 24, dtype=torch.int8)
    with pytest.raises(ValueError, match="K a multiple of 64 and N of 16"):
        kernels.call("int8_amx_gemm", q, torch.ones(4), 4, 64, _packed(w), torch.ones(24), None, 24,
                     torch.empty(4, 24), 0)


def test_int8_linear_takes_amx_for_whole_tiles_and_equals_the_torch_path(monkeypatch):
    """A 128 -> 48 layer runs the AMX kernel (over two threads as over one, the same numbers), equal to the
    `_int_mm` path's result; a 96 -> 80 layer (no whole tiles) and a 7-bit-code layer do not take it."""
    g = torch.Generator().manual_seed(2)
    torch.manual_seed(2)
    layer = Int8Linear.from_linear(nn.Linear(128, 48), torch.rand(128, generator=g) + 0.5, "s8")
    x = torch.randn(3, 29, 128, generator=g)
    real_call = kernels.call
    calls, one, two = layer_on_one_and_two_threads(monkeypatch, layer, x, activation="gelu")
    assert calls.count("int8_amx_gemm") == 2 and torch.equal(one, two)
    q, s = quantize_rows(x.reshape(-1, 128), layer.factors)
    ref = F.gelu(_gemm_reference(q, s, layer.weight_q, layer.weight_scale, layer.bias))
    torch.testing.assert_close(one.reshape(-1, 48).double(), ref, rtol=1e-6, atol=1e-5)
    monkeypatch.setattr(int8_mod.kernels, "active", lambda name: False)  # torch's _int_mm, torch's GELU
    torch.testing.assert_close(layer(x, activation="gelu"), one, rtol=1e-6, atol=1e-6)
    monkeypatch.undo()
    monkeypatch.setattr(int8_mod.kernels, "call", lambda fn, *a, **kw: calls.append(fn) or real_call(fn, *a, **kw))
    calls.clear()
    Int8Linear.from_linear(nn.Linear(96, 80), None, "s8")(torch.randn(5, 96))
    Int8Linear.from_linear(nn.Linear(128, 48), None, "u7")(x)
    assert "int8_amx_gemm" not in calls


def test_minilm_int8_on_amx_keeps_cosine_on_real_sentences(minilm, data_dir, monkeypatch):
    """Real MiniLM, calibrated on the bundled sentences, on 100 SST-2 + 100 CoNLL sentences: every linear layer
    of the encoder runs the AMX kernel, and the embeddings keep min cosine >= 0.99, mean >= 0.998 to fp32."""
    calls, cos = minilm_int8_cosine(minilm, data_dir, monkeypatch)
    assert calls.count("int8_amx_gemm") > 0 and "int8_dequant_rows" not in calls
    assert cos.min() >= 0.99 and cos.mean() >= 0.998, (cos.min(), cos.mean())
