"""Linear attention (Katharopoulos et al. 2020): the chunked parallel form, the recurrent form and the
formula written out quadratically must agree (<= 1e-5), and a model with `attention_kind: linear` must
decode step by step (recurrent state, or any KV cache) to the logits of one parallel pass."""
import pytest
import torch

from attnlab.config import ConfigError, ModelConfig
from attnlab.inference.generate import generate
from attnlab.inference.kv_cache import KVCache
from attnlab.models.decoder import CausalLM
from attnlab.models.encoder import Encoder
from attnlab.nn.linear_attention import (LinearAttentionCache, feature_map, linear_attention,
                                         linear_attention_recurrent)


def qkv(b=2, h=3, t=50, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=g) for _ in range(3)]


def quadratic(q, k, v, causal, padding=None):
    """The paper's eq. 2 with sim(q, k) = phi(q).phi(k), a T x T matrix, one row at a time."""
    fq, fk = feature_map(q), feature_map(k)
    sim = fq @ fk.transpose(-2, -1)
    if causal:
        sim = sim.tril()
    if padding is not None:
        sim = sim * padding[:, None, None, :]
    return (sim @ v) / (sim.sum(-1, keepdim=True) + 1e-6)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_parallel_form_equals_the_quadratic_formula(causal, chunk):
    q, k, v = qkv()
    padding = torch.ones(2, 50)
    padding[1, 40:] = 0
    for pad in (None, padding):
        out, _ = linear_attention(q, k, v, causal=causal, key_padding=pad, chunk=chunk)
        assert (out - quadratic(q, k, v, causal, pad)).abs().max() <= 1e-5


def test_recurrent_form_equals_parallel_form():
    q, k, v = qkv()
    parallel, (s, z) = linear_attention(q, k, v, causal=True, chunk=16)
    recurrent, (s2, z2) = linear_attention_recurrent(q, k, v)
    assert (parallel - recurrent).abs().max() <= 1e-5
    assert (s - s2).abs().max() <= 1e-4 and (z - z2).abs().max() <= 1e-4
    # split anywhere: parallel over a prompt, then the recurrence carries on from its state
    head, state = linear_attention(q[:, :, :20], k[:, :, :20], v[:, :, :20], causal=True)
    tail, _ = linear_attention_recurrent(q[:, :, 20:], k[:, :, 20:], v[:, :, 20:], state)
    assert (torch.cat([head, tail], 2) - parallel).abs().max() <= 1e-5
    # and cached keys given as a prefix (what a KV cache hands back) mean the same
    last, _ = linear_attention(q[:, :, 45:], k, v, causal=True)
    assert (last - parallel[:, :, 45:]).abs().max() <= 1e-5


def test_gradients_do_not_depend_on_the_chunk_size():
    q, k, v = (x.requires_grad_() for x in qkv())
    grads = []
    for chunk in (5, 64):
        out, _ = linear_attention(q, k, v, causal=True, chunk=chunk)
        grads.append(torch.autograd.grad((out * out).sum(), (q, k, v)))
    for a, b in zip(*grads):
        assert (a - b).abs().max() <= 1e-4


def _lm(**kw):
    kw.setdefault("num_kv_heads", 2)
    cfg = ModelConfig(model_type="gpt2", vocab_size=61, hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=64, max_position_embeddings=64, causal=True, norm_placement="pre",
                      type_vocab_size=0, pooler=False, dropout=0.0, attention_dropout=0.0, attention_kind="linear",
                      **kw)
    torch.manual_seed(0)
    return CausalLM(cfg).eval()


@pytest.mark.parametrize("cache_kind", ["recurrent", "kv"])
def test_model_decodes_step_by_step_to_the_parallel_logits(cache_kind):
    model = _lm()
    ids = torch.randint(0, 61, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids).logits
        cache = LinearAttentionCache(2) if cache_kind == "recurrent" else KVCache(2)
        steps = [model(ids[:, :8], past_key_values=cache, use_cache=True).logits]  # a prompt, then tokens
        for t in range(8, 24):
            steps.append(model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits)
    assert (torch.cat(steps, 1) - full).abs().max() <= 1e-5
    assert cache.get_seq_length() == 24
    if cache_kind == "recurrent":  # the state does not grow with the sequence
        s, z = cache.states[0]
        assert s.shape == (2, 4, 8, 8) and z.shape == (2, 4, 8)


def test_generate_with_left_padding_matches_a_greedy_loop_without_cache():
    model = _lm(position="rope")
    ids = torch.randint(1, 61, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    got = generate(model, ids, mask, max_new_tokens=6, eos_token_id=[], pad_token_id=0)
    seq, m = ids, mask
    with torch.no_grad():
        for _ in range(6):
            nxt = model(seq, attention_mask=m).logits[:, -1].argmax(-1, keepdim=True)
            seq, m = torch.cat([seq, nxt], 1), torch.cat([m, torch.ones_like(nxt)], 1)
    assert torch.equal(got, seq)
    with pytest.raises(ValueError, match="attention_kind=linear"):
        generate(model, ids, mask, max_new_tokens=2, compile=True)


def test_generate_decodes_through_the_recurrent_state(monkeypatch):
    """generate() keeps (S, z) per layer, not the keys and values: the cache it builds is the recurrent one."""
    import attnlab.inference.generate as gen
    made = []
    monkeypatch.setattr(gen, "LinearAttentionCache", lambda n: made.append(LinearAttentionCache(n)) or made[-1])
    model = _lm()
    generate(model, torch.tensor([[5, 6, 7]]), max_new_tokens=4, eos_token_id=[])
    assert len(made) == 1 and made[0].get_seq_length() == 6 and made[0].states[1][0].shape == (1, 4, 8, 8)


def test_encoder_with_padding_and_attention_weights():
    cfg = ModelConfig(vocab_size=61, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                      dropout=0.0, attention_dropout=0.0, attention_kind="linear")
    torch.manual_seed(0)
    model = Encoder(cfg).eval()
    ids = torch.randint(0, 61, (2, 10))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        out = model(ids, attention_mask=mask, output_attentions=True, unpad=False)
        alone = model(ids[1:, :6]).last_hidden_state
    # padding changes nothing for the real tokens, and padded keys get zero weight
    assert (out.last_hidden_state[1, :6] - alone[0]).abs().max() <= 1e-5
    w = out.attentions[0]
    assert w.shape == (2, 4, 10, 10) and torch.allclose(w.sum(-1), torch.ones(2, 4, 10), atol=1e-4)
    assert (w[1, :, :, 6:] == 0).all()


def test_unsupported_combinations_are_clear_errors():
    with pytest.raises(ConfigError, match="attention_kind"):
        _lm(sliding_window=8)
    with pytest.raises(ConfigError, match="attention_kind"):
        ModelConfig(attention_kind="performer")
    model = _lm()
    with pytest.raises(ValueError, match="packed documents"):
        model(torch.zeros(1, 6, dtype=torch.long), document_ids=torch.tensor([[0, 0, 0, 1, 1, 1]]))


def test_saving_keeps_the_kind_and_hf_layouts_refuse_it(tmp_path):
    """No transformers family has linear attention: writing one as GPT-2 would load back as softmax, so
    the HF writer refuses and attnlab.save keeps attnlab's own layout, which loads the same model."""
    import attnlab
    from attnlab.interop.hf import save_pretrained
    model = _lm(embedding_norm=False, num_kv_heads=None, norm_eps=1e-5)  # GPT-2 in all but the kind
    with pytest.raises(ConfigError, match="attention_kind='linear'"):
        save_pretrained(model, tmp_path / "hf")
    back = attnlab.load(attnlab.save(model, tmp_path / "native"))
    ids = torch.randint(0, 61, (1, 9))
    with torch.no_grad():
        assert back.config.attention_kind == "linear" and torch.equal(back(ids).logits, model(ids).logits)
