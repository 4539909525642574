"""A decoding step's attention read in place from the paged KV pool (csrc/paged_attention.c): the same numbers
as softmax attention over each row's gathered keys, at every chunk edge and group size; the checked door
refuses slots outside the pool and row ranges that lie (and C refuses them again); the serving engine takes
it for decoding steps and gives the logits of the gather + SDPA path."""
from __future__ import annotations

import ctypes

import pytest
import torch

import attnlab
from attnlab.config import ModelConfig
from attnlab.inference import paged
from attnlab.inference.engine import Engine, SamplingParams
from attnlab.inference.generate import generate
from attnlab.nn import kernel_build, kernels
from attnlab.nn.attention import AttentionMask
from attnlab.nn.cpu_attention import paged_decode_attention

needs_kernel = pytest.mark.skipif(not kernels.active("paged_attention"), reason="no C compiler for the kernels")


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def reference(q, keys, values, slots, offsets, scale):
    """softmax(q k^T * scale) v over each row's gathered slots, query head h on key head h // group."""
    b, hq, _, d = q.shape
    group = hq // keys.size(1)
    out = torch.empty_like(q)
    for i in range(b):
        s = slots[offsets[i]:offsets[i + 1]]
        k = keys[s].transpose(0, 1).repeat_interleave(group, 0).double()
        v = values[s].transpose(0, 1).repeat_interleave(group, 0).double()
        w = torch.softmax(q[i].double() @ k.transpose(1, 2) * scale, -1)
        out[i] = (w @ v).float()
    return out


def case(lengths, hq, hk, d, slots_in_pool=4096, seed=0, block=16):
    """A pool of slots and rows whose slots run in blocks of 16 (as the engine's do), in a shuffled order."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(slots_in_pool, hk, d, generator=g)
    values = torch.randn(slots_in_pool, hk, d, generator=g)
    blocks = torch.randperm(slots_in_pool // block, generator=g)
    rows, used = [], 0
    for n in lengths:
        nb = -(-n // block)
        rows.append((blocks[used:used + nb, None] * block + torch.arange(block)).flatten()[:n])
        used += nb
    slots = torch.cat(rows)
    offsets = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
    q = torch.randn(len(lengths), hq, 1, d, generator=g) * 3  # peaked weights: the running maximum matters
    return q, keys, values, slots, offsets


@needs_kernel
# (128, 8, 256): more query heads than one pass of the AVX2 path holds (one key head of 16 at a time)
@pytest.mark.parametrize("hq,hk,d", [(9, 3, 64), (4, 4, 16), (8, 2, 128), (32, 2, 128), (2, 1, 48), (128, 8, 256)])
def test_equals_softmax_attention_over_the_gathered_slots(hq, hk, d):
    lengths = [1, 63, 64, 65, 129, 7, 300]  # one key, and either side of the kernel's 64-key chunks
    q, keys, values, slots, offsets = case(lengths, hq, hk, d)
    got = paged_decode_attention(q, keys, values, slots, offsets, d ** -0.5)
    want = reference(q, keys, values, slots, offsets, d ** -0.5)
    assert got.shape == (len(lengths), hq, 1, d)
    assert (got - want).abs().max().item() <= 1e-5


@needs_kernel
def test_threads_split_rows_and_heads_without_changing_a_bit(monkeypatch):
    q, keys, values, slots, offsets = case([5, 80, 33, 200, 16], 6, 3, 32)
    torch.set_num_threads(2)
    two = paged_decode_attention(q, keys, values, slots, offsets, 0.2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    one = paged_decode_attention(q, keys, values, slots, offsets, 0.2)
    assert torch.equal(one, two)


@needs_kernel
@pytest.mark.parametrize("change,named", [
    (lambda c: c["slots"].__setitem__(3, 4096), "every slot in [0, S)"),          # one past the pool
    (lambda c: c["slots"].__setitem__(0, -1), "every slot in [0, S)"),
    (lambda c: c.__setitem__("offsets", c["offsets"] + 1), "offsets rise from 0 to N"),
    (lambda c: c["offsets"].__setitem__(2, c["offsets"][1]), "offsets rise from 0 to N"),  # an empty row
    (lambda c: c["offsets"].__setitem__(-1, c["offsets"][-1] - 1), "offsets rise from 0 to N"),
    (lambda c: c.__setitem__("hq", 5), "Hq a multiple of Hk"),
])
def test_the_door_refuses_slots_outside_the_pool_and_rows_that_lie(change, named):
    q, keys, values, slots, offsets = case([3, 40, 17], 4, 2, 16)
    c = {"slots": slots.clone(), "offsets": offsets.clone(), "hq": 4}
    change(c)
    with pytest.raises(kernels.KernelArgumentError, match="paged_decode_attention") as err:
        kernels.call("paged_decode_attention", q, keys, values, keys.size(0), 3, c["hq"], 2, 16, c["slots"],
                     c["offsets"], c["slots"].numel(), 0.25, torch.empty_like(q))
    assert named in str(err.value)


@needs_kernel
def test_c_checks_the_slots_again_as_it_reads():
    """Past the door (a caller of the library itself): a bad slot or row range returns -1, nothing read."""
    q, keys, values, slots, offsets = case([3, 40], 4, 2, 16)
    lib = kernels.library()
    fn = lib.paged_decode_attention
    out = torch.full_like(q, 7.0)

    def run(s, o):
        return fn(q.data_ptr(), keys.data_ptr(), values.data_ptr(), ctypes.c_int64(keys.size(0)), ctypes.c_int64(2),
                  ctypes.c_int64(4), ctypes.c_int64(2), ctypes.c_int64(16), s.data_ptr(), o.data_ptr(),
                  ctypes.c_int64(s.numel()), ctypes.c_float(0.25), out.data_ptr(), ctypes.c_int64(0),
                  ctypes.c_int64(4))

    assert run(slots, offsets) == 0
    bad = slots.clone()
    bad[-1] = keys.size(0) + 10**6
    assert run(bad, offsets) == -1
    assert run(slots, torch.tensor([0, 3, 44])) == -1  # the last row's range runs past N


@needs_kernel
def test_the_portable_c_path_gives_the_same_numbers(tmp_path):
    """The library takes the AVX2 path where the CPU has it; the portable loops (other CPUs) are built here
    without -march and run on the same cases."""
    import subprocess
    cc = kernels.find_compiler()[0]
    src = kernel_build._CSRC / "paged_attention.c"
    so = tmp_path / "portable.so"
    subprocess.run([cc, "-O3", "-shared", "-fPIC", "-pthread", "-o", str(so), str(src),
                    str(kernel_build._CSRC / "thread_pool.c"), "-lm"], check=True)
    fn = ctypes.CDLL(str(so)).paged_decode_attention
    for hq, hk, d in [(9, 3, 64), (2, 1, 48), (8, 2, 128)]:
        q, keys, values, slots, offsets = case([1, 63, 65, 200], hq, hk, d)
        out = torch.empty_like(q)
        i64 = ctypes.c_int64
        assert fn(ctypes.c_void_p(q.data_ptr()), ctypes.c_void_p(keys.data_ptr()), ctypes.c_void_p(values.data_ptr()),
                  i64(keys.size(0)), i64(4), i64(hq), i64(hk), i64(d), ctypes.c_void_p(slots.data_ptr()),
                  ctypes.c_void_p(offsets.data_ptr()), i64(slots.numel()), ctypes.c_float(d ** -0.5),
                  ctypes.c_void_p(out.data_ptr()), i64(0), i64(4 * hk)) == 0
        want = reference(q, keys, values, slots, offsets, d ** -0.5)
        assert (out - want).abs().max().item() <= 1e-5
        assert (out - paged_decode_attention(q, keys, values, slots, offsets, d ** -0.5)).abs().max().item() <= 1e-5
        k16, v16 = keys.half(), values.half()
        assert ctypes.CDLL(str(so)).paged_decode_attention_f16(
            ctypes.c_void_p(q.data_ptr()), ctypes.c_void_p(k16.data_ptr()), ctypes.c_void_p(v16.data_ptr()),
            i64(keys.size(0)), i64(4), i64(hq), i64(hk), i64(d), ctypes.c_void_p(slots.data_ptr()),
            ctypes.c_void_p(offsets.data_ptr()), i64(slots.numel()), ctypes.c_float(d ** -0.5),
            ctypes.c_void_p(out.data_ptr()), i64(0), i64(4 * hk)) == 0
        assert (out - reference(q, k16.float(), v16.float(), slots, offsets, d ** -0.5)).abs().max().item() <= 1e-5


def test_only_a_padding_mask_lets_the_step_read_the_pool_in_place():
    padding = torch.tensor([[0, 1, 1], [1, 1, 1]])
    decoding = lambda m: m.only_padding(decoding=True)[0]  # noqa: E731
    assert decoding(AttentionMask.build(padding, 1, 3, causal=True, query_offset=2))  # a decoding step
    assert decoding(AttentionMask.build(None, 1, 3, causal=True, query_offset=2))
    assert not AttentionMask.build(padding, 1, 3, causal=True, query_offset=2).only_padding()[0]  # (by default)
    assert not decoding(AttentionMask.build(padding, 3, 3, causal=True))            # a prompt: causal matters
    assert not decoding(AttentionMask.build(padding, 1, 3, causal=True, window=2, query_offset=2))
    assert not decoding(AttentionMask(torch.ones(1, 1, 1, 3, dtype=torch.bool)))    # a bare tensor


def _gqa_decoder():
    torch.manual_seed(0)
    cfg = ModelConfig(model_type="llama", vocab_size=300, hidden_size=96, num_layers=2, num_heads=6, num_kv_heads=2,
                      intermediate_size=128, position="rope", norm="rmsnorm", activation="swiglu", bias=False,
                      causal=True, norm_placement="pre", embedding_norm=False, pooler=False, type_vocab_size=0,
                      pad_token_id=None, dropout=0.0, attention_dropout=0.0, max_position_embeddings=256,
                      eos_token_id=5, tie_word_embeddings=False)
    return attnlab.from_config(cfg).eval()  # head_dim 16: the kernel's case


@needs_kernel
def test_the_engine_decodes_through_it_with_the_numbers_of_gather_and_sdpa(monkeypatch):
    model = _gqa_decoder()
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(6, 300, (n,), generator=g).tolist() for n in (3, 30, 11, 70, 1)]
    calls = []
    real = paged.paged_decode_attention
    monkeypatch.setattr(paged, "paged_decode_attention", lambda *a: calls.append(1) or real(*a))
    engine = Engine(model, num_blocks=64, block_size=4, max_batch=8)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=12, ignore_eos=True))
    assert len(calls) >= 11 * 2  # every decoding step, both layers
    for p, o in zip(prompts, outs):
        assert o == generate(model, torch.tensor([p]), max_new_tokens=12, eos_token_id=[])[0, len(p):].tolist()
    # one decoding step's logits, in place against gathered + SDPA, on the same cache
    engine = Engine(model, num_blocks=64, block_size=4, max_batch=8)
    reqs = [engine.add_request(p, SamplingParams(max_new_tokens=4, ignore_eos=True)) for p in prompts]
    engine.step()  # the prompts
    engine.step()  # one decoding step, so the rows have different lengths and a token each
    for r in reqs:  # (what the scheduler does before a step: room for the new token)
        assert engine.pool.ensure(r.table, len(r.tokens))
    keys = [k.clone() for k in engine.pool.keys]
    values = [v.clone() for v in engine.pool.values]
    tables = [(r.table.length, list(r.table.blocks)) for r in reqs]
    fast = engine._forward(reqs)
    for layer, (k, v) in enumerate(zip(keys, values)):
        engine.pool.keys[layer].copy_(k)
        engine.pool.values[layer].copy_(v)
    for r, (length, blocks) in zip(reqs, tables):
        r.table.length, r.table.blocks = length, blocks
    monkeypatch.setattr(paged.PagedBatchCache, "decode_attention", lambda *a: None)
    slow = engine._forward(reqs)
    assert (fast - slow).abs().max().item() <= 1e-5


@needs_kernel
def test_an_fp16_pool_reads_the_rounded_keys_and_values():
    """`paged_decode_attention_f16`: the same softmax attention over the pool's fp16 keys and values (widened
    as they are read), on the library's path and on the portable C build."""
    for hq, hk, d in [(9, 3, 64), (2, 1, 48), (128, 8, 256)]:
        q, keys, values, slots, offsets = case([1, 63, 65, 300], hq, hk, d)
        k16, v16 = keys.half(), values.half()
        want = reference(q, k16.float(), v16.float(), slots, offsets, d ** -0.5)
        got = paged_decode_attention(q, k16, v16, slots, offsets, d ** -0.5)
        assert (got - want).abs().max().item() <= 1e-5
    with pytest.raises(kernels.KernelArgumentError, match="argument keys: expected dtype torch.float16"):
        kernels.call("paged_decode_attention_f16", q, keys, values, keys.size(0), 4, hq, hk, d, slots, offsets,
                     slots.numel(), 0.25, torch.empty_like(q))


@needs_kernel
def test_the_engine_with_an_fp16_pool_stays_near_the_fp32_one():
    """Engine(kv_dtype=torch.float16): half the pool's bytes; its decoding logits stay within fp16 rounding of
    the fp32 pool's, through the in-place kernel and through gather + SDPA for the prompts."""
    model = _gqa_decoder()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(6, 300, (n,), generator=g).tolist() for n in (3, 30, 11, 70)]
    logits = {}
    for dtype in (torch.float32, torch.float16):
        engine = Engine(model, num_blocks=64, block_size=4, max_batch=8, kv_dtype=dtype)
        assert engine.pool.keys[0].dtype == dtype
        reqs = [engine.add_request(p, SamplingParams(max_new_tokens=4, ignore_eos=True)) for p in prompts]
        engine.step()
        engine.step()
        for r in reqs:
            assert engine.pool.ensure(r.table, len(r.tokens))
        logits[dtype] = engine._forward(reqs)
    assert engine.pool.keys[0].element_size() == 2
    diff = (logits[torch.float16] - logits[torch.float32]).abs().max().item()
    assert 0 < diff <= 2e-2 * logits[torch.float32].abs().max().item()
    with pytest.raises(ValueError, match="compiled decode step"):
        Engine(model, num_blocks=8, compile=True, kv_dtype=torch.float16)
