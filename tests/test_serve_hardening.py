"""The server against a hostile client (loopback, tiny random decoder, SmolLM2's tokenizer): stop strings are
bounded by the schema and matched in time linear in the text generated (the streamed text never shows a
prefix of a stop string that later completes, exactly as before); detokenizing a token costs the same at
the 500th token as at the first; /viz renders outside the engine's forward lock and refuses a page over its
cap; /health tells an unauthenticated caller only whether the server is up; a body over the cap is a 413
however it is sent; a non-streaming client that leaves stops its decoding; Host headers other than
loopback's (DNS rebinding) are refused unless allowed."""
from __future__ import annotations

import random
import socket
import time

import httpx
import pytest
from starlette.testclient import TestClient
from test_serve import Server, _wait_pool_full, decoder, smol_tok  # noqa: F401 - fixtures too

from attnlab.inference.generate import TextStreamer
from attnlab.serve import Limits, create_app
from attnlab.serve.schemas import MAX_STOP_CHARS, MAX_STOPS
from attnlab.serve.workers import TokenStream

KEY = "sk-attnlab-Hardening-42"
LIMITS = Limits(max_input_tokens=64, max_new_tokens=64, max_queued=64, request_timeout=30, max_body_bytes=4096,
                num_blocks=64, block_size=8)


@pytest.fixture(scope="module")
def served(decoder, smol_tok):  # noqa: F811
    app = create_app(decoder, smol_tok, name="/models/private/tiny", limits=LIMITS)
    s = Server(app)
    yield s, app
    s.close()


# ---------------------------------------------------------------------------------------- stop strings
class OldStream:
    """The observable behaviour streams had (full re-decode, every stop prefix re-checked): the oracle."""

    def __init__(self, tokenizer, stops, skip) -> None:
        self.streamer, self.stops, self.skip = TextStreamer(tokenizer), stops, skip
        self.pending, self.stopped = "", False

    def push(self, token):
        if self.stopped:
            return ""
        if token is None:
            piece, self.pending = self.pending + self.streamer.flush(), ""
            return piece
        if token in self.skip:
            return ""
        self.pending += self.streamer.push(token)
        if not self.stops:
            piece, self.pending = self.pending, ""
            return piece
        hits = [self.pending.find(s) for s in self.stops if s in self.pending]
        if hits:
            piece, self.pending, self.stopped = self.pending[:min(hits)], "", True
            return piece
        keep = max((k for s in self.stops for k in range(1, len(s)) if self.pending.endswith(s[:k])), default=0)
        piece, self.pending = (self.pending[:-keep], self.pending[-keep:]) if keep else (self.pending, "")
        return piece


def test_stream_pieces_equal_the_old_behaviour_on_random_text_and_stops(smol_tok):  # noqa: F811
    rng = random.Random(7)
    alphabet = "ab a\nb€😀é"
    for trial in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60)))
        ids = smol_tok.encode(text, add_special_tokens=False)
        stops = []
        for _ in range(rng.randint(0, MAX_STOPS)):  # stops cut from the text itself (they hit) or random
            if rng.random() < 0.6 and len(text) > 1:
                i = rng.randrange(len(text) - 1)
                stops.append(text[i:i + rng.randint(1, 12)])
            else:
                stops.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5))))
        skip = {ids[rng.randrange(len(ids))]} if rng.random() < 0.2 else set()
        old, new = OldStream(smol_tok, stops, skip), TokenStream(smol_tok, None, stops, skip)
        for t in ids + [None]:
            assert new.push(t) == old.push(t), (trial, text, stops, t)
        assert new.stopped == old.stopped


def test_stop_matching_is_linear_in_the_text(smol_tok):  # noqa: F811
    # what the schema now refuses, at the stream's own level: a 200,000-character stop string that the text
    # keeps nearly completing. Quadratic prefix checks take seconds per token here; linear ones, milliseconds.
    stop = "a" * 200_000 + "b"
    ids = smol_tok.encode("a" * 300, add_special_tokens=False)
    stream = TokenStream(smol_tok, None, [stop], set())
    started = time.perf_counter()
    shown = "".join(stream.push(t) for t in ids)
    assert time.perf_counter() - started < 3.0
    assert shown == "" and not stream.stopped  # all of it could still be the start of the stop string
    assert stream.push(None) == "a" * 300


def test_detokenizing_costs_the_same_at_every_token(smol_tok):  # noqa: F811
    """The text of token n is found by decoding a few tokens around it, never the whole output again."""
    decoded = []

    class Counting:
        def decode(self, ids, **kw):
            decoded.append(len(ids))
            return smol_tok.decode(ids, **kw)
    text = "The quick brown fox jumps over the lazy dog. Ünïcödé and emoji 😀🎉 too.\n" * 8
    ids = smol_tok.encode(text, add_special_tokens=False)
    stream = TokenStream(Counting(), None, [], set())
    shown = "".join(stream.push(t) for t in ids) + stream.push(None)
    assert shown == smol_tok.decode(ids)
    assert len(ids) > 150 and max(decoded) <= 16, max(decoded)


def test_stop_lists_are_bounded_by_the_schema(served):
    s, _ = served
    with httpx.Client(base_url=s.url, timeout=60) as c:
        r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stop": ["a" * (MAX_STOP_CHARS + 1)]})
        assert r.status_code == 422 and r.json()["error"]["param"] == "stop", r.text
        assert f"at most {MAX_STOP_CHARS} characters" in r.json()["error"]["message"]
        r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stop": "b" * 3000})
        assert r.status_code == 422 and r.json()["error"]["param"] == "stop"
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                 "stop": [str(i) for i in range(MAX_STOPS + 1)]})
        assert r.status_code == 422 and f"at most {MAX_STOPS} stop strings" in r.json()["error"]["message"]
        at_limit = ["x" * (MAX_STOP_CHARS - i) + "\u00e9" * i for i in range(MAX_STOPS)]
        r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, "temperature": 0, "stop": at_limit})
        assert r.status_code == 200, r.text


# ---------------------------------------------------------------------------------------- /viz
def test_viz_renders_outside_the_forward_lock(served, monkeypatch):
    from attnlab.viz.attention import AttentionData
    s, app = served
    lock = app.state.engine.forward_lock
    seen = []
    original = AttentionData.to_json

    def spy(self, *a, **kw):
        seen.append(lock.locked())
        return original(self, *a, **kw)
    monkeypatch.setattr(AttentionData, "to_json", spy)
    r = httpx.get(s.url + "/viz", params={"text": "the cat sat on the mat"}, timeout=60)
    assert r.status_code == 200 and r.text.startswith("<!DOCTYPE html>")
    assert seen and not any(seen)  # the page's JSON was built with the engine free to decode


def test_viz_page_equals_the_library_page(decoder, smol_tok):  # noqa: F811
    from attnlab.serve.viz import render
    from attnlab.viz.attention import extract_text
    from attnlab.viz.page import render_page
    data = extract_text(decoder, smol_tok, "a b <c> </script>", neuron=True, neuron_fallback=1, title="t")
    for view, layer, head in (("head", 0, None), ("model", 1, 3), ("neuron", 1, None)):
        assert render(data, view=view, layer=layer, head=head) == render_page(data, view=view, layer=layer, head=head)


def test_viz_over_its_cap_is_refused_naming_it(decoder, smol_tok):  # noqa: F811
    # 2 layers x 4 heads x T^2: 30 tokens hold 7,200 weights
    app = create_app(decoder, smol_tok, limits=Limits(max_viz_weights=5000, num_blocks=16, block_size=8))
    s = Server(app)
    try:
        r = httpx.get(s.url + "/viz", params={"text": "word " * 30}, timeout=60)
        assert r.status_code == 413, r.text
        message = r.json()["error"]["message"]
        assert "5000" in message and "2 layers x 4 heads" in message and "at most 25 tokens" in message
        assert httpx.get(s.url + "/viz", params={"text": "word " * 20}, timeout=60).status_code == 200
    finally:
        s.close()


# ---------------------------------------------------------------------------------------- /health
def test_health_says_only_ok_without_the_key(decoder, smol_tok):  # noqa: F811
    with TestClient(create_app(decoder, smol_tok, name="/models/private/tiny", limits=LIMITS,
                               allowed_hosts=["testserver"])) as c:
        r = c.get("/health")
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        server = c.get("/metrics").json()["server"]  # an open server's details: with everything else it serves
        assert server["model"] == "/models/private/tiny" and "failures" in server
    with TestClient(create_app(decoder, smol_tok, name="/models/private/tiny", limits=LIMITS, api_key=KEY,
                               allowed_hosts=["testserver"])) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = c.get("/health", headers=headers)
            assert r.status_code == 200 and r.json() == {"status": "ok"}
        detail = c.get("/health", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert detail["status"] == "ok" and detail["model"] == "/models/private/tiny"
        assert detail["failures"]["last_error"] is None and detail["kind"] == "decoder"


# ---------------------------------------------------------------------------------------- bodies
def test_a_chunked_body_over_the_limit_is_413(served):
    s, _ = served

    def chunks():
        for _ in range(10):
            yield b" " * 1000  # 10,000 bytes, no Content-Length: chunked transfer encoding
    r = httpx.post(s.url + "/v1/completions", content=chunks(), headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["type"] == "request_too_large" and "4096" in r.json()["error"]["message"]

    def small():
        yield b'{"prompt": "Hello", '
        yield b'"max_tokens": 2}'
    r = httpx.post(s.url + "/v1/completions", content=small(), headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------------------------------- clients that leave
def test_a_non_streaming_client_that_leaves_stops_its_decoding(served, decoder):  # noqa: F811
    s, app = served
    engine = app.state.engine
    before = dict(engine.stats)
    slow = decoder.register_forward_pre_hook(lambda *a: time.sleep(0.05))  # 64 tokens: over 3 s
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(s.url + "/v1/completions", json={"prompt": "A long story:", "max_tokens": 64, "temperature": 0},
                       timeout=0.6)
        started = time.time()
        m = _wait_pool_full(s.url, seconds=10)
    finally:
        slow.remove()
    assert m["kv_blocks_free"] == m["kv_blocks_total"] and m["running"] == 0
    assert m["engine"]["cancelled"] - before["cancelled"] == 1
    assert m["engine"]["generated_tokens"] - before["generated_tokens"] < 40
    assert time.time() - started < 3
    assert m["requests"]["/v1/completions"].get("499", 0) >= 1


# ---------------------------------------------------------------------------------------- Host header
def _raw_get(url: str, host: str | None) -> int:
    """GET /health with exactly this Host header (or none): the status code."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        head = "GET /health HTTP/1.0\r\n" + (f"Host: {host}\r\n" if host is not None else "") + "\r\n"
        sock.sendall(head.encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


def test_host_headers_other_than_loopback_are_refused(served):
    s, _ = served
    port = s.url.rsplit(":", 1)[1]
    for host in ("127.0.0.1", f"127.0.0.1:{port}", "localhost", f"LOCALHOST:{port}", "[::1]", f"[::1]:{port}"):
        assert _raw_get(s.url, host) == 200, host
    for host in ("attacker.example", f"attacker.example:{port}", "localhost.attacker.example", "127.0.0.1.nip.io",
                 "testserver", "", None):
        assert _raw_get(s.url, host) == 400, host
    r = httpx.get(s.url + "/health", headers={"Host": "rebind.example"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("Host not allowed")


def test_allowed_hosts_extend_the_loopback_default(decoder, smol_tok):  # noqa: F811
    app = create_app(decoder, smol_tok, limits=LIMITS, start_engine=False)
    with TestClient(app) as c:  # TestClient sends Host: testserver
        assert c.get("/health").status_code == 400
        assert c.get("/health", headers={"Host": "localhost:8000"}).status_code == 200
    app = create_app(decoder, smol_tok, limits=LIMITS, start_engine=False, allowed_hosts=["testserver", "Api.Example"])
    with TestClient(app) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/health", headers={"Host": "api.example:443"}).status_code == 200
        assert c.get("/health", headers={"Host": "127.0.0.1"}).status_code == 200
        assert c.get("/health", headers={"Host": "other.example"}).status_code == 400
    app = create_app(decoder, smol_tok, limits=LIMITS, start_engine=False, allowed_hosts=["*"])
    with TestClient(app) as c:
        assert c.get("/health", headers={"Host": "anything.example"}).status_code == 200


def test_cli_allowed_hosts_option(monkeypatch, tmp_path, decoder, smol_tok):  # noqa: F811
    import argparse

    import torch

    import attnlab
    import attnlab.serve.drain as drain
    from attnlab.cli import serve
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert parser.parse_args(["m"]).allowed_hosts is None
    attnlab.save(decoder, tmp_path)
    smol_tok.save(tmp_path)
    seen = []

    def run_server(app, **kw):
        seen.append(app)
        app.state.worker.stop()
    monkeypatch.setattr(drain, "run_server", run_server)
    try:
        assert serve.run(parser.parse_args([str(tmp_path), "--allowed-hosts", "api.example, b.example"])) == 0
    finally:
        torch.set_grad_enabled(True)  # `serve` turns autograd off process-wide
    with TestClient(seen[-1]) as c:
        for host, status in (("api.example", 200), ("b.example:80", 200), ("localhost", 200), ("testserver", 400)):
            assert c.get("/health", headers={"Host": host}).status_code == status, host
