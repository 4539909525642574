"""Access and transport on a real uvicorn server (loopback): the API key guards every endpoint but GET /health,
a refusal is an OpenAI-shaped 401 that never shows a key, the access log and /metrics never contain one;
the key comes from the option, a file or ATTNLAB_API_KEY; binding a non-loopback address without a key warns
once; HTTPS with a self-signed certificate made here; a certificate that cannot be loaded is one line
before the model loads."""
from __future__ import annotations

import logging
import shutil
import subprocess

import httpx
import pytest
import torch
from test_serve import Server, decoder, reference, smol_tok  # noqa: F401 - fixtures too

from attnlab.cli import main
from attnlab.serve import Limits, create_app
from attnlab.serve.auth import ENV_VAR, is_loopback, resolve_api_key

KEY = "sk-attnlab-Secret-7f3a9c"
WRONG = "sk-attnlab-Wrong-000000"
LIMITS = Limits(max_input_tokens=32, max_new_tokens=8, max_queued=16, request_timeout=30, num_blocks=32,
                block_size=8, max_texts=4)


class LogCatcher(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record) -> None:
        self.lines.append(self.format(record))


@pytest.fixture(scope="module")
def guarded(decoder, smol_tok):  # noqa: F811
    """A decoder server with an API key and uvicorn's access log on, every log line of it caught."""
    app = create_app(decoder, smol_tok, name="tiny", limits=LIMITS, api_key=KEY)
    s = Server(app)
    catcher = LogCatcher()
    loggers = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.access", "uvicorn.error", "attnlab")]
    saved = [(lg, lg.level) for lg in loggers]
    for lg in loggers:  # Server() logs at warning level; access lines are info
        lg.addHandler(catcher)
        lg.setLevel(logging.DEBUG)
    yield s, catcher
    for lg, level in saved:
        lg.removeHandler(catcher)
        lg.setLevel(level)
    s.close()


def test_every_endpoint_but_health_needs_the_key(guarded):
    s, catcher = guarded
    auth = {"Authorization": f"Bearer {KEY}"}
    calls = [("GET", "/metrics", None), ("GET", "/viz?text=hi", None), ("GET", "/openapi.json", None),
             ("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2}),
             ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
             ("POST", "/v1/embeddings", {"input": "Hello"}), ("POST", "/v1/classify", {"input": "Hello"}),
             ("GET", "/no/such/path", None)]
    with httpx.Client(base_url=s.url, timeout=30) as c:
        assert c.get("/health").status_code == 200  # probes need no credentials
        for method, path, body in calls:
            for headers, why in [({}, "missing"), ({"Authorization": f"Bearer {WRONG}"}, "invalid"),
                                 ({"Authorization": KEY}, "invalid"),  # no Bearer scheme
                                 ({"Authorization": f"Bearer {KEY}x"}, "invalid"),
                                 ({"Authorization": f"Bearer {KEY[:-1]}"}, "invalid")]:
                r = c.request(method, path, json=body, headers=headers)
                assert r.status_code == 401, (method, path, headers, r.text)
                err = r.json()["error"]
                assert err["type"] == "authentication_error" and err["code"] == 401 and why in err["message"]
                assert KEY not in r.text and WRONG not in r.text and "Secret" not in r.text
                assert r.headers["www-authenticate"].startswith("Bearer")
            r = c.request(method, path, json=body, headers=auth)
            assert r.status_code != 401, (method, path, r.text)
        assert c.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, headers=auth).status_code == 200
        metrics = c.get("/metrics", headers=auth)
    assert metrics.json()["requests"]["/v1/completions"]["401"] == 5
    assert metrics.json()["requests"]["other"]["401"] == 5  # unknown paths are one bucket
    assert KEY not in metrics.text and WRONG not in metrics.text
    logged = "\n".join(catcher.lines)
    assert '"POST /v1/completions HTTP/1.1" 401' in logged and '"POST /v1/completions HTTP/1.1" 200' in logged
    assert KEY not in logged and WRONG not in logged and "Secret" not in logged


def test_the_key_and_the_answer_match_generating_alone(guarded, decoder, smol_tok):  # noqa: F811
    s, _ = guarded
    r = httpx.post(s.url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=30,
                   json={"prompt": "Once upon", "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == reference(decoder, smol_tok, "Once upon", 6)


def test_key_from_option_file_or_environment(tmp_path):
    f = tmp_path / "key"
    f.write_text(KEY + "\n")
    assert resolve_api_key(KEY, None, {}) == KEY
    assert resolve_api_key(None, f, {}) == KEY
    assert resolve_api_key(None, None, {ENV_VAR: f"  {KEY}\n"}) == KEY
    assert resolve_api_key(None, None, {}) is None
    assert resolve_api_key(KEY, None, {ENV_VAR: WRONG}) == KEY  # an explicit option wins over the environment
    with pytest.raises(ValueError, match="both given"):
        resolve_api_key(KEY, f, {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match=r"--api-key-file .*empty: the API key is empty"):
        resolve_api_key(None, tmp_path / "empty", {})
    with pytest.raises(ValueError, match="printable ASCII without spaces"):
        resolve_api_key("two words", None, {})
    with pytest.raises(ValueError, match=f"{ENV_VAR}: the API key is empty"):
        resolve_api_key(None, None, {ENV_VAR: " "})


def test_loopback_addresses():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.3.4.5", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.10", "example.org"))


def _serve_cli(argv, monkeypatch, capsys):
    """Run `attnlab serve` in-process up to the point where it would start uvicorn; returns (exit code, stderr,
    run_server's keyword arguments + the app's middleware)."""
    import attnlab.serve.drain as drain
    seen = {}

    def run_server(app, **kw):
        seen.update(kw, middleware=app.user_middleware)
        app.state.worker.stop()  # create_app started it; no thread is left behind
    monkeypatch.setattr(drain, "run_server", run_server)
    grad = torch.is_grad_enabled()
    try:
        code = main(argv)
    finally:
        torch.set_grad_enabled(grad)  # `serve` turns autograd off for the process; later tests train
    return code, capsys.readouterr().err, seen


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, decoder, smol_tok):  # noqa: F811
    import attnlab
    out = tmp_path_factory.mktemp("tiny-model")
    attnlab.save(decoder, out)
    smol_tok.save(out)
    return out


def test_cli_warns_once_on_an_open_public_address(saved_model, monkeypatch, capsys):
    monkeypatch.delenv(ENV_VAR, raising=False)
    code, err, seen = _serve_cli(["serve", str(saved_model), "--host", "0.0.0.0", "--port", "1"], monkeypatch, capsys)
    assert code == 0 and seen["host"] == "0.0.0.0"
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "no API key" in warnings[0] and ENV_VAR in warnings[0], err
    for argv in (["--host", "127.0.0.1"], ["--host", "0.0.0.0", "--api-key", KEY]):
        code, err, _ = _serve_cli(["serve", str(saved_model), "--port", "1", *argv], monkeypatch, capsys)
        assert code == 0 and "warning" not in err, err
    monkeypatch.setenv(ENV_VAR, KEY)
    code, err, seen = _serve_cli(["serve", str(saved_model), "--host", "0.0.0.0", "--port", "1"], monkeypatch, capsys)
    assert code == 0 and "warning" not in err and any(m.cls.__name__ == "ApiKeyAuth" for m in seen["middleware"])


def _openssl_cert(tmp_path):
    """A self-signed certificate for 127.0.0.1, made with the openssl binary (the venv has no `cryptography`)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl binary to make a self-signed test certificate with")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


class TlsServer(Server):
    """The server `attnlab serve --ssl-certfile C --ssl-keyfile K` runs (serve.drain.make_server), in a thread."""

    def __init__(self, app, cert, key) -> None:
        import socket
        import threading
        import time

        from attnlab.serve.drain import make_server
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = make_server(app, host="127.0.0.1", port=0, ssl_certfile=str(cert), ssl_keyfile=str(key),
                                  log_level="warning")
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)


def test_https_with_a_self_signed_certificate(tmp_path, decoder, smol_tok):  # noqa: F811
    import ssl
    cert, key = _openssl_cert(tmp_path)
    s = TlsServer(create_app(decoder, smol_tok, name="tiny", limits=LIMITS, api_key=KEY), cert, key)
    try:
        trust = ssl.create_default_context(cafile=str(cert))
        auth = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=s.url, verify=trust, timeout=30) as c:
            assert c.get("/health").json()["status"] == "ok"
            r = c.post("/v1/completions", json={"prompt": "Once upon", "max_tokens": 4, "temperature": 0}, headers=auth)
            assert r.status_code == 200
            assert r.json()["choices"][0]["text"] == reference(decoder, smol_tok, "Once upon", 4)
            assert c.post("/v1/completions", json={"prompt": "x"}).status_code == 401
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(s.url + "/health", timeout=10)  # a client that does not trust this certificate refuses it
        with pytest.raises(httpx.HTTPError):  # plain HTTP to the TLS port gets no HTTP answer
            httpx.get(s.url.replace("https", "http") + "/health", timeout=10)
    finally:
        s.close()


def test_unusable_certificate_is_one_line_before_loading(tmp_path, saved_model, monkeypatch, capsys):
    import attnlab
    loads = []
    monkeypatch.setattr(attnlab, "load", lambda *a, **k: loads.append(a))
    cert, key = _openssl_cert(tmp_path)
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    model = str(saved_model)  # never loaded
    for extra, expected in [(["--ssl-certfile", str(tmp_path / "missing.pem"), "--ssl-keyfile", str(key)],
                             "--ssl-certfile"),
                            (["--ssl-certfile", str(cert), "--ssl-keyfile", str(tmp_path / "missing-key.pem")],
                             "--ssl-keyfile"),
                            (["--ssl-certfile", str(tmp_path / "junk.pem"), "--ssl-keyfile", str(key)],
                             "not a PEM certificate"),
                            (["--ssl-certfile", str(cert), "--ssl-keyfile", str(cert)], "not a PEM certificate"),
                            (["--ssl-certfile", str(cert)], "go together")]:
        assert main(["serve", model, *extra]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err and err.startswith("attnlab serve: error:"), err
    assert not loads


def test_the_key_is_compared_in_constant_time(monkeypatch):
    """Every guarded request goes through hmac.compare_digest (time independent of where the bytes differ),
    never `==`, whatever the key sent: a spy sees each comparison and its verdict is the only one used."""
    import asyncio
    import hmac

    from attnlab.serve import auth
    seen, real = [], hmac.compare_digest

    def spy(a, b):
        seen.append((a, b))
        return real(a, b)
    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    passed = []

    async def app(scope, receive, send):
        passed.append(scope["path"])
    sent = []

    async def send(message):
        sent.append(message)
    guard = auth.ApiKeyAuth(app, KEY)
    for value in (f"Bearer {KEY}", f"Bearer {WRONG}", f"Bearer {KEY}x", KEY):
        scope = {"type": "http", "method": "POST", "path": "/v1/completions",
                 "headers": [(b"authorization", value.encode())]}
        asyncio.run(guard(scope, None, send))
    assert [a for a, _ in seen] == [v.encode() for v in (f"Bearer {KEY}", f"Bearer {WRONG}", f"Bearer {KEY}x", KEY)]
    assert all(b == f"Bearer {KEY}".encode() for _, b in seen)
    assert passed == ["/v1/completions"] and [m["status"] for m in sent if "status" in m] == [401, 401, 401]
