"""The options of a command that listens on the network (`serve`, `explore`): where it binds, its API key,
and which Host headers it answers. One definition, so both commands say and check the same thing."""
from __future__ import annotations

import argparse


def add_network_arguments(p: argparse.ArgumentParser, port: int, key_scope: str) -> None:
    """--host, --port (default `port`), --api-key, --api-key-file, --allowed-hosts; `key_scope` says which
    requests need the key (e.g. "every request but GET /health")."""
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=port, help=f"port (default {port}; 0: any free port)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on {key_scope} (401 otherwise); prefer "
                        "--api-key-file or the ATTNLAB_API_KEY environment variable, which keep the key out of "
                        "the shell history and the process list")
    p.add_argument("--api-key-file", default=None, metavar="PATH",
                   help="read the API key from the first line of this file")
    p.add_argument("--allowed-hosts", default=None, metavar="A,B",
                   help="Host header names answered besides localhost, 127.0.0.1, [::1] (others get 400); "
                        "'*' for any. Binding another --host: list the names clients use")


def allowed_hosts(args: argparse.Namespace) -> list[str]:
    """The Host names answered besides loopback's (DNS rebinding check): --allowed-hosts, and the address
    bound when it is a specific one (a name clients use), not a wildcard."""
    from ..serve.auth import is_loopback
    allowed = [h.strip() for h in (args.allowed_hosts or "").split(",") if h.strip()]
    if not is_loopback(args.host) and args.host not in ("0.0.0.0", "::", ""):
        allowed.append(args.host)
    return allowed
