"""Explore a model in the browser: type a text and see its tokens, every layer and head's
attention, and for one token of one head the model's real numbers: Q, K, V, the scores QK^T, the
scale, the mask, the softmax and the weighted sum. A decoder adds its next-token distribution
(temperature, top-k, top-p) and steps that grow the KV cache; an MLM fills masks; a
sentence-transformers model compares two sentences; an encoder-decoder shows cross-attention per
generated token. Works offline: every file is served from this machine. Prints the URL and opens
nothing.

Binds 127.0.0.1 unless --host says otherwise; another address needs an API key (--api-key-file or
ATTNLAB_API_KEY): the page reads it from the URL fragment (http://HOST:PORT/#key=KEY) and sends
it as 'Authorization: Bearer KEY'.

examples:
  attnlab explore minilm
  attnlab explore smollm2 --port 8766 --threads 1
  attnlab explore smollm2 --host 0.0.0.0 --api-key-file key --allowed-hosts lab.example.org

Guide: docs/guides/explorer.md
"""
from __future__ import annotations

import argparse
import sys

from .network import add_network_arguments, allowed_hosts

NAME = "explore"
HELP = "explore a model's attention and predictions interactively in the browser"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a model directory, a .gguf file or a packaged name (minilm, smollm2)")
    add_network_arguments(p, port=8765, key_scope="/api/*")
    p.add_argument("--max-tokens", type=int, default=512, help="longest input accepted, in tokens (default 512)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32", help="precision of linear layers")
    p.add_argument("--threads", type=int, default=None, help="torch threads for the model (default: torch's)")


def run(args: argparse.Namespace) -> int:
    import socket

    import torch
    import uvicorn

    from ..explore import Explorer, create_app
    from ..serve.auth import ENV_VAR, is_loopback, resolve_api_key
    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be positive, got {args.max_tokens}")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be positive, got {args.threads}")
        torch.set_num_threads(args.threads)
    api_key = resolve_api_key(args.api_key, args.api_key_file)
    if api_key is None and not is_loopback(args.host):
        raise ValueError(f"--host {args.host} is reachable from other machines: set an API key (--api-key-file, "
                         f"--api-key or {ENV_VAR}), or bind 127.0.0.1")
    allowed = allowed_hosts(args)
    torch.set_grad_enabled(False)
    explorer = Explorer.load(args.model, dtype=args.dtype, max_tokens=args.max_tokens)
    app = create_app(explorer, api_key=api_key, allowed_hosts=allowed)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))  # bound before printing: --port 0 prints the port the OS chose
    port = sock.getsockname()[1]
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"attnlab explore: {explorer.name} ({explorer.kind}) at http://{shown}:{port}/"
          + ("  (append #key=YOUR_KEY to the URL)" if api_key else ""), flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    print("attnlab explore: stopped", file=sys.stderr)
    return 0
