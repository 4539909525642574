"""Each position scheme against an independent computation written from its paper."""
import math

import torch

from attnlab.nn.positions import RelativePositionBias, RotaryEmbedding, apply_rotary, relative_position_bucket, \
    sinusoidal_table


def test_sinusoidal_matches_the_formula():
    n, d = 50, 16
    table = sinusoidal_table(n, d)
    for pos in range(n):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert math.isclose(table[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(table[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)


def test_sinusoidal_relative_shift_is_linear():
    # the paper's motivation (§3.5): PE(pos + k) is a fixed linear function (rotation) of PE(pos)
    table = sinusoidal_table(64, 8).double()
    k = 5
    a, b = table[:-k], table[k:]
    solution = torch.linalg.lstsq(a, b).solution
    assert (a @ solution - b).abs().max() < 1e-6


def test_rope_equals_complex_rotation():
    d, theta = 8, 10000.0
    rope = RotaryEmbedding(d, theta)
    pos = torch.arange(12)[None]
    cos, sin = rope(pos)
    x = torch.randn(1, 1, 12, d)
    got = apply_rotary(x, cos, sin)
    # independent: pair dimension j with j + d/2 as a complex number and multiply by e^{i pos θ_j}
    half = d // 2
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    freqs = 1.0 / theta ** (torch.arange(half, dtype=torch.float64) * 2 / d)
    rot = torch.polar(torch.ones(12, half, dtype=torch.float64), torch.arange(12)[:, None] * freqs)
    expect = z * rot
    assert torch.allclose(got[..., :half].double(), expect.real, atol=1e-5)
    assert torch.allclose(got[..., half:].double(), expect.imag, atol=1e-5)


def test_rope_scores_depend_only_on_distance():
    rope = RotaryEmbedding(16)
    q, k = torch.randn(16), torch.randn(16)

    def score(i, j):
        cos, sin = rope(torch.tensor([[i, j]]))
        qr = apply_rotary(q.view(1, 1, 1, 16).expand(1, 1, 2, 16), cos, sin)[0, 0, 0]
        kr = apply_rotary(k.view(1, 1, 1, 16).expand(1, 1, 2, 16), cos, sin)[0, 0, 1]
        return (qr @ kr).item()

    assert math.isclose(score(3, 7), score(10, 14), rel_tol=1e-4, abs_tol=1e-4)


def reference_bucket(rel, bidirectional, num_buckets, max_distance):
    """T5's bucketing written out per scalar."""
    ret = 0
    n = -rel  # T5 writes it for n = query - key
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            ret += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    val = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return ret + min(val, num_buckets - 1)


def test_relative_buckets_match_reference():
    rel = torch.arange(-300, 301)
    for bidirectional in (True, False):
        got = relative_position_bucket(rel, bidirectional, 32, 128)
        expect = [reference_bucket(int(r), bidirectional, 32, 128) for r in rel]
        assert got.tolist() == expect


def test_relative_bias_shape_and_offset():
    rpb = RelativePositionBias(num_heads=3, num_buckets=8, max_distance=16, bidirectional=False)
    full = rpb(6, 6)
    assert full.shape == (1, 3, 6, 6)
    step = rpb(1, 6, offset=5)  # the last query alone, as when decoding with a cache
    assert torch.equal(step[0, :, 0], full[0, :, 5])
