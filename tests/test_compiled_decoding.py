"""Compiled decoding (static KV cache + one compiled step) gives what eager decoding gives."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.inference import aot, compiled
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


@pytest.fixture(scope="module")
def package_dir(tmp_path_factory):
    """One AOTInductor package of tiny("llama")'s step for batch 3 (freezing on, no autotuning: ~10 s)."""
    where = tmp_path_factory.mktemp("compiled")
    model = tiny("llama")
    before = dict(aot.counts)
    decoder = compiled.StaticDecoder(model, autotune=False, cache_dir=where)
    ids, mask = left_padded()
    with torch.inference_mode():
        session = decoder.session(ids, mask, 2)
        session(session(ids).argmax(-1, keepdim=True))
    assert aot.counts["built"] == before["built"] + 1
    assert len(list(where.glob("step-*.pt2"))) == 1 and not list(where.glob("*.tmp*"))
    return where


def test_inductor_compiled_step_matches_eager_logits(package_dir):
    model = tiny("llama")
    compiled.forget(model)
    decoder = compiled.StaticDecoder(model, autotune=False, cache_dir=package_dir)
    ids, mask = left_padded()
    before = dict(aot.counts)
    with torch.inference_mode():
        fast = decoder.session(ids, mask, 6)
        from attnlab.inference.generate import _EagerSteps
        slow = _EagerSteps(model, mask, ids.size(1) + 6)
        a, b = fast(ids), slow(ids)
        for _ in range(5):
            assert (a - b).abs().max() < 1e-4
            token = a.argmax(-1, keepdim=True)
            a, b = fast(token), slow(token)
    assert aot.counts["built"] == before["built"]  # loaded from the fixture's package


_SECOND_PROCESS = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from test_generate import tiny
from test_compiled_decoding import left_padded
from attnlab.inference import aot, compiled
from attnlab.inference.generate import generate
model = tiny("llama")
compiled._DECODERS[model] = compiled.StaticDecoder(model, autotune=False, cache_dir={cache!r})
ids, mask = left_padded()
got = generate(model, ids, mask, max_new_tokens={n}, eos_token_id=[], compile=True)
print(json.dumps({{"counts": aot.counts, "ids": got.tolist()}}))
"""


def test_a_second_process_loads_the_compiled_step_instead_of_compiling(package_dir):
    # the package is keyed on the weights' bytes: tiny() seeds its init, so the child builds the same model
    model = tiny("llama")
    ids, mask = left_padded()
    want = generate(model, ids, mask, max_new_tokens=20, eos_token_id=[])
    script = _SECOND_PROCESS.format(tests=str(Path(__file__).parent), cache=str(package_dir), n=20)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(done.stdout.strip().splitlines()[-1])
    assert run["counts"] == {"built": 0, "loaded": 1}  # the new process compiled nothing
    assert run["ids"] == want.tolist()
    # any number of key/value columns runs through the same package (a dynamic dimension)
    decoder = compiled.StaticDecoder(model, autotune=False, cache_dir=package_dir)
    before = dict(aot.counts)
    torch.manual_seed(3)
    filled = [torch.randn(3, 2, 5, 8) for _ in range(4)]  # 5 columns written, (B, Hkv, T, d) per layer
    token, position, col = ids[:, -1:], torch.full((3, 1), 5), torch.tensor([5])
    logits = []
    with torch.inference_mode():
        for columns in (64, 24):
            caches = [torch.nn.functional.pad(f, (0, 0, 0, columns - 5)) for f in filled]
            allowed = torch.zeros(3, 1, 1, columns, dtype=torch.bool)
            allowed[..., :6] = True
            eager = compiled._step(model, token, position, allowed, col, [c.clone() for c in caches[:2]],
                                   [c.clone() for c in caches[2:]])
            logits.append(decoder.step(model, token, position, allowed, col, caches[:2], caches[2:]))
            assert (logits[-1] - eager).abs().max() < 1e-4
    assert (logits[0] - logits[1]).abs().max() < 1e-5
    assert aot.counts["built"] == before["built"] and aot.counts["loaded"] == before["loaded"] + 1


def test_a_damaged_package_is_compiled_again(package_dir, tmp_path):
    (package,) = package_dir.glob("step-*.pt2")
    (tmp_path / package.name).write_bytes(package.read_bytes()[:4096])  # cut short, as by a full disk
    model = tiny("llama")
    decoder = compiled.StaticDecoder(model, autotune=False, cache_dir=tmp_path)
    ids, mask = left_padded()
    before = dict(aot.counts)
    got = decoder_generate(decoder, model, ids, mask)
    assert aot.counts["built"] == before["built"] + 1 and decoder.persist  # rebuilt, still packaged
    assert (tmp_path / package.name).stat().st_size > 100 * 4096  # a whole package again
    assert torch.equal(got, generate(model, ids, mask, max_new_tokens=4, eos_token_id=[]))


def decoder_generate(decoder, model, ids, mask):
    compiled._DECODERS[model] = decoder
    try:
        return generate(model, ids, mask, max_new_tokens=4, eos_token_id=[], compile=True)
    finally:
        compiled.forget(model)


def test_the_cache_drops_the_least_recently_used_packages_past_its_size(tmp_path):
    import os
    for i, name in enumerate(["step-a.pt2", "step-b.pt2", "step-c.pt2", "step-new.pt2"]):
        (tmp_path / name).write_bytes(b"x" * 100)
        os.utime(tmp_path / name, (1000 + i, 1000 + i))  # a is the least recently used
    os.utime(tmp_path / "step-a.pt2", (2000, 2000))  # ... until it was loaded again: now b is
    (tmp_path / "other.txt").write_bytes(b"y" * 1000)  # not a package: never counted, never deleted
    gone = aot.evict(tmp_path, keep=tmp_path / "step-new.pt2", max_bytes=250)
    assert [p.name for p in gone] == ["step-b.pt2", "step-c.pt2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt", "step-a.pt2", "step-new.pt2"]
    assert aot.evict(tmp_path, keep=tmp_path / "step-new.pt2", max_bytes=50) == [tmp_path / "step-a.pt2"]
    assert (tmp_path / "step-new.pt2").exists()  # the one just written stays, even alone over the limit


def test_the_package_key_follows_the_weights_and_the_batch():
    model = tiny("llama")
    key = aot.package_key(model, 1, {})
    assert aot.package_key(model, 1, {}) == key and aot.package_key(model, 2, {}) != key
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1e-3  # fine-tuned weights must not load the old package
    assert aot.package_key(model, 1, {}) != key


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
