"""Generation: the KV cache equals recomputation (GPT-2 and GQA LLaMA, left-padded batches), greedy and beam
search equal transformers, sampling controls behave, and streaming is correct across multi-byte pieces."""
from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab.config import ModelConfig
from attnlab.inference.generate import (TextStreamer, apply_repetition_penalty, encode_prompts, generate, stream,
                                        top_k_filter, top_p_filter)
from attnlab.inference.kv_cache import KVCache

DECODER = dict(causal=True, norm_placement="pre", embedding_norm=False, pooler=False, type_vocab_size=0,
               pad_token_id=None, dropout=0.0, attention_dropout=0.0, max_position_embeddings=64)


def tiny(kind: str, vocab: int = 300, seed: int = 0):
    torch.manual_seed(seed)
    if kind == "gpt2":
        cfg = ModelConfig(model_type="gpt2", vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=4,
                          intermediate_size=64, activation="gelu_tanh", **DECODER)
    else:  # LLaMA-style with grouped-query attention
        cfg = ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=4,
                          num_kv_heads=2, intermediate_size=64, position="rope", norm="rmsnorm", activation="swiglu",
                          bias=False, rope_theta=500.0, tie_word_embeddings=False, **DECODER)
    return attnlab.from_config(cfg).eval()


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("max_length", [None, 10])  # growing buffers, and preallocated ones
def test_kv_cache_equals_recompute_with_left_padding(kind, max_length):
    model = tiny(kind)
    torch.manual_seed(3)
    ids = torch.randint(0, 300, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :5] = 0
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        cache = KVCache(2, max_length=max_length)
        steps = [model(ids[:, :4], attention_mask=mask[:, :4], past_key_values=cache, use_cache=True).logits]
        for t in range(4, 10):
            steps.append(model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], past_key_values=cache,
                               use_cache=True).logits)
        incremental = torch.cat(steps, dim=1)
        real = mask.bool()
        assert (incremental[real] - full[real]).abs().max().item() <= 1e-5
        # the padded row equals the same tokens run alone: positions come from the mask
        alone = model(ids[1:2, 3:]).logits
        assert (full[1, 3:] - alone[0]).abs().max().item() <= 1e-5
    assert cache.get_seq_length() == 10


def test_cache_reorder_and_crop():
    cache = KVCache(1, max_length=4)
    k = torch.arange(6.0).view(3, 1, 2, 1)
    cache.update(0, k, k)
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.keys[0][:, 0, :2, 0].tolist() == [[4, 5], [4, 5], [0, 1]]
    cache.crop(1)
    assert cache.get_seq_length() == 1
    with pytest.raises(IndexError, match="layer_idx=3"):
        cache.update(3, k, k)


def hf_gpt2(vocab=300):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                  bos_token_id=0, eos_token_id=1, pad_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def to_ours(hf_model, tmp_path):
    hf_model.save_pretrained(tmp_path / "m")
    return attnlab.load(tmp_path / "m")


def test_greedy_left_padded_batch_equals_transformers(tmp_path):
    hf = hf_gpt2()
    ours = to_ours(hf, tmp_path)
    ids = torch.randint(2, 300, (3, 7))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[2, :2] = 0
    ids = ids.masked_fill(mask == 0, 0)
    with torch.no_grad():
        want = hf.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0,
                           eos_token_id=None)
    got = generate(ours, ids, mask, max_new_tokens=12, eos_token_id=[], pad_token_id=0)
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize("length_penalty,early_stopping", [(1.0, False), (0.6, True), (2.0, "never")])
def test_beam_search_equals_transformers(tmp_path, length_penalty, early_stopping):
    hf = hf_gpt2()
    ours = to_ours(hf, tmp_path)
    torch.manual_seed(5)
    ids = torch.randint(2, 300, (2, 5))
    # use as EOS a token the model likes, so that hypotheses really finish early
    eos = int(generate(ours, ids[:1], max_new_tokens=3, eos_token_id=[])[0, -1])
    kwargs = dict(num_beams=4, max_new_tokens=10, length_penalty=length_penalty, early_stopping=early_stopping)
    with torch.no_grad():
        want = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, eos_token_id=eos,
                           pad_token_id=3, **kwargs)
    got = generate(ours, ids, eos_token_id=eos, pad_token_id=3, **kwargs)  # (a pad of 0 would be
    # replaced by EOS in transformers: it fills with `pad_token_id or eos_token_id`)
    assert got.tolist() == want.tolist()


def test_sampling_controls():
    model = tiny("llama")
    ids = torch.randint(0, 300, (2, 4))
    greedy = generate(model, ids, max_new_tokens=8, eos_token_id=[])
    a = generate(model, ids, max_new_tokens=8, temperature=1.5, seed=7, eos_token_id=[])
    b = generate(model, ids, max_new_tokens=8, temperature=1.5, seed=7, eos_token_id=[])
    c = generate(model, ids, max_new_tokens=8, temperature=1.5, seed=8, eos_token_id=[])
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(generate(model, ids, max_new_tokens=8, temperature=1.0, top_k=1, seed=1, eos_token_id=[]),
                       greedy)
    assert torch.equal(generate(model, ids, max_new_tokens=8, temperature=1.0, top_p=1e-6, seed=1,
                                eos_token_id=[]), greedy)
    for bad in ({"top_p": 0.0}, {"top_p": 1.5}, {"temperature": -1.0}, {"top_k": 0}, {"num_beams": 0}):
        with pytest.raises(ValueError, match=list(bad)[0]):
            generate(model, ids, max_new_tokens=2, **bad)


def test_filters_and_repetition_penalty():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert top_k_filter(logits, 2).isinf().tolist() == [[True, False, False, True]]
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert top_p_filter(probs, 0.7).isinf().tolist() == [[False, False, True, True]]   # 0.5 + 0.3 reaches 0.7
    assert top_p_filter(probs, 0.5).isinf().tolist() == [[False, True, True, True]]
    assert top_p_filter(probs, 1.0).isinf().sum() == 0
    pen = apply_repetition_penalty(torch.tensor([[2.0, -2.0, 1.0]]), torch.tensor([[0, 1, 1]]), 2.0)
    assert pen.tolist() == [[1.0, -4.0, 1.0]]
    transformers = pytest.importorskip("transformers")
    scores = torch.randn(2, 50)
    seqs = torch.randint(0, 50, (2, 9))
    want = transformers.RepetitionPenaltyLogitsProcessor(1.3)(seqs, scores.clone())
    assert torch.allclose(apply_repetition_penalty(scores, seqs, 1.3), want)


def test_eos_stops_rows_and_pads():
    model = tiny("gpt2")
    ids = torch.randint(0, 300, (2, 4))
    free = generate(model, ids, max_new_tokens=6, eos_token_id=[])
    eos = int(free[0, 4 + 2])  # row 0's third new token
    out = generate(model, ids, max_new_tokens=6, eos_token_id=eos, pad_token_id=299)
    first = free[0, 4:].tolist().index(eos)
    assert out[0, 4 + first].item() == eos and (out[0, 5 + first:] == 299).all()
    if eos not in free[1, 4:].tolist():  # the other row is unaffected
        assert torch.equal(out[1], free[1])


def test_context_overflow_is_an_error_or_left_truncation():
    model = tiny("gpt2")  # max_position_embeddings=64
    ids = torch.randint(0, 300, (1, 60))
    with pytest.raises(ValueError, match="exceeds the model's context of 64"):
        generate(model, ids, max_new_tokens=8)
    out = generate(model, ids, max_new_tokens=8, truncation="left", eos_token_id=[])
    assert out.shape == (1, 64) and torch.equal(out[0, :56], ids[0, -56:])


# ----------------------------------------------------------------------------------- streaming and text
class ScriptedLM(torch.nn.Module):
    """Emits a fixed token script whatever the input: streams can be checked on exact tokens."""

    def __init__(self, script: list[int], vocab: int) -> None:
        super().__init__()
        self.script = script
        self.config = ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=8, num_layers=1, num_heads=2,
                                  intermediate_size=8, causal=True, max_position_embeddings=4096, pad_token_id=None,
                                  eos_token_id=2)
        self.prompt_len = None

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False, logits_to_keep=0):
        b, t = input_ids.shape
        if past_key_values.get_seq_length() == 0:
            self.prompt_len = t
        step = past_key_values.get_seq_length() + t - self.prompt_len
        past_key_values.update(0, torch.zeros(b, 1, t, 1), torch.zeros(b, 1, t, 1))
        logits = torch.zeros(b, 1, self.config.vocab_size)
        logits[:, :, self.script[step] if step < len(self.script) else 2] = 1.0
        return attnlab.ModelOutput(logits=logits)


@pytest.fixture(scope="module")
def bpe():
    from attnlab.interop.gguf import tokenizer_from_gguf
    from attnlab.interop.local import resolve
    return tokenizer_from_gguf(resolve("smollm2"))  # SmolLM2's byte-level BPE, from the packaged GGUF


TEXT = "Café naïve 🙂🚀 Zürich — 日本語 ok"


def test_streamer_is_correct_across_multibyte_pieces(bpe):
    ids = bpe.encode(TEXT, add_special_tokens=False)
    # the test means something only if some token holds part of a character
    assert any("\ufffd" in bpe.decode([i]) for i in ids)
    streamer = TextStreamer(bpe)
    pieces = [streamer.push(i) for i in ids] + [streamer.flush()]
    assert "".join(pieces) == TEXT == bpe.decode(ids)
    assert not any("\ufffd" in p for p in pieces)
    assert sum(1 for p in pieces if p) > 5  # it streams, not one blob at the end


def test_stream_stops_at_eos_and_stop_strings(bpe):
    ids = bpe.encode(TEXT, add_special_tokens=False)
    model = ScriptedLM(ids + [2, 5, 6], bpe.vocab_size)
    pieces = list(stream(model, bpe, "Hi", max_new_tokens=100))
    assert "".join(pieces) == TEXT  # EOS (2) ends the stream and is not shown
    cut = list(stream(ScriptedLM(ids, bpe.vocab_size), bpe, "Hi", max_new_tokens=100, stop_strings=["Zürich"]))
    assert "".join(cut) == "Café naïve 🙂🚀 "
    short = list(stream(ScriptedLM(ids, bpe.vocab_size), bpe, "Hi", max_new_tokens=3))
    assert "".join(short) == bpe.decode(ids[:3])
    out = generate(ScriptedLM(ids, bpe.vocab_size), encode_prompts(bpe, "Hi")[0], max_new_tokens=50,
                   stop_strings=["naïve"], tokenizer=bpe, pad_token_id=0)
    text = bpe.decode(out[0, 1:])
    assert text.startswith("Café naïve") and "🙂" not in text


def test_encode_prompts_left_pads(bpe):
    ids, mask = encode_prompts(bpe, ["a b c d", "hello"])
    assert mask[:, -1].all() and mask[1, 0] == 0 and mask[0].all()
    with pytest.raises(ValueError, match="left padding"):
        generate(tiny("gpt2", vocab=bpe.vocab_size), ids.flip(1), mask.flip(1), max_new_tokens=2)
