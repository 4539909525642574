"""POST /v1/completions and /v1/chat/completions: OpenAI request/response shapes, `stream: true` as
server-sent events (`data: {chunk}` lines, then `data: [DONE]`), over the continuous-batching engine.

Several adapters over one base model (`serve --adapter NAME=DIR`): each name has its own engine, and the
request's "model" field picks it (OpenAI's field for which model answers); no field, or the server's own
name, is the base model; an unknown name is a 404 listing the names served. GET /v1/models lists them.
A server without named adapters ignores the field, as before (clients send whatever name they know).

A client that leaves stops its decoding: a stream's response task is cancelled when its connection closes,
and a request waiting for its whole answer watches for the disconnect while it waits; either way the
request is cancelled in the engine, which frees its KV blocks at its next step (recorded as a 499)."""
from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from ..inference.chat import apply_chat_template
from ..inference.engine import QueueFull, SamplingParams
from .schemas import ChatRequest, CompletionRequest, sse
from .workers import TokenStream


def register_generation(app: FastAPI, engines: dict, tokenizer, name: str, limits, metrics, ApiError) -> None:
    """engines: {model name: Engine}, the base model's under `name`."""
    context = engines[name].context

    def pick(body):
        if len(engines) == 1 or body.model is None or body.model == name:
            return name, engines[name]
        if body.model not in engines:
            raise ApiError(404, f"model {body.model!r} is not served here; models: {', '.join(engines)}", "model",
                           kind="model_not_found")
        return body.model, engines[body.model]

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": n, "object": "model", "owned_by": "attnlab",
                                            **({"parent": name} if n != name else {})} for n in engines]}

    def submit(engine, body, ids: list[int], prompt_param: str, stream: TokenStream):
        if len(ids) > limits.max_input_tokens:
            raise ApiError(400, f"{prompt_param} has {len(ids)} tokens; max_input_tokens is {limits.max_input_tokens}",
                           prompt_param)
        if body.max_tokens is not None and body.max_tokens > limits.max_new_tokens:
            raise ApiError(400, f"max_tokens={body.max_tokens} exceeds this server's limit of {limits.max_new_tokens}",
                           "max_tokens")
        room = context - len(ids)
        max_new = body.max_tokens if body.max_tokens is not None else min(limits.max_new_tokens, room)
        if max_new > room:
            raise ApiError(400, f"{prompt_param} of {len(ids)} tokens + max_tokens={max_new} exceeds the model's "
                                f"context of {context} tokens", "max_tokens")
        params = SamplingParams(max_new_tokens=max_new, temperature=body.temperature, top_k=body.top_k,
                                top_p=body.top_p if body.top_p < 1.0 else None,
                                repetition_penalty=body.repetition_penalty, seed=body.seed, stop=body.stops(),
                                ignore_eos=body.ignore_eos)
        try:
            return engine.add_request(ids, params, on_event=stream.on_event)
        except QueueFull as err:
            raise ApiError(429, str(err), kind="rate_limit_error")
        except ValueError as err:
            raise ApiError(400, str(err), prompt_param)

    async def run(request: Request, body, prompt: str, prompt_param: str, chat: bool, endpoint: str):
        started = time.perf_counter()
        answering, engine = pick(body)
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        if not ids:
            raise ApiError(400, f"{prompt_param} encodes to no tokens", prompt_param)
        loop = asyncio.get_running_loop()
        stream = TokenStream(tokenizer, loop, body.stops(), set(engine.eos))
        req = submit(engine, body, ids, prompt_param, stream)
        rid = ("chatcmpl-" if chat else "cmpl-") + f"{req.id:08d}{int(started * 1000) % 10 ** 8:08d}"
        created = int(time.time())
        deadline = loop.time() + limits.request_timeout
        obj = "chat.completion" if chat else "text_completion"

        async def next_token():
            return await asyncio.wait_for(stream.queue.get(), max(deadline - loop.time(), 0.001))

        def usage():
            return {"prompt_tokens": len(ids), "completion_tokens": len(req.output),
                    "total_tokens": len(ids) + len(req.output)}

        def finish_reason():
            return "stop" if stream.stopped else req.finish_reason

        def done(status: int):
            metrics.record(endpoint, status, time.perf_counter() - started)
            metrics.add_tokens("prompt", len(ids))
            metrics.add_tokens("completion", len(req.output))
            if req.first_token_at is not None:
                metrics.first_token.append(req.first_token_at - req.arrived)

        if not body.stream:
            left = asyncio.ensure_future(client_left(request))
            try:
                while True:
                    token = await next_token_or_leave(stream, left, deadline)
                    stream.push(token)
                    if token is None:
                        break
            except asyncio.TimeoutError:
                engine.cancel(req)
                raise ApiError(504, f"request timed out after {limits.request_timeout:g} s", kind="timeout")
            except ClientLeft:  # nobody is there to read the answer: stop decoding for it
                engine.cancel(req)
                done(499)
                return Response(status_code=499)
            except asyncio.CancelledError:  # the server is stopping this handler
                engine.cancel(req)
                raise
            finally:
                left.cancel()
            if req.finish_reason == "error":
                raise ApiError(500, f"generation failed: {req.error}", kind="server_error")
            done(200)
            choice = ({"index": 0, "message": {"role": "assistant", "content": stream.text},
                       "finish_reason": finish_reason()} if chat else
                      {"index": 0, "text": stream.text, "logprobs": None, "finish_reason": finish_reason()})
            return {"id": rid, "object": obj, "created": created, "model": answering, "choices": [choice],
                    "usage": usage()}

        def chunk(piece: str | None, reason: str | None = None, role: bool = False) -> dict:
            if chat:
                delta = {"role": "assistant", "content": ""} if role else ({"content": piece} if piece else {})
                c = {"index": 0, "delta": delta, "finish_reason": reason}
            else:
                c = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": reason}
            return {"id": rid, "object": obj + ".chunk" if chat else obj, "created": created, "model": answering,
                    "choices": [c]}

        async def events():
            status = 200
            try:
                if chat:
                    yield sse(chunk(None, role=True))
                while True:
                    try:
                        token = await next_token()
                    except asyncio.TimeoutError:
                        status = 504
                        yield sse({"error": {"message": f"request timed out after {limits.request_timeout:g} s",
                                             "type": "timeout", "param": None, "code": 504}})
                        break
                    piece = stream.push(token)
                    if piece:
                        yield sse(chunk(piece))
                    if token is None:
                        reason = finish_reason()
                        if reason == "error":
                            status = 500
                            yield sse({"error": {"message": f"generation failed: {req.error}", "type": "server_error",
                                                 "param": None, "code": 500}})
                        else:
                            final = chunk(None, reason)
                            final["usage"] = usage()
                            yield sse(final)
                        break
                yield "data: [DONE]\n\n"
            finally:  # also runs when the client disconnects (the response task is cancelled)
                if not req.finished:
                    engine.cancel(req)
                    status = 499 if status == 200 else status
                done(status)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest):
        return await run(request, body, body.prompt, "prompt", False, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatRequest):
        messages = [m.model_dump() for m in body.messages]
        try:
            prompt = apply_chat_template(tokenizer, messages, add_generation_prompt=True)
        except ValueError as err:
            raise ApiError(400, str(err), "messages")
        return await run(request, body, prompt, "messages", True, "/v1/chat/completions")


class ClientLeft(Exception):
    """The client closed its connection before its answer was ready."""


async def client_left(request: Request) -> None:
    """Returns when the client disconnects (the body was read already: what comes next is its disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def next_token_or_leave(stream, left: asyncio.Future, deadline: float):
    """The next token of `stream`; ClientLeft once `left` is done first, TimeoutError past `deadline`."""
    if not stream.queue.empty():
        return stream.queue.get_nowait()
    loop = asyncio.get_running_loop()
    get = asyncio.ensure_future(stream.queue.get())
    try:
        done, _ = await asyncio.wait({get, left}, timeout=max(deadline - loop.time(), 0.001),
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not get.done():
            get.cancel()
    if get in done:
        return get.result()
    if left in done:
        raise ClientLeft
    raise asyncio.TimeoutError
