"""Compiled decoding (static KV cache + one compiled step) gives what eager decoding gives."""
from __future__ import annotations

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.inference import compiled
from attnlab.inference.generate import generate
from attnlab.models.decoder import CausalLM
from test_generate import tiny


def left_padded(vocab: int = 300):
    torch.manual_seed(1)
    ids = torch.randint(3, vocab, (3, 7))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # rows of different lengths, left-padded
    mask[2, :1] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("kind", ["gpt2", "llama"])  # learned positions + MHA; RoPE + GQA + RMSNorm + SwiGLU
def test_static_cache_step_equals_eager_decoding(kind):
    # backend="eager" traces the step with dynamo (fullgraph: no graph breaks) without code generation,
    # so this checks the static cache, mask and positions in seconds
    model = tiny(kind)
    ids, mask = left_padded()
    want = generate(model, ids, mask, max_new_tokens=12, eos_token_id=[])
    compiled.forget(model)
    compiled._DECODERS[model] = compiled.StaticDecoder(model, backend="eager")
    got = generate(model, ids, mask, max_new_tokens=12, eos_token_id=[], compile=True)
    assert torch.equal(got, want)
    sampled = [generate(model, ids, mask, max_new_tokens=8, temperature=0.9, seed=3, eos_token_id=[], compile=c)
               for c in (False, True)]
    assert torch.equal(*sampled)


def test_inductor_compiled_step_matches_eager_logits():
    model = tiny("llama")
    compiled.forget(model)
    decoder = compiled.StaticDecoder(model, autotune=False)  # freezing on; no GEMM autotuning (slow)
    ids, mask = left_padded()
    with torch.inference_mode():
        fast = decoder.session(ids, mask, 6)
        from attnlab.inference.generate import _EagerSteps
        slow = _EagerSteps(model, mask, ids.size(1) + 6)
        a, b = fast(ids), slow(ids)
        for _ in range(5):
            assert (a - b).abs().max() < 1e-4
            token = a.argmax(-1, keepdim=True)
            a, b = fast(token), slow(token)


def test_what_compile_does_not_cover_is_a_clear_error():
    cfg = ModelConfig(model_type="llama", vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                      intermediate_size=32, position="rope", norm="rmsnorm", activation="swiglu", bias=False,
                      causal=True, sliding_window=4, max_position_embeddings=64, extra={"global_every": 2})
    model = CausalLM(cfg).eval()  # local and global layers (an all-local window is covered: test_mistral.py)
    with pytest.raises(ValueError, match="sliding_window=4 in some layers only"):
        generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=2, compile=True)
    moe = CausalLM(cfg.replace(sliding_window=None, extra={}, num_experts=4)).eval()
    with pytest.raises(ValueError, match="mixture of experts"):
        generate(moe, torch.tensor([[1, 2, 3]]), max_new_tokens=2, compile=True)
    with pytest.raises(ValueError, match="not beam search"):
        generate(tiny("gpt2"), torch.tensor([[1, 2, 3]]), max_new_tokens=2, num_beams=2, compile=True)
