"""The one-pass CPU dropout (nn/dropout.py, csrc/dropout.c): its law (keep rate, scale, independence), its
backward (the same mask, recomputed), its determinism (torch's seed, any thread split), the attention path that
uses it in training against SDPA, and where it stands aside."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.nn import dropout as dropout_mod
from attnlab.nn import kernels
from attnlab.nn.attention import AttentionMask, scaled_dot_product_attention
from attnlab.nn.dropout import Dropout, dropout
from attnlab.nn.kernel_signatures import KernelArgumentError

pytestmark = pytest.mark.skipif(kernels.library() is None, reason="no C compiler: the kernels cannot be built")


def _threads(n):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    return old


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keep_rate_and_scale(p, dtype):
    torch.manual_seed(0)
    x = (torch.rand(256, 4096) + 0.5).to(dtype)  # no zeros, so a zero out is a dropped element
    assert dropout_mod.applies(x)
    y = dropout(x, p)
    kept = y != 0
    n = x.numel()
    se = (p * (1 - p) / n) ** 0.5
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * se
    want = (x[kept].float() * (1 / (1 - p))).to(dtype)
    assert torch.equal(y[kept], want)  # times 1 / (1 - p), rounded once, as torch's dropout
    # each row and each column position is dropped at the same rate (no row or lane left out)
    rows = kept.float().mean(1)
    assert (rows - (1 - p)).abs().max() < 6 * (p * (1 - p) / 4096) ** 0.5
    lanes = kept.float().mean(0)
    assert (lanes - (1 - p)).abs().max() < 6 * (p * (1 - p) / 256) ** 0.5


def test_draws_are_independent_of_their_neighbours():
    torch.manual_seed(1)
    kept = (dropout(torch.ones(512, 2048), 0.5) != 0).float()
    centred = kept - kept.mean()
    var = centred.pow(2).mean()
    n = kept.numel()
    # neighbours in a row, in a column, and the same lane of rows far apart: correlation ~ 0 (SE 1/sqrt(n))
    for a, b in ((centred[:, 1:], centred[:, :-1]), (centred[1:], centred[:-1]), (centred[256:], centred[:256]),
                 (centred[:, 8:], centred[:, :-8])):
        assert abs((a * b).mean() / var) < 5 / n ** 0.5


def test_backward_uses_the_forward_mask():
    torch.manual_seed(2)
    x = torch.randn(64, 384, requires_grad=True)
    y = dropout(x, 0.3)
    g = torch.randn_like(y)
    y.backward(g)
    kept = y != 0
    assert torch.equal(x.grad != 0, kept)
    torch.testing.assert_close(x.grad[kept], g[kept] / 0.7, rtol=1e-6, atol=0)
    # a non-contiguous upstream gradient is read in its own layout
    x.grad = None
    y = dropout(x, 0.3)
    kept = y != 0
    gt = torch.randn(384, 64).t()
    y.backward(gt)
    torch.testing.assert_close(x.grad, torch.where(kept, gt / 0.7, torch.zeros(())), rtol=1e-6, atol=0)


def test_torch_seed_fixes_the_mask_and_the_thread_split_does_not_matter():
    x = torch.randn(300, 700)
    old = _threads(1)
    try:
        torch.manual_seed(5)
        one = dropout(x, 0.2)
        torch.set_num_threads(2)
        torch.manual_seed(5)
        two = dropout(x, 0.2)
        other = dropout(x, 0.2)  # the next draw of the generator
    finally:
        torch.set_num_threads(old)
    assert torch.equal(one, two)
    assert not torch.equal(one, other)


def test_nan_stays_nan_and_p_edges():
    x = torch.ones(64, 128)
    x[3, 7] = float("nan")
    torch.manual_seed(0)
    assert torch.isnan(dropout(x, 0.5)[3, 7])  # dropped or kept, NaN * 0 is NaN (as torch's dropout)
    assert dropout(x, 0.0) is x and dropout(x, 0.5, training=False) is x
    assert (dropout(torch.ones(64, 128), 1.0) == 0).all()  # p = 1: torch's F.dropout


def test_where_it_stands_aside(monkeypatch):
    assert not dropout_mod.applies(torch.ones(64, 128, dtype=torch.float64))
    assert not dropout_mod.applies(torch.ones(8))  # too small for a C call to pay
    monkeypatch.setenv("ATTNLAB_FUSED", "0")
    assert not dropout_mod.applies(torch.ones(64, 128))
    monkeypatch.delenv("ATTNLAB_FUSED")
    called = []
    monkeypatch.setattr(dropout_mod, "_apply", lambda *a: called.append(1) or a[0])
    m = Dropout(0.1)
    m(torch.ones(64, 128))
    assert called == [1]
    m.eval()
    assert torch.equal(m(torch.ones(64, 128)), torch.ones(64, 128))
    assert isinstance(m, torch.nn.Dropout) and not m.state_dict()


def test_bad_threshold_is_refused_before_c():
    x = torch.ones(4, 8)
    with pytest.raises(KernelArgumentError, match="threshold"):
        kernels.call("dropout_rows", x, torch.empty_like(x), 8, 1, 1 << 32, 1.0, 0)
    with pytest.raises(KernelArgumentError):
        kernels.call("dropout_rows", x, torch.empty(4, 7), 8, 1, 10, 1.0, 0)


def _qkv(seed, b=4, h=4, t=20, d=16):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=gen, requires_grad=True) for _ in range(3)]


def test_attention_in_training_equals_sdpa_without_the_drops(monkeypatch):
    """With the mask's draws replaced by 'keep all', the training path is SDPA (values and gradients):
    the scale, the key padding and the softmax are right; the drops are the dropout tests' business."""
    monkeypatch.setattr(dropout_mod, "dropout", lambda x, p, training=True: x)
    keep = torch.ones(4, 20, dtype=torch.bool)
    keep[1, 12:] = False
    keep[3, 5:] = False
    mask = AttentionMask.build(keep, 20, 20)
    q, k, v = _qkv(0)
    out, _ = scaled_dot_product_attention(q, k, v, mask, dropout_p=0.1)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    q2, k2, v2 = _qkv(0)
    ref = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=keep[:, None, None, :])
    refs = torch.autograd.grad(ref, (q2, k2, v2), g)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for a, r in zip(grads, refs):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-6)


def test_attention_in_training_drops_probabilities():
    """The path's output is probs-with-drops @ v: with v the identity over keys, the output is the
    dropped probabilities themselves: each zero or its softmax value / (1 - p), ~p of them zero."""
    t = 24
    q = torch.randn(2, 4, t, t)
    k = torch.randn(2, 4, t, t)
    v = torch.eye(t).expand(2, 4, t, t).contiguous()
    torch.manual_seed(0)
    out, _ = scaled_dot_product_attention(q, k, v, AttentionMask(), dropout_p=0.25)
    probs = (q @ k.transpose(-1, -2) * t ** -0.5).softmax(-1)
    dropped = out == 0
    assert 0.15 < dropped.float().mean() < 0.35
    torch.testing.assert_close(out[~dropped], probs[~dropped] / 0.75, rtol=1e-5, atol=1e-7)


def test_attention_with_other_masks_keeps_sdpa():
    """A causal mask is not the path's case: SDPA runs (its math path draws with bernoulli_)."""
    q, k, v = _qkv(1)
    torch.manual_seed(0)
    out, _ = scaled_dot_product_attention(q, k, v, AttentionMask(is_causal=True), dropout_p=0.1)
    torch.manual_seed(0)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1)
    torch.testing.assert_close(out, ref)
