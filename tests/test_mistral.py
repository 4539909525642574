"""Mistral (issue 24): MistralForCausalLM parity both ways with a window (16) shorter than the inputs, and the
rolling KV cache: 64 cached decoding steps equal the uncached model and transformers while no layer ever
holds more than `window` keys; the paged engine and the compiled decode step give the same tokens."""
from __future__ import annotations

import warnings

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

import attnlab
from attnlab.inference import compiled
from attnlab.inference.engine import Engine, SamplingParams
from attnlab.inference.generate import generate
from attnlab.inference.kv_cache import KVCache
from attnlab.inference.paged import BlockPool, BlockTable
from _families import randomize

WINDOW = 16


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(transformers model, attnlab model loaded from its save, directory) with a 16-token window."""
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=WINDOW,
                        max_position_embeddings=256, eos_token_id=None, bos_token_id=None)
    hf = randomize(MistralForCausalLM(cfg))
    path = tmp_path_factory.mktemp("mistral") / "hf"
    hf.save_pretrained(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean load: no missing or unused tensors
        ours = attnlab.load(path)
    return hf, ours, path


def ids(batch=2, length=72, seed=1):
    return torch.randint(0, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_parity_both_directions_window_matters(pair, tmp_path):
    hf, ours, _ = pair
    assert ours.config.model_type == "mistral" and ours.config.sliding_window == WINDOW
    x = ids()
    mask = torch.ones_like(x)
    mask[1, :5] = 0  # a left-padded row
    with torch.no_grad():
        want = hf(x, attention_mask=mask).logits
        got = ours(x, attention_mask=mask).logits
        full = ours(x, attention_mask=mask).logits
        ours.config.sliding_window = None  # the same weights without the window differ: the window is used
        no_window = ours(x, attention_mask=mask).logits
        ours.config.sliding_window = WINDOW
    real = mask.bool()
    assert (got - want)[real].abs().max() <= 1e-5
    assert (no_window - full)[real].abs().max() > 1e-3
    ours.save(tmp_path / "back")
    again, info = MistralForCausalLM.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert again.config.sliding_window == WINDOW
    with torch.no_grad():
        assert (again.eval()(x, attention_mask=mask).logits - want)[real].abs().max() <= 1e-5


def test_rolling_cache_64_steps_equals_uncached_and_holds_at_most_window(pair):
    _, ours, _ = pair
    x = ids()
    cache = KVCache.for_model(ours)
    assert cache.windows == [WINDOW, WINDOW]
    held = []
    with torch.no_grad():
        full = ours(x).logits
        steps = [ours(x[:, :8], past_key_values=cache, use_cache=True).logits]
        for t in range(8, 72):  # 64 one-token steps, the last 56 past the window
            steps.append(ours(x[:, t:t + 1], past_key_values=cache, use_cache=True).logits)
            held.append(max(k.size(2) for k in cache.keys))
            one = cache.keys[0]  # storage too: no view keeping a longer tensor alive
            assert one.untyped_storage().nbytes() <= WINDOW * one[:, :, :1].numel() * one.element_size()
    assert (torch.cat(steps, 1) - full).abs().max() <= 1e-5
    assert max(held) == WINDOW - 1 and cache.get_seq_length() == 72 and cache.key_start(0) == 72 - (WINDOW - 1)


def test_chunked_prefill_after_the_window_rolled(pair):
    _, ours, _ = pair
    x = ids(length=60)
    cache = KVCache.for_model(ours)
    with torch.no_grad():
        full = ours(x).logits
        parts = [ours(x[:, a:b], past_key_values=cache, use_cache=True).logits
                 for a, b in ((0, 25), (25, 31), (31, 60))]  # chunks longer than the kept window
    assert (torch.cat(parts, 1) - full).abs().max() <= 1e-5


def test_generate_64_tokens_equals_transformers_and_uncached(pair):
    hf, ours, _ = pair
    prompt = ids(length=8, seed=2)
    got = generate(ours, prompt, max_new_tokens=64, eos_token_id=[])
    want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=64, do_sample=False)
    assert torch.equal(got, want)
    seq = prompt  # uncached: the whole sequence through the model for every token
    with torch.no_grad():
        for _ in range(64):
            seq = torch.cat([seq, ours(seq).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(got, seq)


def test_paged_engine_rolls_and_matches_generate(pair):
    _, ours, _ = pair
    prompts = [ids(1, n, seed=n)[0].tolist() for n in (3, 20, 9)]
    want = [generate(ours, torch.tensor([p]), max_new_tokens=64, eos_token_id=[])[0, len(p):].tolist()
            for p in prompts]
    engine = Engine(ours, num_blocks=64, block_size=4, max_batch=4)
    assert engine.window == WINDOW
    held = []
    reqs = [engine.add_request(p, SamplingParams(max_new_tokens=64, ignore_eos=True)) for p in prompts]
    while not all(r.finished for r in reqs):
        engine.step()
        held += [len(r.table.blocks) for r in reqs if not r.finished]
    assert [r.output for r in reqs] == want
    # at most ceil((W - 1) / block) + 1 blocks held after a decode step (a prefill holds its prompt once)
    assert max(held[len(prompts):]) <= -(-(WINDOW - 1) // 4) + 1 < -(-(20 + 64) // 4)
    assert engine.pool.num_free == engine.pool.capacity_blocks


def test_trim_gives_back_only_blocks_out_of_the_window():
    pool = BlockPool(num_layers=1, num_blocks=10, block_size=4, kv_heads=1, head_dim=1)
    t = BlockTable()
    pool.ensure(t, 13)
    t.length = 13  # the next query (position 13) sees keys 13 - 6 + 1 = 8 on: blocks 0 and 1 can go
    pool.trim(t, 6)
    assert t.dropped == 2 and len(t.blocks) == 2 and pool.num_free == 7
    assert t.slots(8, 13, 4) == [t.blocks[0] * 4 + j for j in range(4)] + [t.blocks[1] * 4]
    assert pool.ensure(t, 17) and len(t.blocks) == 3  # growing counts the dropped blocks


def test_compiled_decode_with_a_window_equals_eager(pair):
    _, ours, _ = pair
    x = ids(3, 20, seed=4)
    mask = torch.ones_like(x)
    mask[0, :6] = 0  # left padding that falls out of the window while decoding
    x = x.masked_fill(mask == 0, 0)
    want = generate(ours, x, mask, max_new_tokens=40, eos_token_id=[])
    compiled.forget(ours)
    compiled._DECODERS[ours] = compiled.StaticDecoder(ours, backend="eager")  # traced, no codegen: seconds
    try:
        with torch.inference_mode():  # the static cache is a ring of exactly W columns
            session = compiled._DECODERS[ours].session(x, mask, 40)
            session(x)
            session(x[:, -1:])
            assert [k.size(2) for k in session.keys] == [WINDOW, WINDOW]
        got = generate(ours, x, mask, max_new_tokens=40, eos_token_id=[], compile=True)
        engine = Engine(ours, num_blocks=64, block_size=4, max_batch=4, compile={"backend": "eager"})
        paged = engine.generate([row[m.bool()].tolist() for row, m in zip(x, mask)],
                                SamplingParams(max_new_tokens=40, ignore_eos=True))
    finally:
        compiled.forget(ours)
    assert torch.equal(got, want)
    assert paged == [row[20:].tolist() for row in want]


def test_beam_search_over_the_rolling_cache_equals_transformers(pair):
    hf, ours, _ = pair  # beams reorder the kept window each step (KVCache.reorder)
    prompt = ids(2, 6, seed=5)
    kwargs = dict(num_beams=3, max_new_tokens=30)
    want = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, pad_token_id=3, **kwargs)
    assert torch.equal(generate(ours, prompt, eos_token_id=[], pad_token_id=3, **kwargs), want)
