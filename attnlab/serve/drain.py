"""Graceful shutdown: on SIGTERM (or Ctrl-C) the server drains instead of dropping what is in flight.

uvicorn on its own closes the listening socket at the first signal and then waits for open connections
without a bound (or cancels them after `timeout_graceful_shutdown`), and afterwards re-raises the signal,
so the process ends killed by SIGTERM rather than with exit code 0. Here the stop goes in two phases:

  1. draining: the port stays open, every new request (GET /health included, so a load balancer takes
     the server out of rotation) gets 503 with `Connection: close`, and the requests already in flight,
     streaming ones included, run to their end; this lasts until none is left or `drain_seconds` pass;
  2. uvicorn's own shutdown: the listener closes (new connections are refused), whatever is still running
     after the drain is cancelled (its KV blocks are freed), the engine stops, and the process exits 0.

A second signal skips the wait and stops at once.
"""
from __future__ import annotations

import json
import threading
import time

import uvicorn

POLL_S = 0.05
# after the drain, what uvicorn still waits for before cancelling what runs: the drain already gave requests
# their time, this only lets the last bytes of responses that just ended reach their sockets
GRACE_S = 0.25


class Drain:
    """The server's drain state: HTTP requests in flight, and whether draining has begun."""

    def __init__(self) -> None:
        self.active = 0  # changed on the event loop only; read by the drain thread (an int read is atomic)
        self.draining = False


class DrainGate:
    """ASGI middleware that counts requests in `drain.active` and answers 503 once `drain.draining`."""

    def __init__(self, app, drain: Drain) -> None:
        self.app, self.drain = app, drain

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.drain.draining:
            body = json.dumps({"error": {"message": "the server is shutting down; retry on another instance",
                                         "type": "unavailable", "param": None, "code": 503}}).encode()
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"), (b"retry-after", b"1")]})
            await send({"type": "http.response.body", "body": body})
            return
        self.drain.active += 1
        try:
            await self.app(scope, receive, send)  # returns when the response (a whole stream) has been sent
        finally:
            self.drain.active -= 1


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM/SIGINT drains (see the module docstring) and whose process then
    exits normally; `drain` is the app's `Drain` (app.state.drain)."""

    def __init__(self, config: uvicorn.Config, drain: Drain, drain_seconds: float) -> None:
        super().__init__(config)
        self.drain, self.drain_seconds = drain, drain_seconds
        self._drainer: threading.Thread | None = None

    def handle_exit(self, sig, frame) -> None:
        # not recorded in _captured_signals: uvicorn would re-raise it after shutdown and the process would
        # end "killed by SIGTERM" although it stopped as asked
        if self._drainer is not None:  # the second signal: stop now
            self.should_exit = self.force_exit = True
            return
        self.drain.draining = True
        self._drainer = threading.Thread(target=self._wait_then_exit, name="attnlab-drain", daemon=True)
        self._drainer.start()

    def _wait_then_exit(self) -> None:
        deadline = time.monotonic() + self.drain_seconds
        while self.drain.active and time.monotonic() < deadline:
            time.sleep(POLL_S)
        self.should_exit = True  # uvicorn's main loop notices within 0.1 s and shuts down


def make_server(app, *, host: str, port: int, drain_seconds: float = 30.0, ssl_certfile: str | None = None,
                ssl_keyfile: str | None = None, log_level: str = "info") -> DrainingServer:
    """The server for `app` (made by `create_app`); `.run()` serves until a signal, then drains."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, ssl_certfile=ssl_certfile,
                            ssl_keyfile=ssl_keyfile, timeout_graceful_shutdown=GRACE_S)
    return DrainingServer(config, app.state.drain, drain_seconds)


def run_server(app, **options) -> None:
    """Serve `app` until SIGTERM/Ctrl-C, then drain (options: those of `make_server`)."""
    make_server(app, **options).run()
