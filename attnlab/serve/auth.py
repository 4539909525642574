"""Access control: one shared API key, sent as `Authorization: Bearer KEY` (what OpenAI clients send, and
what vLLM's and llama.cpp's `--api-key` check).

Every request needs it except `GET /health`, which a load balancer or an orchestrator probes without
credentials, and which then answers only `{"status": "ok"}` (its details, such as the model's path and
the last engine error, need the key: `carries_key`). The key is compared with `hmac.compare_digest`,
whose time does not depend on where the first differing byte is, so timing the answers does not reveal
the key a byte at a time. A refusal is a
401 in the server's usual `{"error": {...}}` shape; neither the key sent nor the real one is ever put in
an answer, a log line or /metrics (uvicorn's access log shows the method and path, never headers).

Without a key the server binds loopback by default, and a web page the user opens could still reach it
by DNS rebinding (its own host name made to resolve to 127.0.0.1: same origin to the browser). Such a
request names the attacker's host in its `Host` header, so `HostAllowlist` answers 400 to any Host but
loopback's (localhost, 127.0.0.1, [::1], any port) and the names given to `--allowed-hosts` (`*`: any).

The key can come from `--api-key`, from a file (`--api-key-file`, so it is not in the shell history or
`ps` output) or from the `ATTNLAB_API_KEY` environment variable; `resolve_api_key` picks exactly one.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import os
from pathlib import Path

ENV_VAR = "ATTNLAB_API_KEY"
OPEN_PATHS = {("GET", "/health")}  # what probes (load balancers, orchestrators) call without credentials
LOOPBACK_HOSTS = "localhost, 127.0.0.1, [::1]"


def resolve_api_key(key: str | None = None, key_file: str | os.PathLike | None = None,
                    environ: dict | None = None) -> str | None:
    """The key from exactly one of: the option, the file (first line, surrounding whitespace removed), the
    environment variable. None when none is set (the server is then open to whoever reaches it)."""
    environ = os.environ if environ is None else environ
    if key is not None and key_file is not None:
        raise ValueError("--api-key and --api-key-file both given; pass the key one way")
    source = "--api-key"
    if key_file is not None:
        path = Path(key_file)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise ValueError(f"--api-key-file {path}: not UTF-8 text")
        key, source = (lines[0] if lines else ""), f"--api-key-file {path}"
    elif key is None:
        key, source = environ.get(ENV_VAR), ENV_VAR
        if key is None:
            return None
    key = key.strip()
    if not key:
        raise ValueError(f"{source}: the API key is empty")
    if not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        # an HTTP header value cannot carry it reliably, so no client could ever send it
        raise ValueError(f"{source}: the API key must be printable ASCII without spaces")
    return key


def is_loopback(host: str) -> bool:
    """True when `host` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def carries_key(headers, key: str | None) -> bool:
    """True when the ASGI `headers` hold exactly one `Authorization: Bearer <key>` (compared in constant time)."""
    if key is None:
        return False
    sent = [v for k, v in headers or [] if k == b"authorization"]
    return len(sent) == 1 and hmac.compare_digest(sent[0], f"Bearer {key}".encode())


def host_name(host: str) -> str:
    """The name in a Host header value, without its port: "[::1]:8000" -> "::1", "Example.org:80" -> "example.org"."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _refusal(status: int, message: str, kind: str, headers=()) -> tuple[dict, bytes]:
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    return {"type": "http.response.start", "status": status, "headers": headers}, body


class HostAllowlist:
    """ASGI middleware: 400 for a request whose Host header names neither loopback nor an allowed name
    (DNS rebinding; see the module docstring). `allowed`: extra names, with or without a port; "*": any."""

    def __init__(self, app, allowed=()) -> None:
        self.app = app
        self.any = "*" in allowed
        self.names = {h.strip().lower() for h in allowed if h.strip() and h != "*"}

    def allows(self, host: str) -> bool:
        name = host_name(host)
        return self.any or is_loopback(name) or name in self.names or host.strip().lower() in self.names

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.any:
            return await self.app(scope, receive, send)
        hosts = [v.decode("latin-1") for k, v in scope.get("headers") or [] if k == b"host"]
        if len(hosts) == 1 and self.allows(hosts[0]):
            return await self.app(scope, receive, send)
        shown = repr(hosts[0][:100]) if len(hosts) == 1 else "missing" if not hosts else "sent twice"
        start, body = _refusal(400, f"Host not allowed: {shown}; this server answers to {LOOPBACK_HOSTS} and the "
                                    f"names given with --allowed-hosts", "invalid_request_error",
                               [(b"connection", b"close")])
        await send(start)
        await send({"type": "http.response.body", "body": body})


def _unauthorized(message: str) -> tuple[dict, bytes]:
    return _refusal(401, message, "authentication_error", [(b"www-authenticate", b'Bearer realm="attnlab"')])


class ApiKeyAuth:
    """ASGI middleware: pass requests that carry the key (and GET /health), answer 401 to the rest before the
    body is read. `on_reject(path)` lets the server count refusals."""

    def __init__(self, app, key: str, on_reject=None) -> None:
        self.app, self.on_reject = app, on_reject
        self._expected = f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or (scope["method"], scope["path"]) in OPEN_PATHS:
            return await self.app(scope, receive, send)
        sent = [v for k, v in scope.get("headers") or [] if k == b"authorization"]
        if len(sent) == 1 and hmac.compare_digest(sent[0], self._expected):
            return await self.app(scope, receive, send)
        message = ("invalid API key" if sent else
                   "missing API key: send the header 'Authorization: Bearer <key>'")
        if self.on_reject is not None:
            self.on_reject(scope["path"])
        start, body = _unauthorized(message)
        await send(start)
        await send({"type": "http.response.body", "body": body})
