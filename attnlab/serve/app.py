"""The HTTP server: OpenAI-shaped endpoints over attnlab models (FastAPI app, run by uvicorn).

Which endpoints exist depends on the model:
  encoder (BERT-like)       POST /v1/embeddings, and POST /v1/classify when it has a classification head
  decoder (GPT-2, LLaMA…)   POST /v1/completions, POST /v1/chat/completions (`"stream": true` = server-sent events),
                            and POST /v1/embeddings
  always                    GET /health, GET /metrics, GET /viz?text=... (the attention page, viz.py)

Embeddings from a decoder are what OpenAI-compatible servers (vLLM's pooling runner, llama.cpp's
--embeddings) give for a causal LM: the final hidden states (before the LM head) mean-pooled over the
text's tokens and L2-normalised, the same `attnlab.inference.embed` an encoder uses. Each token only sees
the ones before it, so these are weaker sentence vectors than a trained bi-directional encoder's, but
one server can answer both kinds of request.

Decoding goes through the continuous-batching engine (attnlab.inference.engine) in its own thread, so
concurrent requests share every forward pass; embedding/classification jobs are batched by
`EncoderWorker` (on a decoder it takes the engine's `forward_lock`, so the two never run the model at
once). Limits protect the process: max input tokens, max new tokens, max queued requests (429), a
request timeout (504, the request's KV blocks are freed), a body size cap (413, whether the body comes
with a Content-Length or chunked), a cap on the /viz page's weights (413). A client that disconnects,
mid-stream or while waiting for a whole answer, has its request cancelled, which returns its KV blocks to
the pool; /metrics reports `kv_blocks_free` / `kv_blocks_total`, equal whenever nothing is running. Every
rejection is a 4xx with a JSON body `{"error": {"message", "type", "param", "code"}}`. With `api_key=`,
requests other than GET /health need `Authorization: Bearer <key>` (auth.py); GET /health alone says
whether the server is up, its details (model, failures) need the key, and are in /metrics too. Requests
whose Host header is not loopback's or in `allowed_hosts` get 400 (DNS rebinding, auth.py). A generation
step that raises fails only the requests of that pass with a 500 (the engine goes on; the details of
/health and /metrics report it); drain.py stops the server without dropping requests in flight.

    >>> app = create_app(model, tokenizer, name="smollm2")
    >>> uvicorn.run(app, host="127.0.0.1", port=8000)
"""
from __future__ import annotations

import asyncio
import sys
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ..inference.engine import ADMISSIONS, Engine, QueueFull
from ..inference.quantize import linear_precision
from .auth import ApiKeyAuth, HostAllowlist, carries_key
from .drain import Drain, DrainGate
from .generation import register_generation
from .metrics import Metrics
from .schemas import ClassifyRequest, EmbeddingRequest
from .viz import max_tokens, page_weights, render
from .workers import EncoderWorker


@dataclass
class Limits:
    max_input_tokens: int = 2048
    max_new_tokens: int = 512
    max_queued: int = 256
    request_timeout: float = 120.0   # seconds
    max_body_bytes: int = 1 << 20
    max_batch: int = 32              # sequences decoded together
    max_prefill_tokens: int = 2048   # prompt tokens per engine step (longer prompts are prefilled in chunks)
    num_blocks: int = 512            # KV pool size, in blocks of block_size tokens
    block_size: int = 16
    kv_dtype: str = "fp32"           # KV pool: fp32 or fp16 (half the memory, keys and values rounded)
    admission: str = "shortest"      # which queued request a free row takes: shortest prompt, or fifo
    max_texts: int = 256             # per embeddings/classify request
    max_viz_weights: int = 4_000_000  # attention weights on one /viz page (layers x heads x tokens^2)

    def __post_init__(self) -> None:
        if self.kv_dtype not in ("fp32", "fp16"):
            raise ValueError(f"Limits.kv_dtype: 'fp32' or 'fp16', got {self.kv_dtype!r}")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"Limits.admission: one of {', '.join(ADMISSIONS)}, got {self.admission!r}")


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)


class BodyLimit:
    """Reject bodies over `limit` bytes (413) before they are read into memory, whether or not the client
    sent Content-Length: the body is read here, at most `limit` bytes of it, and handed on whole. (Raising
    from inside the app's own read would reach it as an undecodable body, a 400.)"""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await _error(413, f"request body of {int(length)} bytes exceeds the limit of {self.limit}",
                                kind="request_too_large")(scope, receive, send)
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before its body was complete: nobody to answer
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.limit:
                return await _error(413, f"request body exceeds the limit of {self.limit} bytes",
                                    kind="request_too_large")(scope, receive, send)
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay():  # the body once, then the client's own messages (its disconnect)
            nonlocal whole
            if whole is not None:
                message, whole = whole, None
                return message
            return await receive()
        return await self.app(scope, replay, send)


def model_kind(model) -> str:
    if getattr(model.config, "causal", False) and hasattr(model, "lm_head"):
        return "decoder"
    return "encoder"


def create_app(model, tokenizer, *, name: str = "model", limits: Limits | None = None,
               start_engine: bool = True, compile: bool | dict = False,
               compile_tokens: int | None = None, api_key: str | None = None,
               adapters: dict | None = None, allowed_hosts=()) -> FastAPI:
    """compile: the decoder engine's decode step runs compiled (see `Engine`); its buckets for contexts
    up to `compile_tokens` (default: the first bucket) are compiled here, before the server accepts requests.
    api_key: every request but GET /health must send `Authorization: Bearer <api_key>` (see auth.py).
    adapters: {name: model} of a decoder, e.g. `interop.peft.adapter_view`s over `model`'s weights; a
    completion request's "model" field picks one (see generation.py), each decodes in its own engine.
    allowed_hosts: Host header names accepted besides loopback's ("*": any); see auth.HostAllowlist."""
    limits = limits or Limits()
    kind = model_kind(model)
    adapters = dict(adapters or {})
    if adapters and (kind != "decoder" or compile):
        raise ValueError("named adapters are served for decoders without compile")
    if name in adapters:
        raise ValueError(f"adapter name {name!r} is the base model's name; pick another")
    metrics = Metrics()
    engine = None
    kv_dtype = {"fp32": None, "fp16": torch.float16}[limits.kv_dtype]  # fp32: the model's own dtype
    if kind == "decoder":
        engine = Engine(model, tokenizer, num_blocks=limits.num_blocks, block_size=limits.block_size,
                        max_batch=limits.max_batch, max_waiting=limits.max_queued,
                        max_prefill_tokens=limits.max_prefill_tokens, compile=compile, kv_dtype=kv_dtype,
                        admission=limits.admission)
        if compile:
            print("attnlab serve: compiling the decode step (once; a few minutes)...", file=sys.stderr, flush=True)
            engine.warmup(compile_tokens)
    # one engine per adapter: its own batch and KV pool (limits.num_blocks each), the base weights shared
    engines = {name: engine, **{n: Engine(m, tokenizer, num_blocks=limits.num_blocks, block_size=limits.block_size,
                                          max_batch=limits.max_batch, max_waiting=limits.max_queued,
                                          max_prefill_tokens=limits.max_prefill_tokens, kv_dtype=kv_dtype,
                                          admission=limits.admission)
                                for n, m in adapters.items()}} if engine is not None else {}
    # a text longer than the model's positions is refused, not truncated or crashed on
    max_embed_tokens = min(limits.max_input_tokens, model.config.max_position_embeddings)
    worker = EncoderWorker(model, tokenizer, max_queued=limits.max_queued, max_length=max_embed_tokens,
                           lock=engine.forward_lock if engine is not None else None)
    classifier = kind == "encoder" and type(model).__name__ == "SequenceClassification"
    endpoints = (["/v1/completions", "/v1/chat/completions"] if kind == "decoder" else []) + \
        ["/v1/embeddings"] + (["/v1/classify"] if classifier else [])

    @asynccontextmanager
    async def lifespan(app):
        if start_engine:
            for e in engines.values():
                e.start()
        worker.start()
        yield
        for e in engines.values():
            e.stop()
        worker.stop()

    app = FastAPI(title=f"attnlab: {name}", lifespan=lifespan)
    # the last added runs first: the Host check, the drain gate, then the key check (before any body is read),
    # then the body cap
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)
    if api_key is not None:
        known = {"/health", "/metrics", "/viz", "/docs", "/openapi.json", "/v1/embeddings", "/v1/classify",
                 "/v1/completions", "/v1/chat/completions", "/v1/models"}
        app.add_middleware(ApiKeyAuth, key=api_key,  # an unknown path is counted as "other": bounded /metrics
                           on_reject=lambda path: metrics.record(path if path in known else "other", 401))
    drain = Drain()
    app.add_middleware(DrainGate, drain=drain)
    app.add_middleware(HostAllowlist, allowed=list(allowed_hosts or ()))
    app.state.engine, app.state.worker, app.state.metrics, app.state.limits = engine, worker, metrics, limits
    app.state.drain = drain

    @app.exception_handler(ApiError)
    async def _api_error(request, err: ApiError):
        metrics.record(request.url.path, err.status)
        return _error(err.status, err.message, err.param, err.kind)

    @app.exception_handler(Exception)  # a bug: still a JSON answer, with no internals shown (the log has them)
    async def _crash(request, err: Exception):
        metrics.record(request.url.path, 500)
        return _error(500, f"internal server error ({type(err).__name__})", kind="server_error")

    @app.exception_handler(HTTPException)  # unknown path (404), wrong method (405), undecodable body (400)
    async def _http_error(request, err: HTTPException):
        metrics.record("other" if err.status_code == 404 else request.url.path, err.status_code)
        kind = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "invalid_request_error")
        response = _error(err.status_code, str(err.detail), kind=kind)
        response.headers.update(err.headers or {})  # e.g. Allow on a 405
        return response

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, err: RequestValidationError):
        errors = err.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            metrics.record(request.url.path, 400)
            return _error(400, "malformed JSON body: " + "; ".join(str(e.get("ctx", {}).get("error", e["msg"]))
                                                                    for e in errors), "body")
        fields = [".".join(str(x) for x in e["loc"] if x != "body") or "body" for e in errors]
        message = "; ".join(f"{f}: {e['msg']}" for f, e in zip(fields, errors))
        metrics.record(request.url.path, 422)
        return _error(422, message, fields[0])

    # ------------------------------------------------------------------ always there
    def details() -> dict:
        out = {"model": name, "kind": kind, "endpoints": endpoints, "precision": linear_precision(model)}
        if adapters:
            out["adapters"] = sorted(adapters)
        if engine is not None:  # still "ok": a failed step fails its own requests and the engine goes on
            out["failures"] = {"steps": engine.stats["failed_steps"], "requests": engine.stats["failed_requests"],
                               "last_error": engine.last_error}
        return out

    def up() -> bool:
        """False once a background thread that was started has died (a stopped one is None again)."""
        threads = [getattr(e, "_thread", None) for e in engines.values()] + [getattr(worker, "_thread", None)]
        return all(t is None or t.is_alive() for t in threads)

    @app.get("/health")
    async def health(request: Request):
        ok = up()
        out = {"status": "ok" if ok else "not ok"}
        if carries_key(request.scope.get("headers"), api_key):  # the details only for who holds the key
            out.update(details())
        return out if ok else JSONResponse(out, 503)

    @app.get("/metrics")
    async def get_metrics():
        out = metrics.snapshot()
        out.update(queue_depth=worker.queue_depth)
        if engine is not None:
            out.update(queue_depth=len(engine.waiting) + worker.queue_depth, running=len(engine.running),
                       kv_blocks_free=engine.pool.num_free, kv_blocks_total=engine.pool.capacity_blocks,
                       kv_block_size=engine.pool.block_size, engine=dict(engine.stats))
        out["limits"] = asdict(limits)
        out["server"] = details()
        return out

    one_page = asyncio.Lock()  # one /viz page at a time: each is a forward pass and seconds of CPU

    @app.get("/viz", response_class=HTMLResponse)
    async def viz(text: str, text_b: str | None = None, view: str = "head", layer: int = 0, head: int | None = None):
        from ..viz.attention import extract_text
        n = sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in (text, text_b) if t)
        most = min(limits.max_input_tokens, 256)
        param = "text" + (" + text_b" if text_b else "")
        if n > most:
            raise ApiError(400, f"{param} has {n} tokens; /viz accepts at most {most}", "text")
        t = tokenizer(text, text_b, return_tensors="pt")["input_ids"].size(1)  # what the page shows, specials too
        layers, heads, cap = model.config.num_layers, model.config.num_heads, limits.max_viz_weights
        if page_weights(layers, heads, t) > cap:
            raise ApiError(413, f"{param} is {t} tokens: its page would hold {layers} layers x {heads} heads x {t}^2 = "
                                f"{page_weights(layers, heads, t)} attention weights, over this server's cap of {cap} "
                                f"(max_viz_weights); send at most {max_tokens(layers, heads, cap)} tokens", "text",
                           kind="request_too_large")

        def forward():
            with worker.lock:  # its hooks must see only its own pass (the engine's passes take it too)
                return extract_text(model, tokenizer, text, text_b, neuron=True, neuron_fallback=layer, title=name)
        try:
            async with one_page:
                data = await run_in_threadpool(forward)
                page = await run_in_threadpool(lambda: render(data, view=view, layer=layer, head=head))
        except ValueError as err:
            raise ApiError(400, str(err), "layer" if "layer" in str(err) else "head" if "head" in str(err) else None)
        metrics.record("/viz", 200)
        return HTMLResponse(page)

    # ------------------------------------------------------------------ embeddings (any model), classify
    async def _encoder_job(job: str, texts: list[str], endpoint: str):
        started = time.perf_counter()
        if not texts:
            raise ApiError(400, "input must not be empty", "input")
        if len(texts) > limits.max_texts:
            raise ApiError(400, f"input has {len(texts)} texts; at most {limits.max_texts} per request", "input")
        lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]
        for i, n in enumerate(lengths):
            if n == 0:
                raise ApiError(400, f"input[{i}] encodes to no tokens", f"input[{i}]")
            if n > max_embed_tokens:
                raise ApiError(400, f"input[{i}] has {n} tokens; at most {max_embed_tokens} are accepted "
                                    f"(max_input_tokens={limits.max_input_tokens}, model context "
                                    f"{model.config.max_position_embeddings})", f"input[{i}]")
        try:
            future = worker.submit(job, texts)
        except QueueFull as err:
            raise ApiError(429, str(err), kind="rate_limit_error")
        try:
            out = await asyncio.wait_for(future, limits.request_timeout)
        except asyncio.TimeoutError:
            raise ApiError(504, f"request timed out after {limits.request_timeout:g} s", kind="timeout")
        metrics.add_tokens("embedded", sum(lengths))
        metrics.record(endpoint, 200, time.perf_counter() - started)
        return out, sum(lengths)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest):
        vectors, n = await _encoder_job("embed", body.texts(), "/v1/embeddings")
        return {"object": "list", "model": name, "usage": {"prompt_tokens": n, "total_tokens": n},
                "data": [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]}

    if classifier:
        id2label = model.config.extra.get("id2label") or {}

        @app.post("/v1/classify")
        async def classify(body: ClassifyRequest):
            probs, n = await _encoder_job("classify", body.texts(), "/v1/classify")
            data = []
            for i, p in enumerate(probs):
                scores = {id2label.get(str(j), str(j)): float(s) for j, s in enumerate(p)}
                best = int(p.argmax())
                data.append({"index": i, "label": id2label.get(str(best), str(best)), "score": float(p[best]),
                             "scores": scores})
            return {"object": "list", "model": name, "data": data, "usage": {"prompt_tokens": n, "total_tokens": n}}

    # ------------------------------------------------------------------ decoders
    if kind == "decoder":
        register_generation(app, engines, tokenizer, name, limits, metrics, ApiError)

    for path in ("/v1/embeddings", "/v1/classify", "/v1/completions", "/v1/chat/completions"):
        if path not in endpoints:  # a clear answer instead of a bare 404
            app.add_api_route(path, _unsupported(path, kind, classifier), methods=["POST"])
    return app


def _unsupported(path: str, kind: str, classifier: bool):
    async def handler():
        need = {"/v1/classify": "an encoder with a sequence-classification head"}.get(path, "a decoder (causal LM)")
        raise ApiError(404, f"{path} needs {need}; this server runs {'a classifier' if classifier else 'an ' + kind}",
                       kind="not_found")
    return handler


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"
