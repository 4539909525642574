"""Serve a model over HTTP with OpenAI-shaped endpoints (FastAPI + uvicorn).

An encoder answers POST /v1/embeddings (and POST /v1/classify with a classification head); a decoder
answers POST /v1/completions and POST /v1/chat/completions ("stream": true for server-sent events),
decoding all concurrent requests together with continuous batching over a paged KV cache.
Always: GET /health, GET /metrics (JSON), GET /viz?text=... (the attention page).
Binds 127.0.0.1 unless --host says otherwise.

examples:
  attnlab serve smollm2 --port 8000
  curl -s localhost:8000/v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":20}'
  attnlab serve sentence-transformers/all-MiniLM-L6-v2 --dtype int8
"""
from __future__ import annotations

import argparse

NAME = "serve"
HELP = "serve a model over HTTP (embeddings / classify / completions / chat, streaming, /metrics, /viz)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..serve.app import Limits
    d = Limits()
    p.add_argument("model", metavar="MODEL", help="a model directory, a .gguf file or a packaged name")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32", help="precision of linear layers")
    p.add_argument("--name", default=None, help="model name reported in responses (default: MODEL)")
    p.add_argument("--max-input-tokens", type=int, default=d.max_input_tokens, help="longest accepted input")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="largest accepted max_tokens")
    p.add_argument("--max-queued", type=int, default=d.max_queued, help="queued requests before 429")
    p.add_argument("--timeout", type=float, default=d.request_timeout, help="seconds before a request gets 504")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="request body cap (413)")
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="sequences decoded together")
    p.add_argument("--kv-blocks", type=int, default=d.num_blocks, help="KV pool size in blocks")
    p.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV block")
    p.add_argument("--compile", action="store_true",
                   help="decoders: run decode steps through torch.compile (1.06-1.5x tokens/s measured on a "
                        "2-core CPU). The step for contexts up to --compile-tokens is compiled before the server "
                        "starts (a few minutes per 128-token bucket); a longer bucket compiles on first use, "
                        "pausing decoding meanwhile")
    p.add_argument("--compile-tokens", type=int, default=None, metavar="N",
                   help="with --compile: contexts (prompt + generated) up to N tokens are compiled before the "
                        "server starts, in 128-token buckets (default 128: one bucket)")


def run(args: argparse.Namespace) -> int:
    import torch
    import uvicorn

    import attnlab
    from ..inference.quantize import quantize
    from ..serve.app import Limits, create_app
    if args.compile and args.dtype != "fp32":
        raise SystemExit("attnlab serve: --compile needs --dtype fp32")
    if args.compile_tokens is not None and (not args.compile or args.compile_tokens < 1):
        raise SystemExit("attnlab serve: --compile-tokens needs --compile and a positive number of tokens")
    torch.set_grad_enabled(False)
    model = attnlab.load(args.model)
    if args.dtype != "fp32":
        model = quantize(model, args.dtype, inplace=True)
    tokenizer = attnlab.load_tokenizer(args.model)
    limits = Limits(max_input_tokens=args.max_input_tokens, max_new_tokens=args.max_new_tokens,
                    max_queued=args.max_queued, request_timeout=args.timeout, max_body_bytes=args.max_body_bytes,
                    max_batch=args.max_batch, num_blocks=args.kv_blocks, block_size=args.block_size)
    app = create_app(model, tokenizer, name=args.name or str(args.model), limits=limits, compile=args.compile,
                     compile_tokens=args.compile_tokens)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0
