"""int8 linear layers (nn/int8.py) and the short-sequence attention kernel (nn/cpu_attention.py): each equals
its reference arithmetic; real MiniLM in int8 keeps min cosine >= 0.99 / mean >= 0.998 to fp32 on real
sentences; the int8 path follows the CPU's flags (faked here); `evaluate --dtype int8` scores a classifier."""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnlab
import attnlab.nn.int8 as int8_mod
from attnlab.cli import main
from attnlab.inference.embed import embed
from attnlab.inference.quantize import calibration_batches, linear_precision, quantize
from attnlab.nn.cpu_attention import short_attention
from attnlab.nn.int8 import Int8Linear, SmoothedLinear, quantize_rows, quantize_rows_u7
from attnlab.nn import kernels as kernels_mod
from attnlab.nn.kernels import kernel_reason
from attnlab.nn.quantized import kernels



def _torch_rows(monkeypatch, x, factors, quantizer=quantize_rows):
    monkeypatch.setattr(int8_mod.kernels, "active", lambda name: False)
    out = quantizer(x, factors)
    monkeypatch.undo()
    return out


def _signed(q, s, zero=None):
    """The codes as the signed integers the product multiplies: q - zero for 7-bit codes."""
    return (q.long(), s) if zero is None else (q.long() - zero.long(), s)


@pytest.mark.parametrize("cols", [384, 37])
def test_quantize_rows_kernel_equals_torch(monkeypatch, cols):
    assert kernels() is not None  # the C compiler is part of this machine's set-up
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, cols, generator=g) * torch.logspace(-2, 2, cols)
    x[3] = 0  # a row of zeros: scale 1, all-zero codes
    factors = torch.rand(cols, generator=g) + 0.1
    for f in (None, factors):
        q, s = quantize_rows(x, f)
        q_ref, s_ref = _torch_rows(monkeypatch, x, f)
        assert torch.equal(q, q_ref) and torch.equal(s, s_ref)
        assert q.abs().max() == 127 and s[3].item() == 1.0 and not q[3].any()


@pytest.mark.parametrize("cols", [384, 37])
def test_quantize_rows_u7_kernel_equals_torch(monkeypatch, cols):
    """7-bit codes with a zero point: the C pass equals torch's; codes stay in 0..127, a row's range maps onto
    the whole grid, 0 is a code exactly (x = 0 -> q = zero), each value within half a step."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(50, cols, generator=g) * torch.logspace(-2, 2, cols)
    x[3] = 0                 # a row of zeros: scale 1, zero point 0, all-zero codes
    x[4] = x[4].abs()        # no negatives: zero point 0
    x[5] = -x[5].abs()       # no positives: zero point 127
    x[6, 1] = 0.0
    factors = torch.rand(cols, generator=g) + 0.1
    for f in (None, factors):
        q, s, z = quantize_rows_u7(x, f)
        q_ref, s_ref, z_ref = _torch_rows(monkeypatch, x, f, quantize_rows_u7)
        assert q.dtype == torch.uint8 and z.dtype == torch.int32
        assert torch.equal(q, q_ref) and torch.equal(s, s_ref) and torch.equal(z, z_ref)
        assert q.max() == 127 and q.min() == 0 and s[3].item() == 1.0 and not q[3].any() and z[3].item() == 0
        assert z[4].item() == 0 and z[5].item() == 127 and q[6, 1] == z[6, 0]
        xf = x if f is None else x * f
        assert ((q.float() - z) * s - xf).abs().le(0.5 * s * (1 + 1e-5)).all()


@pytest.mark.parametrize("codes", ["s8", "u7"])
def test_int8_linear_equals_integer_arithmetic_and_stays_near_fp32(monkeypatch, codes):
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(1)  # the Linear's initial weights: the same in any test order
    lin = nn.Linear(96, 80)
    x = torch.randn(3, 7, 96, generator=g)
    smooth = torch.rand(96, generator=g) + 0.5
    layer = Int8Linear.from_linear(lin, smooth, codes=codes)
    assert layer.codes == codes
    y = layer(x)
    # the same product in exact integer arithmetic
    q, s = _signed(*_torch_rows(monkeypatch, x.reshape(-1, 96), 1 / smooth,
                                quantize_rows if codes == "s8" else quantize_rows_u7))
    acc = q @ layer.weight_q.long()
    ref = acc.double() * (s.double() * layer.weight_scale.double()) + lin.bias.double()
    assert y.shape == (3, 7, 80)
    torch.testing.assert_close(y.reshape(-1, 80).double(), ref, rtol=1e-6, atol=1e-5)
    # and near the fp32 layer (weight and activation grids of 1/127 of each row's range)
    assert F.cosine_similarity(y.flatten(), lin(x).detach().flatten(), dim=0) > 0.999
    # each weight within half a grid step of its row's grid, in the smoothed coordinates (plus the float32
    # rounding of code x scale x 1/smooth: a few 1e-7 of the weight, up to ~3e-5 of the half step)
    bound = 0.5 * layer.weight_scale[:, None] / smooth[None, :] * (1 + 1e-4)
    assert ((layer.weight - lin.weight.detach()).abs() <= bound).all()
    # the torch fallback (no compiled kernels) gives the same values
    monkeypatch.setattr(int8_mod.kernels, "active", lambda name: False)
    torch.testing.assert_close(layer(x), y, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="input has 95 features, expected 96"):
        layer(x[..., :95])


@pytest.mark.parametrize("codes", ["s8", "u7"])
def test_gelu_in_the_int8_store_equals_torchs_gelu(codes):
    """`activation="gelu"`: in the AVX2 kernel's store (u7 codes on this CPU) or after torch's product, the
    erf GELU of the layer's output, to within 1e-6 of torch's, over outputs from -20 to 20 and a last panel
    of 5 columns; a feed-forward block whose up projection is int8 takes that path."""
    from attnlab.config import ModelConfig
    from attnlab.nn.feedforward import FeedForward
    torch.manual_seed(5)
    lin = nn.Linear(64, 16 * 7 + 5)
    layer = Int8Linear.from_linear(lin, torch.rand(64) + 0.5, codes)
    x = torch.randn(3, 11, 64) * 6
    with torch.no_grad():
        plain = layer(x)
        assert plain.abs().max() > 15 and (plain < -5).any()
        torch.testing.assert_close(layer(x, activation="gelu"), F.gelu(plain), rtol=0, atol=1e-6)
        with pytest.raises(ValueError, match="activation must be None or 'gelu'"):
            layer(x, activation="relu")
        cfg = ModelConfig(vocab_size=10, hidden_size=64, num_layers=1, num_heads=2, intermediate_size=112,
                          activation="gelu")
        block = FeedForward(cfg).eval()
        block.up = Int8Linear.from_linear(block.up, codes=codes)
        block.down = Int8Linear.from_linear(block.down, codes=codes)
        seen = []
        block.up.register_forward_hook(lambda m, args, kwargs, out: seen.append(kwargs), with_kwargs=True)
        torch.testing.assert_close(block(x), block.down(F.gelu(block.up(x))), rtol=0, atol=1e-5)
        assert seen[0] == {"activation": "gelu"}


def test_stacked_int8_equals_the_parts():
    g = torch.Generator().manual_seed(2)
    parts = [nn.Linear(64, n) for n in (64, 32, 32)]
    smooth = torch.rand(64, generator=g) + 0.5
    layers = [Int8Linear.from_linear(p, smooth) for p in parts]
    x = torch.randn(9, 64, generator=g)
    fused = Int8Linear.stacked(layers)
    torch.testing.assert_close(fused(x), torch.cat([m(x) for m in layers], -1), rtol=1e-6, atol=1e-6)
    other = Int8Linear.from_linear(parts[1], smooth * 2)
    assert Int8Linear.stacked([layers[0], other]) is None  # different smoothing: cannot share one product
    codes = Int8Linear.from_linear(parts[1], smooth, codes="u7" if layers[0].codes == "s8" else "s8")
    assert Int8Linear.stacked([layers[0], codes]) is None  # different codes: neither


def _sdpa(q, k, v, keep, scale):
    groups = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    mask = None if keep is None else (keep | ~keep.any(-1, keepdim=True))[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


@pytest.mark.parametrize("b,hq,hk,tq,tk,d", [(3, 4, 4, 5, 5, 32), (2, 6, 2, 17, 17, 16), (4, 2, 1, 1, 33, 64),
                                             (2, 3, 3, 40, 128, 32), (1, 2, 2, 9, 70, 128)])
def test_short_attention_equals_sdpa(b, hq, hk, tq, tk, d):
    g = torch.Generator().manual_seed(tk)
    # q/k/v as strided views of one projection, the way attention hands them over
    qkv = torch.randn(b, max(tq, tk), (hq + 2 * hk) * d, generator=g) * 2
    q = qkv[:, :tq, :hq * d].reshape(b, tq, hq, d).transpose(1, 2) if tq == tk else \
        torch.randn(b, hq, tq, d, generator=g)
    k = qkv[:, :tk, hq * d:(hq + hk) * d].view(b, tk, hk, d).transpose(1, 2)
    v = qkv[:, :tk, (hq + hk) * d:].view(b, tk, hk, d).transpose(1, 2)
    keep = torch.rand(b, tk, generator=g) > 0.3
    keep[0] = False  # a row with no real key sees every key, as AttentionMask makes it
    for mask in (None, keep):
        out = short_attention(q, k, v, mask, d ** -0.5)
        if kernel_reason("short_attention"):
            assert out is None  # neither AVX-512 nor AVX2 here: the caller falls back to torch
            continue
        torch.testing.assert_close(out, _sdpa(q, k, v, mask, d ** -0.5), rtol=1e-5, atol=1e-5)


def test_short_attention_declines_what_it_does_not_cover():
    q = torch.randn(2, 2, 8, 32)
    assert short_attention(q.bfloat16(), q.bfloat16(), q.bfloat16(), None, 0.1) is None
    assert short_attention(q[..., :24], q[..., :24], q[..., :24], None, 0.1) is None  # head dim not 16k
    long = torch.randn(1, 2, 129, 32)
    assert short_attention(long, long, long, None, 0.1) is None  # beyond MAX_KEYS: torch's kernel
    grad = q.clone().requires_grad_()
    assert short_attention(grad, q, q, None, 0.1) is None  # training: autograd needs torch's ops


def _sentences(data: Path, n: int) -> list[str]:
    with open(data / "glue" / "SST-2" / "train.tsv", encoding="utf-8") as fh:
        sst = [r[0] for r in list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))[1:n + 1]]
    conll, words = [], []
    for line in open(data / "conll2003" / "valid.txt", encoding="utf-8"):
        if line.strip():
            words.append(line.split()[0])
        elif words:
            if words[0] != "-DOCSTART-":
                conll.append(" ".join(words))
            words = []
        if len(conll) >= n:
            break
    return [s for pair in zip(sst, conll) for s in pair]


@pytest.mark.parametrize("flags", [{"avx512_vnni"}, {"avx2"}, {"sse4_2"}])
def test_minilm_int8_keeps_cosine_on_real_sentences(minilm, data_dir, monkeypatch, flags):
    """Calibrated on the bundled Gutenberg sentences, scored on 300 SST-2 + 300 CoNLL sentences. With int8
    dot products (VNNI) or AVX2 (the int8_gemm kernel): per-token int8 + SmoothQuant, the issue's bar.
    Without either: torch.ao with the same factors and ffn.down in fp32, a lower bar."""
    # faking VNNI on a CPU without it runs torch's plain-loop _int_mm (~0.6 GOP/s): fewer sentences there
    # (and the torch.ao path, tested at its lower bar, on 100 to keep the suite short)
    real = int8_mod.int8_product()
    n = 30 if "avx512_vnni" in flags and real != "int_mm" else 300 if flags & {"avx512_vnni", "avx2"} else 100
    if os.environ.get("ATTNLAB_KERNEL_SANITIZE"):  # under ASan the kernels' memory is the point, not the bar's
        n = min(n, 20)                              # statistics: a few sentences cover every code path
    monkeypatch.setattr(int8_mod, "cpu_flags", lambda: flags)
    model, tok = attnlab.load(minilm), attnlab.load_tokenizer(minilm)
    texts = _sentences(data_dir, n)
    ref = embed(model, tok, texts)
    q = quantize(model, "int8", calibration=calibration_batches(tok))
    # the AVX2 kernel runs where the real CPU has AVX2 and the library built it
    fast = "avx512_vnni" in flags or ("avx2" in flags and not kernel_reason("int8_gemm"))
    assert any(isinstance(m, Int8Linear) for m in q.modules()) == fast
    assert any(isinstance(m, SmoothedLinear) for m in q.modules()) != fast
    assert linear_precision(q) == "int8"
    cos = (embed(q, tok, texts) * ref).sum(-1)
    if fast:
        assert cos.min() >= 0.99 and cos.mean() >= 0.998, (cos.min(), cos.mean())
    else:
        assert cos.min() >= 0.97 and cos.mean() >= 0.995, (cos.min(), cos.mean())
    if "avx512_vnni" in flags and real != "int_mm":
        return  # the uncalibrated model would run the plain loop once more; the avx2 case checks it
    uncalibrated = quantize(model, "int8")  # per-token / per-batch scales only: still close, less so
    assert (embed(uncalibrated, tok, texts) * ref).sum(-1).mean() >= 0.98


def _gemm_reference(q, scale, weight_q, weight_scale, bias, zero=None):
    """The int8 layer's product in exact integer arithmetic, scaled in float64."""
    acc = (q.long() if zero is None else q.long() - zero.long().reshape(-1, 1)) @ weight_q.long()
    out = acc.double() * (scale.double().reshape(-1, 1) * weight_scale.double())
    return out if bias is None else out + bias.double()


def extreme_product_case(m: int, k: int, n: int):
    """(generator, q, w, scale, wscale) of an int8 product with symmetric codes: a row of codes at 127 and one at
    -128, the first weight column at -128 and the last at 127 (the int32 sums must stay exact)."""
    g = torch.Generator().manual_seed(m * k + n)
    q = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    q[0] = 127
    q[-1] = -128
    w = torch.randint(-128, 128, (k, n), generator=g, dtype=torch.int8)
    w[:, 0], w[:, -1] = -128, 127
    return g, q, w, torch.rand(m, generator=g) + 0.01, torch.rand(n, generator=g) * 1e-2 + 1e-4


def minilm_int8_cosine(minilm, data_dir, monkeypatch, n: int = 100):
    """(the C functions the int8 model called, cosine of each embedding to fp32's): real MiniLM calibrated on
    the bundled sentences, scored on n SST-2 + n CoNLL sentences."""
    model, tok = attnlab.load(minilm), attnlab.load_tokenizer(minilm)
    texts = _sentences(data_dir, n)
    ref = embed(model, tok, texts)
    q = quantize(model, "int8", calibration=calibration_batches(tok))
    calls = []
    real_call = kernels_mod.call
    monkeypatch.setattr(int8_mod.kernels, "call", lambda fn, *a, **kw: calls.append(fn) or real_call(fn, *a, **kw))
    return calls, (embed(q, tok, texts) * ref).sum(-1)


def layer_on_one_and_two_threads(monkeypatch, layer, x, **kwargs):
    """(calls, output on one thread, output on two): `layer(x, **kwargs)` twice, the C functions it called
    recorded in `calls` (a list the caller may keep reading: the recording stays until monkeypatch undoes it)."""
    calls = []
    real_call = kernels_mod.call
    monkeypatch.setattr(int8_mod.kernels, "call", lambda fn, *a, **kw: calls.append(fn) or real_call(fn, *a, **kw))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = layer(x, **kwargs)
        torch.set_num_threads(2)
        two = layer(x, **kwargs)
    finally:
        torch.set_num_threads(before)
    return calls, one, two


@pytest.mark.skipif(bool(kernel_reason("int8_gemm")), reason="the AVX2 int8 product is not built on this CPU")
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 33), (37, 96, 80), (64, 387, 64), (130, 384, 1152), (150, 1537, 24)])
def test_int8_gemm_is_the_exact_integer_product(m, k, n):
    """Every shape edge: rows not a multiple of the 5-row tile, K not a multiple of 4 (the packed zeros and
    the row's padded last quad), N not a multiple of 16 (the last panel), codes at the extremes 127 against
    weights -128/127 (pairs of 2 * 127 * 128 must not saturate int16), zero points 0 to 127, with and
    without bias; the column sums the packing returns are the weights'."""
    from attnlab.nn.kernel_signatures import int8_packed_bytes
    g = torch.Generator().manual_seed(m * k + n)
    q = torch.randint(0, 128, (m, k), generator=g, dtype=torch.uint8)
    q[0] = 127
    zero = torch.randint(0, 128, (m,), generator=g, dtype=torch.int32)
    zero[0] = 127
    w = torch.randint(-128, 128, (k, n), generator=g, dtype=torch.int8)
    w[:, 0] = -128
    w[:, -1] = 127
    scale, wscale = torch.rand(m, generator=g) + 0.01, torch.rand(n, generator=g) + 0.01
    packed = torch.empty(int8_packed_bytes(k, n), dtype=torch.int8)
    colsum = torch.empty(n, dtype=torch.int32)
    kernels_mod.call("int8_pack_b", w, k, n, packed, colsum)
    assert torch.equal(colsum.long(), w.long().sum(0))
    for bias in (None, torch.randn(n, generator=g)):
        y = torch.empty(m, n)
        kernels_mod.call("int8_gemm", q, scale, zero, m, k, packed, colsum, wscale, bias, n, y, 0)
        torch.testing.assert_close(y.double(), _gemm_reference(q, scale, w, wscale, bias, zero),
                                   rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"act 0 \(none\) or 1"):
        kernels_mod.call("int8_gemm", q, scale, zero, m, k, packed, colsum, wscale, None, n, y, 2)


@pytest.mark.skipif(bool(kernel_reason("int8_gemm")), reason="the AVX2 int8 product is not built on this CPU")
def test_int8_linear_avx2_path_equals_torch_path_and_repacks(monkeypatch):
    """Int8Linear on an AVX2 CPU (no VNNI) runs the kernel; its result equals the torch path's, over two
    threads as over one, and new weights loaded into the layer are packed anew (no stale copy)."""
    g = torch.Generator().manual_seed(3)
    lin = nn.Linear(200, 70)
    monkeypatch.setattr(int8_mod, "cpu_flags", lambda: {"avx2"})
    assert int8_mod.int8_product() == "avx2" and int8_mod.int8_codes() == "u7"
    layer = Int8Linear.from_linear(lin, torch.rand(200, generator=g) + 0.5)
    assert layer.codes == "u7"
    x = torch.randn(4, 33, 200, generator=g)
    calls = []
    real_call = int8_mod.kernels.call
    monkeypatch.setattr(int8_mod.kernels, "call", lambda fn, *a, **kw: calls.append(fn) or real_call(fn, *a, **kw))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = layer(x)
        torch.set_num_threads(2)
        two = layer(x)
    finally:
        torch.set_num_threads(before)
    assert "int8_gemm" in calls and calls.count("int8_pack_b") == 1 and torch.equal(one, two)
    q, s, zero = quantize_rows_u7(x.reshape(-1, 200), layer.factors)
    ref = _gemm_reference(q, s, layer.weight_q, layer.weight_scale, layer.bias, zero)
    torch.testing.assert_close(one.reshape(-1, 70).double(), ref, rtol=1e-6, atol=1e-5)
    # without the kernels, the same codes through torch's integer product: the same numbers
    monkeypatch.setattr(int8_mod.kernels, "active", lambda name: False)
    torch.testing.assert_close(layer(x), one, rtol=1e-6, atol=1e-6)
    monkeypatch.undo()
    monkeypatch.setattr(int8_mod, "cpu_flags", lambda: {"avx2"})
    monkeypatch.setattr(int8_mod.kernels, "call", lambda fn, *a, **kw: calls.append(fn) or real_call(fn, *a, **kw))
    other = Int8Linear.from_linear(nn.Linear(200, 70), layer.factors.reciprocal())
    layer.load_state_dict(other.state_dict())
    torch.testing.assert_close(layer(x), other(x), rtol=0, atol=0)
    assert calls.count("int8_pack_b") == 3  # the loaded layer's weights, and the other layer's


def test_evaluate_int8_scores_a_classifier(minilm, data_dir, tmp_path, capsys):
    """A MiniLM classifier head on 40 SST-2 lines: int8 predictions agree with fp32 on nearly all of them."""
    from attnlab.tasks.finetune import finetune
    lines = (data_dir / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    (tmp_path / "train.tsv").write_text("\n".join(lines[:201]) + "\n", encoding="utf-8")
    (tmp_path / "eval.tsv").write_text("\n".join([lines[0]] + lines[1000:1040]) + "\n", encoding="utf-8")
    finetune("sst2", minilm, tmp_path / "run", train_file=tmp_path / "train.tsv", valid_file=tmp_path / "eval.tsv",
             epochs=1, progress=False)
    results = {}
    for dtype in ("fp32", "int8"):
        assert main(["evaluate", "sst2", "--model", str(tmp_path / "run"), "--data", str(tmp_path / "eval.tsv"),
                     "--dtype", dtype]) == 0
        results[dtype] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert results["int8"]["dtype"] == "int8" and results["int8"]["examples"] == 40
    assert abs(results["int8"]["accuracy"] - results["fp32"]["accuracy"]) <= 5.0  # at most 2 of 40 flip
    assert main(["evaluate", "lm", "--model", str(tmp_path / "run"), "--data", str(tmp_path / "eval.tsv"),
                 "--dtype", "int8"]) != 0


def test_short_attention_split_over_threads_equals_one_thread():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(5, 3, 21, 32, generator=g) for _ in range(3))
    keep = torch.rand(5, 21, generator=g) > 0.2
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = short_attention(q, k, v, keep, 0.2)
        torch.set_num_threads(2)
        two = short_attention(q, k, v, keep, 0.2)
    finally:
        torch.set_num_threads(before)
    if one is None:
        assert two is None
    else:
        assert torch.equal(one, two)


@pytest.mark.parametrize("flags,want", [({"avx512_vnni"}, "int8"), ({"avx512_bf16"}, "bf16"), ({"sse4_2"}, "fp32"),
                                        ({"avx2"}, None)])
def test_fastest_dtype_follows_the_cpu(monkeypatch, flags, want):
    """--dtype auto: int8 where Int8Linear is fast (VNNI, or AVX2 with the kernel built), bf16 where native,
    else fp32 (torch.ao's int8 misses the cosine bar)."""
    from attnlab.inference.quantize import fastest_dtype
    from attnlab.nn import precision
    monkeypatch.setattr(int8_mod, "cpu_flags", lambda: flags)
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    if want is None:
        want = "fp32" if kernel_reason("int8_gemm") else "int8"
    assert fastest_dtype("cpu") == want


def test_auto_precision_measures_each_candidate_and_falls_back(minilm):
    """auto_precision keeps the fastest precision whose embeddings of the calibration sentences keep the bar,
    measured, not read off the CPU's flags: MiniLM keeps int8 where it is fast; the same model with a weight
    column 100x larger in every feed-forward down projection (per-row weight scales then zero the other
    weights) misses the bar in int8 and gets fp32 back."""
    from attnlab.inference.quantize import auto_precision, calibration_texts, candidate_dtypes
    model, tok = attnlab.load(minilm, architecture=None), attnlab.load_tokenizer(minilm)
    candidates = candidate_dtypes()
    kept, dtype, checks = auto_precision(model, tok)
    assert dtype == candidates[0] and [c["dtype"] for c in checks] == (candidates[:1] if dtype != "fp32" else [])
    if checks:  # the figures are the cosines of the kept model's embeddings
        texts = calibration_texts()
        cos = (embed(kept, tok, texts) * embed(model, tok, texts)).sum(-1)
        assert checks[0]["kept"] and abs(checks[0]["min"] - cos.min()) < 1e-6 and cos.min() >= 0.99
        assert linear_precision(kept) == dtype and linear_precision(model) == "fp32"  # a copy
    with torch.no_grad():
        for layer in model.layers:
            layer.ffn.down.weight[:, 0] *= 100
    kept, dtype, checks = auto_precision(model, tok)
    assert dtype != "int8" and linear_precision(kept) == dtype
    if "int8" in candidates:
        assert checks[0]["dtype"] == "int8" and not checks[0]["kept"] and checks[0]["min"] < 0.99
    if dtype == "fp32":  # bf16, where native, may keep the bar on this model
        assert kept is model and not any(c["kept"] for c in checks)


def test_embed_dtype_auto_stays_near_fp32(minilm, tmp_path, capsys):
    texts = ["The cat sat on the mat.", "A dog barked at the mailman.", "Transformers use attention."]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    for dtype in ("fp32", "auto"):
        assert main(["embed", str(minilm), "--input", str(src), "--output", str(tmp_path / f"{dtype}.npy"),
                     "--dtype", dtype]) == 0
    from attnlab.inference.quantize import fastest_dtype
    assert f"--dtype auto: {fastest_dtype()} on this CPU" in capsys.readouterr().err
    cos = (np.load(tmp_path / "auto.npy") * np.load(tmp_path / "fp32.npy")).sum(-1)
    assert cos.min() >= 0.99, cos


def test_a_layer_of_one_input_feature_gets_the_exact_integer_product(monkeypatch):
    """A (1, N) weight has strides (1, 1); torch's `_int_mm` on a CPU read such a weight wrongly (sums of
    unrelated memory). Every path of the layer gives the exact product there, the torch path too."""
    torch.manual_seed(7)
    lin = nn.Linear(1, 24)
    layer = Int8Linear.from_linear(lin, None, "s8")
    x = torch.randn(20, 1)
    q, s = quantize_rows(x, None)
    want = _gemm_reference(q, s, layer.weight_q, layer.weight_scale, layer.bias)
    with torch.no_grad():
        torch.testing.assert_close(layer(x).double(), want, rtol=1e-6, atol=1e-5)
        monkeypatch.setattr(int8_mod.kernels, "active", lambda name: False)
        torch.testing.assert_close(layer(x).double(), want, rtol=1e-6, atol=1e-5)
