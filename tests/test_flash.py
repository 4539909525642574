"""FlashAttention's algorithm (attnlab/nn/flash.py) must mean what the explicit softmax path means, for
every mask kind attnlab builds, in the forward pass (<= 1e-5) and in the gradients of q, k, v (<= 1e-4),
and a model switched to `attn_implementation: tiled` must equal the same model on SDPA."""
import pytest
import torch

from attnlab.config import ConfigError, ModelConfig
from attnlab.models.decoder import CausalLM
from attnlab.models.encoder import Encoder
from attnlab.nn import AttentionMask, scaled_dot_product_attention
from attnlab.nn.flash import tiled_attention
from attnlab.nn.positions import RelativePositionBias

T = 37  # not a multiple of the test blocks: ragged last tiles


def qkv(b=3, h=4, hkv=4, tq=T, tk=T, d=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()
            for shape in ((b, h, tq, d), (b, hkv, tk, d), (b, hkv, tk, d))]


def pad(t=T, left=False):
    m = torch.zeros(3, t, dtype=torch.long)
    for i, n in enumerate((t, t - 11, 5)):
        m[i, t - n:] = 1 if left else 0
        if not left:
            m[i, :n] = 1
    return m


GLOBAL = torch.zeros(3, T, dtype=torch.bool)
GLOBAL[:, 0] = True
GLOBAL[0, 30] = True
DOCS = torch.tensor([[0] * 10 + [1] * 20 + [2] * 7, [0] * T, [0] * 30 + [1] * 7])
CASES = {  # name -> (AttentionMask.build keywords, Tq, query_offset)
    "none": dict(),
    "padding": dict(padding=pad()),
    "causal": dict(causal=True),
    "causal+left-padding": dict(causal=True, padding=pad(left=True)),  # rows that see nothing
    "window": dict(window=6),
    "causal+window": dict(causal=True, window=6),
    "causal+window+padding": dict(causal=True, window=6, padding=pad()),
    "packed-documents": dict(causal=True, documents=DOCS),
    "bidirectional-documents+padding": dict(documents=DOCS, padding=pad()),
    "window+global-tokens+padding": dict(window=4, global_tokens=GLOBAL, padding=pad()),  # Longformer
}


def grads(out, inputs, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.autograd.grad(out, inputs, torch.randn(out.shape, generator=g))


def check(mask, q, k, v, bias=None, blocks=(16, 8)):
    ref, _ = scaled_dot_product_attention(q, k, v, mask, bias, explicit=True)
    if q.size(1) != k.size(1):
        groups = q.size(1) // k.size(1)
        kk, vv = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    else:
        kk, vv = k, v
    out = tiled_attention(q, kk, vv, mask, bias, block_q=blocks[0], block_k=blocks[1])
    assert out.shape == ref.shape
    assert (out - ref).abs().max() <= 1e-5
    inputs = [q, k, v] + ([bias] if bias is not None and bias.requires_grad else [])
    for a, b in zip(grads(ref, inputs), grads(out, inputs)):
        assert (a - b).abs().max() <= 1e-4
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_tiled_equals_explicit_forward_and_gradients(case):
    kw = dict(CASES[case])
    mask = AttentionMask.build(kw.pop("padding", None), T, T, **kw)
    out = check(mask, *qkv())
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("blocks", [(1, 1), (5, 7), (64, 64)])
def test_block_sizes_do_not_change_the_result(blocks):
    mask = AttentionMask.build(pad(), T, T, causal=True, window=9)
    check(mask, *qkv(), blocks=blocks)


def test_cached_queries_with_offset_and_plain_causal_flag():
    """Decoding a chunk of 5 queries after 32 cached keys: causal with query_offset, both as a recipe
    (padding present) and as the fused kernel's is_causal flag (bottom-right aligned, like the explicit path)."""
    q, k, v = qkv(tq=5, tk=T)
    check(AttentionMask.build(pad(), 5, T, causal=True, query_offset=T - 5), q, k, v)
    check(AttentionMask(None, True), q, k, v)
    check(AttentionMask.build(None, 5, T, causal=True, window=4, query_offset=T - 5), q, k, v)


def test_cross_attention_padding_with_fewer_queries_than_keys():
    q, k, v = qkv(tq=5, tk=T)
    check(AttentionMask.build(pad(), 5, T), q, k, v)


def test_dense_mask_tensor_and_gqa_through_the_dispatcher():
    """A mask given only as a dense tensor (how compiled decoding builds one) is sliced per tile; GQA/MQA
    key heads are repeated and their gradients summed back."""
    allowed = torch.rand(3, 1, T, T, generator=torch.Generator().manual_seed(3)) > 0.3
    allowed |= torch.eye(T, dtype=torch.bool)
    check(AttentionMask(allowed), *qkv())
    for hkv in (2, 1):
        q, k, v = qkv(hkv=hkv)
        mask = AttentionMask.build(pad(), T, T, causal=True)
        ref, _ = scaled_dot_product_attention(q, k, v, mask, explicit=True)
        out, weights = scaled_dot_product_attention(q, k, v, mask, tiled=True)
        assert weights is None and (out - ref).abs().max() <= 1e-5
        for a, b in zip(grads(ref, [q, k, v]), grads(out, [q, k, v])):
            assert (a - b).abs().max() <= 1e-4


def test_relative_bias_with_its_gradient():
    bias_module = RelativePositionBias(4, 32, 128, bidirectional=False)
    bias = bias_module(T, T).detach().requires_grad_()
    check(AttentionMask.build(pad(), T, T, causal=True), *qkv(), bias=bias)


def test_backward_recomputes_the_same_dropout_masks():
    """With dropout the keep-masks are regenerated from the seed in the backward pass: the analytic
    gradient matches finite differences (gradcheck, float64), which it would not if the masks differed."""
    q, k, v = (x.detach().double()[:1, :2, :12].requires_grad_() for x in qkv())
    mask = AttentionMask.build(None, 12, 12, causal=True)

    def f(q, k, v):
        torch.manual_seed(0)  # the same per-call seed for every evaluation gradcheck makes
        return tiled_attention(q, k, v, mask, dropout_p=0.3, block_q=4, block_k=4)

    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-6, atol=1e-5)
    torch.manual_seed(0)
    dropped = tiled_attention(q, k, v, mask, dropout_p=0.3)
    assert not torch.allclose(dropped, tiled_attention(q, k, v, mask))


def test_mask_recipe_stays_lazy_and_skips_tiles():
    mask = AttentionMask.build(None, 4096, 4096, window=64, causal=True, device="cpu")
    assert mask.block(0, 128, 1024, 1152, 4096, 4096) is False  # above the diagonal
    assert mask.block(2048, 2176, 0, 128, 4096, 4096) is False  # far outside the window
    assert mask.block(1024, 1025, 1000, 1001, 4096, 4096) is None  # inside both: no tensor at all
    assert mask._allowed is None  # the dense 4096 x 4096 mask was never built
    glob = torch.zeros(1, 4096, dtype=torch.bool)
    glob[0, 3000] = True
    longformer = AttentionMask.build(None, 4096, 4096, window=64, global_tokens=glob, device="cpu")
    assert longformer.block(0, 128, 1024, 1152, 4096, 4096) is False
    assert longformer.block(0, 128, 2944, 3072, 4096, 4096)[0, 0, :, 3000 - 2944].all()  # a global key
    assert longformer.block(2944, 3072, 0, 128, 4096, 4096)[0, 0, 3000 - 2944].all()  # a global query
    assert mask.allowed.shape == (1, 1, 4096, 4096)


def test_bad_shapes_are_one_clear_error():
    q, k, v = qkv(hkv=2)
    with pytest.raises(ValueError, match="equal heads"):
        tiled_attention(q, k, v)
    with pytest.raises(ValueError, match="block sizes"):
        tiled_attention(q, q, q, block_q=0)
    with pytest.raises(ConfigError, match="attn_implementation"):
        ModelConfig(attn_implementation="flash")


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["gpt", "bert-padding", "local-global"])
def test_model_with_tiled_backend_equals_sdpa_end_to_end(kind):
    """Same weights, attn_implementation sdpa vs tiled: logits/hidden states <= 1e-5, parameter gradients
    <= 1e-4. T = 150 spans two 128-wide tiles."""
    base = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                max_position_embeddings=160, dropout=0.0, attention_dropout=0.0)
    if kind == "gpt":
        base.update(model_type="gpt2", causal=True, norm_placement="pre", num_kv_heads=2, position="rope",
                    type_vocab_size=0, pooler=False)
    elif kind == "local-global":
        base.update(sliding_window=17, extra={"global_every": 2}, norm_placement="pre", pooler=False)
    torch.manual_seed(0)
    ids = torch.randint(0, 97, (2, 150))
    mask = torch.ones(2, 150, dtype=torch.long)
    mask[1, 120:] = 0
    results = []
    for impl in ("sdpa", "tiled"):
        cfg = ModelConfig(**base, attn_implementation=impl)
        torch.manual_seed(1)
        model = CausalLM(cfg) if kind == "gpt" else Encoder(cfg)
        if kind == "gpt":
            out = model(ids, labels=ids).logits
        else:
            out = model(ids, attention_mask=mask if kind == "bert-padding" else None).last_hidden_state  # unpadded (varlen) path
        (out * torch.linspace(-1, 1, out.size(-1))).mean().backward()  # mean: O(1) gradients, fp32 sums stay exact enough
        results.append((out.detach(), _grads(model)))
    (a, ga), (b, gb) = results
    assert (a - b).abs().max() <= 1e-5
    assert ga.keys() == gb.keys() and len(ga) > 10
    assert max((ga[n] - gb[n]).abs().max().item() for n in ga) <= 1e-4


def test_t5_with_tiled_backend_equals_sdpa_with_bias_gradients():
    """An encoder-decoder: learned relative position bias (its gradient comes out of the tiled backward),
    padded cross-attention, causal decoder self-attention."""
    from attnlab.config import preset
    from attnlab.models.seq2seq import Seq2SeqLM
    ids = torch.randint(3, 61, (2, 140), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[0, 100:] = 0
    dec = torch.randint(3, 61, (2, 133), generator=torch.Generator().manual_seed(4))
    results = []
    for impl in ("sdpa", "tiled"):
        torch.manual_seed(0)
        cfg = preset("t5-small", vocab_size=61, hidden_size=32, num_layers=2, num_heads=4, head_dim=8,
                     intermediate_size=64, dropout=0.0, attention_dropout=0.0, relative_num_buckets=8,
                     relative_max_distance=16, attn_implementation=impl)
        cfg.extra["num_decoder_layers"] = 2
        model = Seq2SeqLM(cfg)
        out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        (out * torch.linspace(-1, 1, out.size(-1))).mean().backward()
        results.append((out.detach(), _grads(model)))
    (a, ga), (b, gb) = results
    assert (a - b).abs().max() <= 1e-5
    assert any("relative" in n for n in ga) and ga.keys() == gb.keys()
    assert max((ga[n] - gb[n]).abs().max().item() for n in ga) <= 1e-4
