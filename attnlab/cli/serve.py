"""Serve a model over HTTP with OpenAI-shaped endpoints (FastAPI + uvicorn). An encoder answers POST
/v1/embeddings (and /v1/classify with a classification head); a decoder POST /v1/completions and
/v1/chat/completions ("stream": true for server-sent events), decoding concurrent requests
together; a .gguf stays in its quantized blocks (--dequantize: fp32). Always: GET /health, /metrics
and /viz?text=... Binds 127.0.0.1 unless --host says otherwise; with an API key (--api-key-file, or
ATTNLAB_API_KEY) every request but GET /health needs `Authorization: Bearer KEY`. SIGTERM or Ctrl-C
lets the requests in flight finish (--drain-seconds), then exits 0.

examples:
  attnlab serve smollm2 --port 8000
  attnlab serve minilm --dtype int8
  attnlab serve smollm2 --adapter sentiment=runs/smol-sft --adapter german=runs/smol-de
  attnlab serve smollm2 --host 0.0.0.0 --api-key-file key --ssl-certfile c.pem --ssl-keyfile k.pem

Guide: docs/guides/generation-and-serving.md (more: docs/guides/command-details.md)
"""
from __future__ import annotations

import argparse
import sys

from .network import add_network_arguments, allowed_hosts

NAME = "serve"
HELP = "serve a model over HTTP (OpenAI-shaped embeddings, completions, chat)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a model directory, a .gguf file or a packaged name")
    add_network_arguments(p, port=8000, key_scope="every request but GET /health")
    p.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32", help="precision of linear layers")
    p.add_argument("--dequantize", action="store_true",
                   help=".gguf: dequantize the weights to fp32 (default: Q4_0/Q4_1/Q8_0 blocks stay quantized)")
    p.add_argument("--adapter", metavar="[NAME=]DIR", action="append",
                   help="a LoRA (or attnlab bottleneck) adapter in peft's layout. DIR alone: applied to MODEL (LoRA "
                        "merged: no cost per token). NAME=DIR, repeated: several adapters over one copy of MODEL "
                        "(unmerged, each in its own engine); a request's \"model\": NAME picks one, no \"model\" "
                        "(or --name) the base model")
    p.add_argument("--name", default=None, help="model name reported in responses (default: MODEL)")
    p.add_argument("--max-input-tokens", type=int, default=None, help="longest accepted input")
    p.add_argument("--max-new-tokens", type=int, default=None, help="largest accepted max_tokens")
    p.add_argument("--max-queued", type=int, default=None, help="queued requests before 429")
    p.add_argument("--timeout", type=float, default=None, help="seconds before a request gets 504")
    p.add_argument("--max-body-bytes", type=int, default=None, help="request body cap (413)")
    p.add_argument("--max-batch", type=int, default=None, help="sequences decoded together")
    p.add_argument("--max-prefill-tokens", type=int, default=None, metavar="N",
                   help="prompt tokens prefilled per engine step (longer prompts go in chunks; default 2048)")
    p.add_argument("--admission", choices=("shortest", "fifo"), default=None,
                   help="which queued request starts next: the shortest prompt (default; one that has waited "
                        "long goes first) or the oldest")
    p.add_argument("--kv-blocks", type=int, default=None, help="KV pool size in blocks")
    p.add_argument("--block-size", type=int, default=None, help="tokens per KV block")
    p.add_argument("--kv-dtype", choices=("fp32", "fp16"), default=None,
                   help="KV cache precision (default fp32; fp16 halves its memory and the bytes each step reads, "
                        "rounding keys and values as llama.cpp's default cache does)")
    p.add_argument("--compile", action="store_true",
                   help="decoders: decode through torch.compile; contexts up to --compile-tokens compile "
                        "before the server starts, a longer one on first use (pausing decoding)")
    p.add_argument("--compile-tokens", type=int, default=None, metavar="N",
                   help="with --compile: contexts (prompt + generated) up to N tokens are compiled before the "
                        "server starts, in 128-token buckets (default 128: one bucket)")
    p.add_argument("--ssl-certfile", default=None, metavar="PATH", help="serve HTTPS with this PEM certificate")
    p.add_argument("--ssl-keyfile", default=None, metavar="PATH", help="the certificate's PEM private key")
    p.add_argument("--drain-seconds", type=float, default=30.0, metavar="S",
                   help="on SIGTERM/Ctrl-C, how long requests in flight may run on while new ones get 503 "
                        "(default 30)")


def check_tls(certfile: str | None, keyfile: str | None) -> None:
    """Refuse, in one line, a certificate/key pair that uvicorn could not load (before the model loads)."""
    import ssl
    if (certfile is None) != (keyfile is None):
        raise ValueError("--ssl-certfile and --ssl-keyfile go together: give both or neither")
    if certfile is None:
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile)
    except ssl.SSLError as err:
        raise ValueError(f"--ssl-certfile {certfile} / --ssl-keyfile {keyfile}: not a PEM certificate and its "
                         f"private key ({err.reason or err})")


def keep_quantized(args: argparse.Namespace) -> bool:
    """A .gguf stays in its quantized blocks unless --dequantize, or an option that needs nn.Linear weights
    (inductor's compile, --dtype's quantizers, adapters wrapping Linears) asks for fp32 (one stderr line)."""
    from ..interop.api import keeps_quantized
    note = lambda s: print(f"attnlab serve: {s}", file=sys.stderr, flush=True)  # noqa: E731
    if not keeps_quantized(args.model, args.dequantize, note=note):
        return False
    needs = ("--compile" if args.compile else f"--dtype {args.dtype}" if args.dtype != "fp32" else
             "--adapter" if args.adapter else None)
    if needs:
        note(f"note: {needs} needs fp32 linear layers; dequantizing this .gguf (fp32 weights, about 6x the memory)")
        return False
    return True


def run(args: argparse.Namespace) -> int:
    import torch

    import attnlab
    from ..inference.quantize import calibration_batches, quantize
    from ..serve.app import Limits, create_app
    from ..serve.auth import ENV_VAR, is_loopback, resolve_api_key
    from ..serve.drain import run_server
    from .paths import split_named
    if args.compile and args.dtype != "fp32":
        raise SystemExit("attnlab serve: --compile needs --dtype fp32")
    if args.compile and args.kv_dtype == "fp16":
        raise SystemExit("attnlab serve: --compile keeps the KV cache in the model's dtype; drop --kv-dtype fp16")
    if args.compile_tokens is not None and (not args.compile or args.compile_tokens < 1):
        raise SystemExit("attnlab serve: --compile-tokens needs --compile and a positive number of tokens")
    if args.max_prefill_tokens is not None and args.max_prefill_tokens < 1:
        raise SystemExit("attnlab serve: --max-prefill-tokens must be a positive number of tokens")
    if args.drain_seconds < 0:
        raise SystemExit("attnlab serve: --drain-seconds must be 0 or more")
    api_key = resolve_api_key(args.api_key, args.api_key_file)
    check_tls(args.ssl_certfile, args.ssl_keyfile)
    if api_key is None and not is_loopback(args.host):
        print(f"attnlab serve: warning: {args.host} is reachable from other machines and no API key is set: anyone "
              f"who can reach port {args.port} can use this server (set --api-key-file or {ENV_VAR})",
              file=sys.stderr, flush=True)
    # Host check (DNS rebinding): loopback names, the address bound when it is a specific one, and the option's
    allowed = allowed_hosts(args)
    if not is_loopback(args.host) and args.allowed_hosts is None:
        print(f"attnlab serve: note: requests are answered only when their Host header names "
              f"{'loopback' if args.host in ('0.0.0.0', '::', '') else 'loopback or ' + args.host}; add the names "
              f"clients use with --allowed-hosts (or '*' for any, with an API key set)", file=sys.stderr, flush=True)
    named = [split_named(a) for a in args.adapter or []]
    if named and (any(n is None for n, _ in named) and len(named) > 1 or len({n for n, _ in named}) < len(named)):
        raise SystemExit("attnlab serve: --adapter: either one DIR (merged into MODEL) or NAME=DIR options with "
                         "distinct names")
    if any(n is not None for n, _ in named) and (args.dtype != "fp32" or args.compile):
        raise SystemExit("attnlab serve: --adapter NAME=DIR serves unmerged adapters: use --dtype fp32, no --compile")
    torch.set_grad_enabled(False)
    model = attnlab.load(args.model, quantized=keep_quantized(args))
    adapters = {}
    if named and named[0][0] is None:
        from ..interop.peft import attach_adapter
        from ..nn.lora import adapter_modules
        attach_adapter(model, named[0][1])
        if adapter_modules(model) and args.dtype != "fp32":
            raise SystemExit("attnlab serve: bottleneck adapters cannot be quantized; use --dtype fp32")
    elif named:
        from ..interop.peft import adapter_view
        adapters = {n: adapter_view(model, d) for n, d in named}
    tokenizer = attnlab.load_tokenizer(args.model)
    if args.dtype != "fp32":
        calibration = None
        from ..models.encoder import Encoder
        backbone = getattr(model, "backbone", model)
        if args.dtype == "int8" and isinstance(backbone, Encoder) and not backbone.config.causal:
            calibration = calibration_batches(tokenizer)  # SmoothQuant factors for an encoder
        model = quantize(model, args.dtype, inplace=True, calibration=calibration)
    given = dict(max_input_tokens=args.max_input_tokens, max_new_tokens=args.max_new_tokens,
                 max_queued=args.max_queued, request_timeout=args.timeout, max_body_bytes=args.max_body_bytes,
                 max_batch=args.max_batch, max_prefill_tokens=args.max_prefill_tokens, num_blocks=args.kv_blocks,
                 block_size=args.block_size, kv_dtype=args.kv_dtype, admission=args.admission)
    # options left out keep Limits' defaults (the parser leaves them None: its --help imports no server code)
    limits = Limits(**{k: v for k, v in given.items() if v is not None})
    app = create_app(model, tokenizer, name=args.name or str(args.model), limits=limits, compile=args.compile,
                     compile_tokens=args.compile_tokens, api_key=api_key, adapters=adapters,
                     allowed_hosts=allowed)
    run_server(app, host=args.host, port=args.port, drain_seconds=args.drain_seconds,
               ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile)
    return 0
