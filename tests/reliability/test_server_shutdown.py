"""Graceful shutdown of a real `python -m attnlab serve` process (a tiny random decoder saved to a temp dir,
an API key from a file): SIGTERM while a streaming completion is mid-generation. The stream runs to its
end ([DONE], every token it asked for), a new request meanwhile gets 503, the port is closed once the
drain is over, the process exits 0 within --drain-seconds, and nothing it printed contains the key. With
a drain shorter than the generation, the stream is cut (no [DONE]) and the process still exits 0 on time."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from test_serve import smol_tok  # noqa: F401 - fixture

import attnlab
from attnlab.config import ModelConfig

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-attnlab-Drain-5b1e77"
LONG = 1000  # tokens: seconds of decoding even on a fast machine, so SIGTERM lands mid-generation


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, smol_tok):  # noqa: F811
    torch.manual_seed(0)
    cfg = ModelConfig(model_type="llama", vocab_size=len(smol_tok), hidden_size=32, num_layers=2, num_heads=4,
                      num_kv_heads=2, intermediate_size=64, position="rope", norm="rmsnorm", activation="swiglu",
                      bias=False, causal=True, norm_placement="pre", embedding_norm=False, pooler=False,
                      type_vocab_size=0, pad_token_id=None, dropout=0.0, attention_dropout=0.0,
                      max_position_embeddings=1024, eos_token_id=None, tie_word_embeddings=True)
    out = tmp_path_factory.mktemp("drain-model")
    attnlab.save(attnlab.from_config(cfg).eval(), out)
    smol_tok.save(out)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    def __init__(self, model_dir: Path, tmp_path: Path, drain_seconds: float) -> None:
        key_file = tmp_path / "key"
        key_file.write_text(KEY + "\n")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / "serve.log"
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   OMP_NUM_THREADS="1")
        env.pop("ATTNLAB_API_KEY", None)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "attnlab", "serve", str(model_dir), "--port", str(self.port),
                 "--api-key-file", str(key_file), "--drain-seconds", str(drain_seconds), "--max-new-tokens", "1000",
                 "--kv-blocks", "128", "--block-size", "16"], stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 120
        while True:
            assert self.proc.poll() is None, self.output()
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "server did not start:\n" + self.output()
            time.sleep(0.2)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def refused(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=2)
    except httpx.ConnectError:
        return True
    return False


def test_sigterm_drains_a_stream_in_flight_then_exits_0(model_dir, tmp_path):
    drain = 60.0
    server = ServeProcess(model_dir, tmp_path, drain)
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        with httpx.Client(base_url=server.url, timeout=60, headers=auth) as client, \
                client.stream("POST", "/v1/completions",
                              json={"prompt": "Once upon a time", "max_tokens": LONG, "stream": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert first != "data: [DONE]"
            server.proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            time.sleep(0.2)  # the signal is handled between two bytecodes of the server's main thread
            probe = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers=auth,
                               timeout=10)
            health = httpx.get(server.url + "/health", timeout=10)
            events = [first] + [line for line in lines if line.startswith("data: ")]
        finished = time.monotonic()
        assert probe.status_code == 503 and probe.json()["error"]["code"] == 503, probe.text
        assert probe.headers["connection"] == "close" and health.status_code == 503
        assert events[-1] == "data: [DONE]"
        final = json.loads(events[-2][6:])
        assert final["choices"][0]["finish_reason"] == "length" and final["usage"]["completion_tokens"] == LONG
        print(f"\nthe stream ran {finished - sent:.1f} s after SIGTERM")
        assert finished - sent > 0.2, "the stream ended before the drain was tested: make LONG larger"
        assert server.proc.wait(drain) == 0, server.output()
        print(f"exit {time.monotonic() - sent:.1f} s after SIGTERM")
        assert time.monotonic() - sent < drain
        assert refused(server.url)
        out = server.output()
        assert '"POST /v1/completions HTTP/1.1" 503' in out and KEY not in out, out
    finally:
        server.kill()


def test_a_drain_shorter_than_the_work_still_exits_0_on_time(model_dir, tmp_path):
    drain = 0.25
    server = ServeProcess(model_dir, tmp_path, drain)
    try:
        with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as client, \
                client.stream("POST", "/v1/completions",
                              json={"prompt": "Once upon a time", "max_tokens": LONG, "stream": True}) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            server.proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            with pytest.raises(httpx.HTTPError):  # the stream is cut when the drain time is up
                for line in lines:
                    assert line != "data: [DONE]", "the generation finished within the drain: make LONG larger"
        assert server.proc.wait(drain + 5) == 0, server.output()
        print(f"\nexit {time.monotonic() - sent:.1f} s after SIGTERM with --drain-seconds {drain}")
        assert time.monotonic() - sent < drain + 5
        assert refused(server.url)
    finally:
        server.kill()
