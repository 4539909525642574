"""The int8 product on AVX512-VNNI (csrc/int8_vnni.c): vpdpbusd on the symmetric codes offset by 128, the exact
integer sum with the offset, the scaling, bias and GELU fused into the store; Int8Linear takes it on a VNNI CPU
wherever AMX does not; real MiniLM through it keeps the cosine bar. On a CPU without AVX512-VNNI these tests
skip: the kernel cannot run there, and the layer's other paths are tested in test_int8.py."""
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

pytestmark = pytest.mark.skipif(bool(kernels.kernel_reason("int8_vnni")),
                                reason=f"the VNNI int8 product cannot run here: {kernels.kernel_reason('int8_vnni')}")


def _packed(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k, n = w.shape
    out, colsum = torch.empty(int8_packed_bytes(k, n), dtype=torch.int8), torch.empty(n, dtype=torch.int32)
    kernels.call("int8_pack_b", w, k, n, out, colsum)
    return out, colsum


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 33), (13, 64, 48), (25, 97, 16), (70, 384, 1152),
                                   (45, 1536, 384), (301, 100, 20), (11, 64, 80)])
def test_int8_vnni_gemm_is_the_exact_integer_product(m, k, n):
    """Every edge of the 6 x 64 tile and the row chunks: rows not a multiple of 6, more rows than one chunk
    holds (1536-wide rows), K not a multiple of 4 or 64 (the padded quads and the copy's tail), N not a multiple
    of 64 (a last group of 1-3 panels: 20, 33, 48, 80) nor of 16 (masked stores); codes and weights at
    -128 and 127 (the int32 sums stay exact after the offset of 128); with and without bias; GELU in the store
    equal to torch's of the exact result."""
    g, q, w, scale, wscale = extreme_product_case(m, k, n)
    packed, colsum = _packed(w)
    for bias in (None, torch.randn(n, generator=g)):
        ref = _gemm_reference(q, scale, w, wscale, bias)
        for act in (0, 1):
            y = torch.full((m, n), float("nan"))
            kernels.call("int8_vnni_gemm", q, scale, m, k, packed, colsum, wscale, bias, n, y, act)
            want = F.gelu(ref) if act else ref
            torch.testing.assert_close(y.double(), want, rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match=r"act 0 \(none\) or 1"):
        kernels.call("int8_vnni_gemm", q, scale, m, k, packed, colsum, wscale, None, n, y, 2)


def test_int8_linear_takes_vnni_where_amx_does_not_and_equals_the_torch_path(monkeypatch):
    """On a CPU with VNNI and no AMX, a 96 -> 80 layer (no whole AMX tiles) runs the VNNI kernel, over two threads
    as over one with the same numbers, equal to the `_int_mm` path's result; a 7-bit-code layer does not take
    it; with AMX faked present and its kernel inactive, the VNNI kernel still runs."""
    g = torch.Generator().manual_seed(2)
    torch.manual_seed(2)
    layer = Int8Linear.from_linear(nn.Linear(96, 80), torch.rand(96, generator=g) + 0.5, "s8")
    x = torch.randn(3, 29, 96, generator=g)
    real_call = kernels.call
    calls, one, two = layer_on_one_and_two_threads(monkeypatch, layer, x, activation="gelu")
    assert calls.count("int8_vnni_gemm") == 2 and "int8_dequant_rows" not in calls and torch.equal(one, two)
    q, s = quantize_rows(x.reshape(-1, 96), layer.factors)
    ref = F.gelu(_gemm_reference(q, s, layer.weight_q, layer.weight_scale, layer.bias))
    torch.testing.assert_close(one.reshape(-1, 80).double(), ref, rtol=1e-6, atol=1e-5)
    real_active = kernels.active
    monkeypatch.setattr(int8_mod.kernels, "active", lambda name: name != "int8_vnni" and real_active(name))
    torch.testing.assert_close(layer(x, activation="gelu"), one, rtol=1e-6, atol=1e-6)  # _int_mm, torch's GELU
    assert calls.count("int8_vnni_gemm") == 2
    monkeypatch.setattr(int8_mod.kernels, "active", lambda name: name != "int8_amx" and real_active(name))
    monkeypatch.setattr(int8_mod, "cpu_flags", lambda: {"avx512_vnni", "amx_int8"})
    layer(x)
    assert calls.count("int8_vnni_gemm") == 3
    Int8Linear.from_linear(nn.Linear(96, 80), None, "u7")(x)
    assert calls.count("int8_vnni_gemm") == 3


def test_minilm_int8_on_vnni_keeps_cosine_on_real_sentences(minilm, data_dir, monkeypatch):
    """Real MiniLM, calibrated on the bundled sentences, on 100 SST-2 + 100 CoNLL sentences, with AMX out of the
    way: every linear layer of the encoder runs the VNNI kernel, and the embeddings keep min cosine >= 0.99,
    mean >= 0.998 to fp32."""
    real_active = kernels.active
    monkeypatch.setattr(int8_mod.kernels, "active", lambda name: name != "int8_amx" and real_active(name))
    calls, cos = minilm_int8_cosine(minilm, data_dir, monkeypatch)
    assert calls.count("int8_vnni_gemm") > 0 and "int8_dequant_rows" not in calls
    assert cos.min() >= 0.99 and cos.mean() >= 0.998, (cos.min(), cos.mean())
