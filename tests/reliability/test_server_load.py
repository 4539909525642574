"""Load on a real uvicorn server (loopback, free port) serving a tiny random decoder: 64 concurrent clients
send a mix of embeddings, completions and streaming completions, and some hang up mid-stream. Every
request that was not abandoned gets exactly the answer it gets alone; afterwards the KV block pool is
full again and the queues are empty; memory stays flat (RSS after 1,000 requests within 10% of RSS
after the first 100). `make soak` runs the same with many more requests (marker `soak`)."""
from __future__ import annotations

import asyncio
import json
import os
import time

import httpx
import numpy as np
import psutil
import pytest
from test_serve import Server, _wait_pool_full, decoder, reference, smol_tok  # noqa: F401 - fixtures too

from attnlab.inference.embed import embed
from attnlab.serve import Limits, create_app

CLIENTS = 64
PROMPTS = [f"Client story {i}:" + " once" * (i % 5) for i in range(12)]
LENGTHS = (3, 6, 10)


@pytest.fixture(scope="module")
def served(decoder, smol_tok):  # noqa: F811
    app = create_app(decoder, smol_tok, name="tiny", limits=Limits(
        max_input_tokens=64, max_new_tokens=16, max_queued=256, request_timeout=120, max_body_bytes=4096,
        num_blocks=96, block_size=8, max_batch=32))
    s = Server(app)
    yield s, app
    s.close()


@pytest.fixture(scope="module")
def expected(decoder, smol_tok):  # noqa: F811
    """What each request gets when it is alone: generate() one prompt at a time, embed() one text."""
    texts = {(p, n): reference(decoder, smol_tok, p, n) for p in PROMPTS for n in LENGTHS}
    vectors = {p: embed(decoder, smol_tok, [p])[0] for p in PROMPTS}
    return texts, vectors


def plan(i: int) -> tuple[str, str, int]:
    """Request i: (kind, prompt, max_tokens); kinds cycle embed, complete, stream, embed, complete, stream, hang-up, …"""
    kind = ("embed", "complete", "stream", "embed", "complete", "stream", "hangup", "stream")[i % 8]
    return kind, PROMPTS[(i * 7) % len(PROMPTS)], LENGTHS[(i // 8) % len(LENGTHS)]


async def one(client: httpx.AsyncClient, i: int, expected) -> str:
    """Send request i and check its answer; returns its kind."""
    kind, prompt, n = plan(i)
    texts, vectors = expected
    if kind == "embed":
        r = await client.post("/v1/embeddings", json={"input": prompt})
        assert r.status_code == 200, r.text
        got = np.array(r.json()["data"][0]["embedding"], dtype=np.float32)
        assert np.allclose(got, vectors[prompt], atol=1e-5), i
        return kind
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0}
    if kind == "complete":
        r = await client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == texts[prompt, n], i
        return kind
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        pieces, done = [], False
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if kind == "hangup":
                return kind  # leave after the first event: the connection closes with the stream unread
            if line == "data: [DONE]":
                done = True
                break
            pieces.append(json.loads(line[6:])["choices"][0]["text"])
    assert done and "".join(pieces) == texts[prompt, n], i
    return kind


def rss_mb() -> float:
    return psutil.Process(os.getpid()).memory_info().rss / 2 ** 20


def load(url: str, total: int, expected, checkpoints: tuple[int, ...]) -> dict:
    """`total` requests from CLIENTS concurrent clients; RSS (MB) when each checkpoint count is done."""
    done: list[str] = []
    rss: dict[int, float] = {}
    counter = iter(range(total))

    async def client_loop():
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120.0)) as client:
            for i in counter:
                done.append(await one(client, i, expected))
                if len(done) in checkpoints:
                    rss[len(done)] = rss_mb()

    async def go():
        await asyncio.gather(*[client_loop() for _ in range(CLIENTS)])
    started = time.perf_counter()
    asyncio.run(go())
    return {"seconds": time.perf_counter() - started, "rss_mb": rss,
            "kinds": {k: done.count(k) for k in set(done)}, "requests": len(done)}


def check_drained(url: str, total: int) -> dict:
    m = _wait_pool_full(url)
    assert m["kv_blocks_free"] == m["kv_blocks_total"] and m["running"] == 0 and m["queue_depth"] == 0, m
    assert m["engine"]["finished"] == m["engine"]["requests"], m["engine"]
    return m


def test_64_clients_mixed_load_1000_requests(served, expected):
    s, app = served
    total = 1000
    before = app.state.engine.stats["requests"]
    out = load(s.url, total, expected, checkpoints=(100, total))
    assert out["requests"] == total and set(out["kinds"]) == {"embed", "complete", "stream", "hangup"}
    m = check_drained(s.url, total)
    completions = total - out["kinds"]["embed"]
    assert m["engine"]["requests"] - before == completions
    assert m["requests"]["/v1/embeddings"]["200"] >= out["kinds"]["embed"]
    rss = out["rss_mb"]
    print(f"\n{total} requests in {out['seconds']:.1f} s; RSS {rss[100]:.1f} MB after 100, "
          f"{rss[total]:.1f} MB after {total}; cancelled mid-stream: {m['engine']['cancelled']}")
    assert rss[total] <= 1.10 * rss[100], rss


@pytest.mark.soak
@pytest.mark.skipif("ATTNLAB_SOAK_REQUESTS" not in os.environ, reason="opt-in soak: make soak")
def test_soak(served, expected):
    s, _ = served
    total = int(os.environ["ATTNLAB_SOAK_REQUESTS"])
    marks = tuple(sorted({100, 1000, *range(5000, total + 1, 5000), total}))
    out = load(s.url, total, expected, checkpoints=marks)
    m = check_drained(s.url, total)
    rss = out["rss_mb"]
    print(f"\nsoak: {total} requests in {out['seconds']:.1f} s ({total / out['seconds']:.1f} req/s); "
          f"kinds {out['kinds']}; cancelled mid-stream {m['engine']['cancelled']}; RSS MB "
          + ", ".join(f"{k}: {v:.1f}" for k, v in sorted(rss.items())))
    assert rss[total] <= 1.10 * rss[100], rss


def test_the_same_load_with_faults_at_random_steps(served, expected, decoder):  # noqa: F811
    """The load above (64 clients, 1,000 mixed requests, hang-ups) while 3% of forward passes raise at random
    (seeded): no request hangs (each has a bound), a completed one has exactly its own answer, a failed one a
    500 naming the fault (a stream: an error event after a prefix of its own text, then [DONE]); afterwards the
    pool is full, nothing is queued or running, and the engine counted each fault."""
    from test_server_faults import Fault
    s, app = served
    texts, vectors = expected
    before = dict(app.state.engine.stats)
    failed: list[int] = []

    async def one_or_fault(client, i):
        kind, prompt, n = plan(i)
        body = {"prompt": prompt, "max_tokens": n, "temperature": 0}
        if kind == "embed":
            r = await client.post("/v1/embeddings", json={"input": prompt})
            if r.status_code == 500 and "injected fault" in r.text:
                return failed.append(i)
            assert r.status_code == 200 and np.allclose(r.json()["data"][0]["embedding"], vectors[prompt], atol=1e-5), i
        elif kind == "complete":
            r = await client.post("/v1/completions", json=body)
            if r.status_code == 500 and "injected fault" in r.json()["error"]["message"]:
                return failed.append(i)
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == texts[prompt, n], (i, r.text)
        else:
            async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                if r.status_code == 500:
                    return failed.append(i)
                assert r.status_code == 200
                pieces, errors, done = [], [], False
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if kind == "hangup":
                        return
                    if line == "data: [DONE]":
                        done = True
                        break
                    event = json.loads(line[6:])
                    (errors.append(event["error"]) if "error" in event else
                     pieces.append(event["choices"][0]["text"]))
            text = "".join(pieces)
            assert done, i
            if errors:
                assert errors[0]["code"] == 500 and texts[prompt, n].startswith(text.rstrip("\ufffd")), (i, text)
                return failed.append(i)
            assert text == texts[prompt, n], (i, text)

    total, counter = 1000, iter(range(1000))

    async def client_loop():
        async with httpx.AsyncClient(base_url=s.url, timeout=httpx.Timeout(120.0)) as client:
            for i in counter:
                await asyncio.wait_for(one_or_fault(client, i), 120)  # a hang fails here

    fault = Fault(decoder, rate=0.03, seed=99)
    try:
        async def go():
            await asyncio.gather(*[client_loop() for _ in range(CLIENTS)])
        asyncio.run(go())
    finally:
        fault.remove()
    m = check_drained(s.url, total)
    print(f"\n{total} requests, {fault.raised} forward passes raised, {len(failed)} requests failed")
    assert fault.raised >= 2 and 0 < len(failed) < total
    embed_failed = sum(plan(i)[0] == "embed" for i in failed)
    # each fault fails one engine step or one embeddings request, and the engine counted its own
    assert m["engine"]["failed_steps"] - before["failed_steps"] + embed_failed == fault.raised
    assert m["engine"]["failed_requests"] - before["failed_requests"] >= len(failed) - embed_failed
