"""The serving engine's decoding step as one C call (`PagedBlockSteps`, csrc/paged_step.c) on a GGUF model kept
quantized: the same logits as the modules' step (to fp32 rounding) and the same greedy outputs on a mixed
workload (fp32 and fp16 pools), the same bits on 1 and 2 threads, only where it can run (not while a forward hook
is on the model), and bad slots refused before C writes."""
from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab.inference import block_step
from attnlab.inference.engine import Engine, SamplingParams
from attnlab.nn import quantized as q
from attnlab.nn.precision import cpu_flags

pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not q.available(), reason=f"no C compiler: {q.why_unavailable()}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from test_gguf_quantized import write_tiny_quantized
    path = write_tiny_quantized(tmp_path_factory.mktemp("paged-step") / "tiny.gguf")
    return path, attnlab.load(path, quantized=True)


def _workload(n: int = 10):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (int(torch.randint(1, 40, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    params = [SamplingParams(max_new_tokens=int(m), ignore_eos=True) for m in torch.randint(1, 30, (n,), generator=g)]
    return prompts, params


def _prefilled(model, n_rows: int = 5, kv_dtype=None) -> tuple[Engine, list]:
    """An engine whose rows have their prompts cached and one uncached token each (decode rows)."""
    engine = Engine(model, num_blocks=64, block_size=4, max_batch=8, kv_dtype=kv_dtype)
    prompts, _ = _workload(n_rows)
    reqs = [engine.add_request(p, SamplingParams(max_new_tokens=8, ignore_eos=True)) for p in prompts]
    while any(not r.output for r in reqs):
        engine.step()
    for r in reqs:
        engine.pool.ensure(r.table, len(r.tokens))
    return engine, reqs


def test_engine_decodes_through_the_c_step_with_the_modules_outputs(tiny, monkeypatch):
    _, model = tiny
    calls = []
    door = block_step.call_bound
    monkeypatch.setattr(block_step, "call_bound", lambda fn, *v: (calls.append(fn), door(fn, *v)))
    prompts, params = _workload()
    c_side = Engine(model, num_blocks=24, block_size=4, max_batch=4)  # a small pool: rows are preempted too
    assert c_side.block_steps is not None
    outs = c_side.generate(prompts, params)
    assert calls and set(calls) == {"paged_decode_layers"} and c_side.stats["preemptions"] > 0
    modules = Engine(model, num_blocks=24, block_size=4, max_batch=4)
    modules.block_steps = None
    assert modules.generate(prompts, params) == outs
    assert [len(o) for o in outs] == [p.max_new_tokens for p in params]
    if F16C:  # an fp16 pool: the C step writes the keys as torch's cast rounds them
        half = [Engine(model, num_blocks=24, block_size=4, max_batch=4, kv_dtype=torch.float16) for _ in range(2)]
        half[1].block_steps = None
        assert half[0].block_steps is not None and half[0].generate(prompts, params) == half[1].generate(prompts, params)


F16C = "f16c" in cpu_flags()


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_c_step_logits_equal_the_modules_step(tiny, kv_dtype):
    _, model = tiny
    if kv_dtype == torch.float16 and not F16C:
        pytest.skip("an fp16 pool takes the C step where the CPU has F16C; this one has not")
    engine, reqs = _prefilled(model, kv_dtype=kv_dtype)
    tables, last = [r.table for r in reqs], [r.tokens[-1] for r in reqs]
    lengths = [t.length for t in tables]
    modules = engine._forward(reqs)  # writes this step's keys and values, then counts them as cached
    for t, n in zip(tables, lengths):
        t.length = n
    keys = [k.clone() for k in engine.pool.keys]
    with torch.inference_mode():
        c_logits = engine.block_steps(tables, last)  # the same slots written again, by C
    assert c_logits.shape == modules.shape == (len(reqs), model.config.vocab_size)
    assert (c_logits - modules).abs().max().item() <= 1e-4 * max(1.0, modules.abs().max().item())
    tol = 1e-5 if kv_dtype == torch.float32 else 2e-3  # (one fp16 step where the two fp32 values straddle a tie)
    for a, b in zip(keys, engine.pool.keys):
        assert (a.float() - b.float()).abs().max().item() <= tol  # the keys C wrote are the modules' keys
        assert b.dtype == kv_dtype


def test_c_step_gives_the_same_bits_on_one_and_two_threads(tiny):
    _, model = tiny
    engine, reqs = _prefilled(model, 7)
    tables, last = [r.table for r in reqs], [r.tokens[-1] for r in reqs]
    before = torch.get_num_threads()
    try:
        out = {}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with torch.inference_mode():
                out[threads] = engine.block_steps(tables, last)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(out[1], out[2])


def test_c_step_only_where_it_can_run(tiny):
    path, model = tiny
    assert Engine(model, num_blocks=8).block_steps is not None
    assert (Engine(model, num_blocks=8, kv_dtype=torch.float16).block_steps is not None) == F16C
    assert Engine(attnlab.load(path), num_blocks=8).block_steps is None  # dequantized to fp32: no blocks


def test_a_hook_added_after_the_engine_was_built_sees_the_modules_run(tiny, monkeypatch):
    """The C step stands aside at each step while a forward hook is on the model (a module's or a global one):
    the hook sees every decoding step, and the outputs stay the C step's."""
    _, model = tiny
    calls = []
    door = block_step.call_bound
    monkeypatch.setattr(block_step, "call_bound", lambda fn, *v: (calls.append(fn), door(fn, *v)))
    prompts, params = _workload(4)
    expected = Engine(model, num_blocks=64, block_size=4, max_batch=4).generate(prompts, params)
    assert calls
    hooks = (model.backbone.layers[0].register_forward_hook, torch.nn.modules.module.register_module_forward_hook)
    for register in hooks:
        engine = Engine(model, num_blocks=64, block_size=4, max_batch=4)
        assert engine.block_steps is not None  # built before the hook: it is asked again at each step
        seen, calls[:] = [], []
        handle = register(lambda *a: seen.append(1))
        try:
            outs = engine.generate(prompts, params)
        finally:
            handle.remove()
        assert outs == expected and not calls
        assert len(seen) >= max(p.max_new_tokens for p in params)  # each decoding step ran the modules
        assert engine.block_steps.runs_now()


def test_c_step_refuses_a_bad_slot_before_writing(tiny, monkeypatch):
    _, model = tiny
    engine, reqs = _prefilled(model, 2)
    table = reqs[0].table
    keys = [k.clone() for k in engine.pool.keys]
    monkeypatch.setattr(type(table), "slots", lambda self, a, b, bs: [engine.pool.keys[0].size(0)] * (b - a))
    with torch.inference_mode(), pytest.raises(RuntimeError, match="paged_decode_layers failed with status -1"):
        engine.block_steps([r.table for r in reqs], [r.tokens[-1] for r in reqs])
    assert all(torch.equal(a, b) for a, b in zip(keys, engine.pool.keys))
    monkeypatch.undo()
    table.length = model.config.max_position_embeddings  # past the rotary tables: refused in Python
    with pytest.raises(ValueError, match="past the model's 128"):
        engine.block_steps([r.table for r in reqs], [r.tokens[-1] for r in reqs])
