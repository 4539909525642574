"""The explorer's HTTP side (FastAPI): the page's files and the JSON API it calls (the page is its one
client). Every answer is JSON but the page's files; every error is {"error": "..."}
naming the field, with 400 (bad input), 404 (unknown run, session or file), 413 (too long) or 422
(a value out of range).

Safety, as `attnlab serve` (serve/auth.py): requests whose Host header is not loopback's or in
`allowed_hosts` get 400 (DNS rebinding); with `api_key`, every /api/* request needs
`Authorization: Bearer KEY` (the page itself loads without it and reads the key from the URL fragment,
which the browser never sends). Static files are served from a fixed list: the names in the static
folder, nothing else.

    >>> app = create_app("minilm")              # or create_app(Explorer(model, tokenizer))
    >>> uvicorn.run(app, host="127.0.0.1", port=8765)
"""
from __future__ import annotations

import json
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ..serve.app import BodyLimit
from ..serve.auth import HostAllowlist, carries_key
from . import decoding, tasks
from .info import model_info
from .session import ExploreError, Explorer

STATIC = Path(__file__).parent / "static"
MEDIA = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml", ".json": "application/json"}
MAX_BODY = 1 << 20


class RunRequest(BaseModel):
    text: str
    text_b: str | None = None
    # the open head: its map and equation come back with the run (one round trip per edit)
    layer: int | None = None
    head: int | None = None
    token: int | None = None
    global_tokens: list[int] | None = None  # Longformer: positions with global attention (default [0])


class Shaping(BaseModel):
    """How the next-token distribution is re-shaped before sampling (every decoder request takes it)."""
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0


class NextRequest(Shaping):
    text: str
    top: int = 20


class ReshapeRequest(Shaping):
    session: str
    top: int = 20


class StepRequest(ReshapeRequest):
    token: int | None = None
    seed: int = 0


class PathsRequest(Shaping):
    text: str
    steps: int = 16
    seed: int = 0


class FillMaskRequest(BaseModel):
    text: str
    top: int = 10


class SimilarityRequest(BaseModel):
    a: str
    b: str


class TranslateRequest(BaseModel):
    text: str
    max_new_tokens: int = 32
    target: str | None = None


def _json(obj, status: int = 200) -> Response:
    return Response(json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False), status,
                    media_type="application/json")


def _error(status: int, message: str) -> Response:
    return _json({"error": message}, status)


class ApiKeyOnApi:
    """ASGI middleware: /api/* needs `Authorization: Bearer KEY` (401 otherwise); the page's files do not."""

    def __init__(self, app, key: str) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/api/") or carries_key(scope.get("headers"),
                                                                                          self.key):
            return await self.app(scope, receive, send)
        sent = any(k == b"authorization" for k, _ in scope.get("headers") or [])
        message = "Authorization: invalid API key" if sent else \
            "Authorization: missing; send the header 'Authorization: Bearer <key>'"
        response = _error(401, message)
        response.headers["www-authenticate"] = 'Bearer realm="attnlab"'
        await response(scope, receive, send)


def _shape(body) -> decoding.Shape:
    return decoding.Shape(body.temperature, body.top_k, body.top_p)


def create_app(model_or_session, api_key: str | None = None, allowed_hosts=None, *,
               max_tokens: int = 512) -> FastAPI:
    """The explorer app for an `Explorer`, or for a model name/path (loaded here, `Explorer.load`)."""
    ex = model_or_session if isinstance(model_or_session, Explorer) else \
        Explorer.load(str(model_or_session), max_tokens=max_tokens)
    app = FastAPI(title="attnlab explore", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.explorer = ex

    @app.exception_handler(ExploreError)
    async def explore_error(_request: Request, err: ExploreError):
        return _error(err.status, err.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query")) or "body"
        return _error(422, f"{where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, err: HTTPException):
        return _error(err.status_code, str(err.detail))

    def call(fn, *args, **kwargs):  # the computations run in the thread pool, never on the event loop
        return run_in_threadpool(fn, *args, **kwargs)

    @app.get("/")
    async def index():
        return _static("index.html")

    @app.get("/static/{name}")
    async def static(name: str):
        return _static(name)

    @app.get("/api/model")
    async def model():
        return _json(await call(model_info, ex))

    @app.post("/api/run")
    async def run(body: RunRequest):
        view = None
        if body.layer is not None or body.head is not None or body.token is not None:
            view = (body.layer or 0, body.head or 0, body.token or 0)
        return _json(await call(ex.run, body.text, body.text_b, view, body.global_tokens))

    @app.get("/api/attention")
    async def attention(run: str, layer: int, head: int, stack: str | None = None):
        return _json(await call(ex.attention, run, layer, head, stack))

    @app.get("/api/head")
    async def head(run: str, layer: int, head: int, token: int):
        return _json(await call(ex.head, run, layer, head, token))

    @app.get("/api/cross")
    async def cross(run: str, layer: int, head: int):
        return _json(await call(ex.cross, run, layer, head))

    @app.post("/api/next")
    async def next_token(body: NextRequest):
        return _json(await call(decoding.next_token, ex, body.text, _shape(body), body.top))

    @app.post("/api/reshape")
    async def reshape(body: ReshapeRequest):
        return _json(await call(decoding.reshape, ex, body.session, _shape(body), body.top))

    @app.post("/api/step")
    async def step(body: StepRequest):
        return _json(await call(decoding.step, ex, body.session, body.token, _shape(body), body.seed, body.top))

    @app.post("/api/paths")
    async def paths(body: PathsRequest):
        return _json(await call(decoding.paths, ex, body.text, body.steps, _shape(body), body.seed))

    @app.post("/api/fill_mask")
    async def fill_mask(body: FillMaskRequest):
        return _json(await call(tasks.fill_mask, ex, body.text, body.top))

    @app.post("/api/similarity")
    async def similarity(body: SimilarityRequest):
        return _json(await call(tasks.similarity, ex, body.a, body.b))

    @app.post("/api/translate")
    async def translate(body: TranslateRequest):
        return _json(await call(tasks.translate, ex, body.text, body.max_new_tokens, body.target))

    # the last added is the outermost: the Host check first, then the key, then the body cap
    app.add_middleware(BodyLimit, limit=MAX_BODY)
    if api_key is not None:
        app.add_middleware(ApiKeyOnApi, key=api_key)
    app.add_middleware(HostAllowlist, allowed=list(allowed_hosts or ()))
    return app


def _static(name: str) -> Response:
    """A file of the static folder, by exact name: the listing is the allow-list, so '..', slashes or
    encoded separators can name nothing else."""
    files = {p.name: p for p in STATIC.iterdir() if p.is_file()} if STATIC.is_dir() else {}
    path = files.get(name)
    if path is None or path.suffix not in MEDIA:
        return _error(404, f"file: {name!r} is not one of the page's files")
    return FileResponse(path, media_type=MEDIA[path.suffix], headers={"cache-control": "no-cache"})
