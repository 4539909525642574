"""A decoder's next-token views: the distribution after a text (/api/next), the same logits reshaped by
temperature / top-k / top-p without running the model (/api/reshape), one step that appends a token and
grows the KV cache (/api/step), and the greedy and sampled continuations side by side (/api/paths).

The model runs through the step objects `attnlab generate` decodes with (inference/generate.py): a GGUF
kept quantized takes its one-C-call-per-token step (`BlockSteps`), anything else the eager step over a
`KVCache`. So the distribution shown is the one generation draws from, quantized weights included, and
the greedy token is generate's.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import torch

from ..inference.generate import _block_steps_apply, _EagerSteps
from ..inference.sampling import top_k_filter, top_p_filter
from .session import ExploreError, Explorer, rounded

MAX_SESSIONS = 4  # each holds a KV cache sized for --max-tokens
MAX_TOP = 200
MAX_PATH = 64


@dataclass
class Shape:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def check(self) -> "Shape":
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ExploreError(422, f"temperature: must be >= 0 (0 = greedy), got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ExploreError(422, f"top_k: must be an integer >= 0 (0 = off), got {self.top_k}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ExploreError(422, f"top_p: must lie in (0, 1], got {self.top_p}")
        return self

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """What sampling draws from: generate's processing (temperature, then top-k, then top-p);
        temperature 0 puts all the mass on the argmax."""
        if self.temperature == 0:
            out = torch.zeros_like(logits)
            out[logits.argmax()] = 1.0
            return out
        x = logits / self.temperature
        if self.top_k:
            x = top_k_filter(x[None], self.top_k)[0]
        if self.top_p < 1:
            x = top_p_filter(x[None], self.top_p)[0]
        return x.softmax(-1)


@dataclass
class Session:
    id: str
    ids: list[int]
    steps: object          # BlockSteps or _EagerSteps: next-token logits per call, KV cache in .cache
    logits: torch.Tensor   # (V,) fp32, after the last token


def _steps(model, max_length: int):
    if _block_steps_apply(model):
        from ..inference.block_step import BlockSteps
        return BlockSteps(model, max_length)
    return _EagerSteps(model, None, max_length)


def _need_decoder(ex: Explorer) -> None:
    if ex.kind != "decoder":
        raise ExploreError(400, f"{ex.name} is an {ex.kind}: next-token views need a decoder (a causal LM)")


def _check_top(top: int) -> int:
    if not isinstance(top, int) or not 1 <= top <= MAX_TOP:
        raise ExploreError(422, f"top: must be an integer in 1..{MAX_TOP}, got {top}")
    return top


def kv_info(steps) -> dict:
    """Tokens in the cache and the bytes its keys and values hold (the tokens kept, not the preallocated
    room: a sliding-window layer keeps only its window)."""
    cache = steps.cache
    per_layer = []
    for i in range(getattr(cache, "num_layers", 0)):
        keys = getattr(cache, "keys", [None])[i]
        if keys is None:
            per_layer.append(0)
            continue
        kept = keys.size(2) if cache.windows[i] is not None else cache.lengths[i]
        per_layer.append(2 * keys.size(0) * keys.size(1) * kept * keys.size(3) * keys.element_size())
    tokens = cache.get_seq_length() if hasattr(cache, "get_seq_length") else 0
    return {"tokens": int(tokens), "bytes": int(sum(per_layer)), "bytes_per_layer": per_layer}


def top_list(ex: Explorer, logits: torch.Tensor, shape: Shape, top: int) -> list[dict]:
    probs = logits.softmax(-1)
    shaped = shape.probs(logits)
    values, ids = torch.topk(probs, min(top, probs.numel()))
    return [{"id": int(i), "piece": ex.piece(int(i)), "logit": rounded(logits[i]), "prob": rounded(p),
             "shaped_prob": rounded(shaped[i])} for p, i in zip(values, ids)]


def _answer(ex: Explorer, s: Session, shape: Shape, top: int, ms: float) -> dict:
    greedy = int(s.logits.argmax())
    return {"session": s.id, "tokens": ex.token_list(s.ids), "top": top_list(ex, s.logits, shape, top),
            "greedy": {"id": greedy, "piece": ex.piece(greedy)}, "kv_cache": kv_info(s.steps),
            "ms": round(ms, 3)}


def _prompt(ex: Explorer, text: str) -> list[int]:
    ids, _ = ex.encode(text)
    ids = ids[0].tolist()
    ex.check_length(len(ids))
    return ids


def next_token(ex: Explorer, text: str, shape: Shape, top: int = 20) -> dict:
    _need_decoder(ex)
    shape.check()
    _check_top(top)
    ids = _prompt(ex, text)
    with ex.lock, torch.inference_mode():
        start = time.perf_counter()
        steps = _steps(ex.model, ex.max_tokens)
        logits = steps(torch.tensor([ids]))[0].float()
        ms = (time.perf_counter() - start) * 1e3
        s = Session(uuid.uuid4().hex[:12], ids, steps, logits)
        ex.sessions[s.id] = s
        while len(ex.sessions) > MAX_SESSIONS:
            ex.sessions.popitem(last=False)
    return _answer(ex, s, shape, top, ms)


def _session(ex: Explorer, session_id: str) -> Session:
    s = ex.sessions.get(session_id)
    if s is None:
        raise ExploreError(404, f"session: no session {session_id!r} (the last {MAX_SESSIONS} are kept; "
                                "POST /api/next again)")
    ex.sessions.move_to_end(session_id)
    return s


def reshape(ex: Explorer, session_id: str, shape: Shape, top: int = 20) -> dict:
    """The kept logits under new sampling settings: no model call."""
    shape.check()
    _check_top(top)
    with ex.lock:
        s = _session(ex, session_id)
        start = time.perf_counter()
        out = {"session": s.id, "top": top_list(ex, s.logits, shape, top)}
    out["ms"] = round((time.perf_counter() - start) * 1e3, 3)
    return out


def step(ex: Explorer, session_id: str, token: int | None, shape: Shape, seed: int = 0, top: int = 20) -> dict:
    """Append `token` (None: draw one from the shaped distribution with `seed`) and run it through the
    model with the KV cache: one token's keys and values are added per layer."""
    shape.check()
    _check_top(top)
    with ex.lock, torch.inference_mode():
        s = _session(ex, session_id)
        vocab = s.logits.numel()
        if token is None:
            token = _draw(shape.probs(s.logits), shape, seed)
        elif not isinstance(token, int) or not 0 <= token < vocab:
            raise ExploreError(422, f"token: {token} is not a token id in 0..{vocab - 1}")
        if len(s.ids) + 1 > ex.max_tokens:
            raise ExploreError(413, f"session: {len(s.ids) + 1} tokens would exceed the limit of "
                                    f"{ex.max_tokens} (--max-tokens)")
        start = time.perf_counter()
        s.logits = s.steps(torch.tensor([[token]]))[0].float()
        s.ids.append(int(token))
        ms = (time.perf_counter() - start) * 1e3
        out = _answer(ex, s, shape, top, ms)
    out["appended"] = {"id": int(token), "piece": ex.piece(int(token))}
    return out


def _draw(probs: torch.Tensor, shape: Shape, seed: int, generator: torch.Generator | None = None) -> int:
    if shape.temperature == 0:
        return int(probs.argmax())
    if generator is None:
        if not isinstance(seed, int):
            raise ExploreError(422, f"seed: must be an integer, got {seed!r}")
        generator = torch.Generator().manual_seed(seed)
    return int(torch.multinomial(probs, 1, generator=generator))


def paths(ex: Explorer, text: str, steps: int, shape: Shape, seed: int = 0) -> dict:
    """The greedy continuation (what generate(temperature=0) writes) and one sampled with `seed` (what
    generate(temperature, top_k, top_p, seed) writes: one generator drawn from step after step). Each
    token with the probability the model gave it. Both stop after an end-of-sequence token."""
    _need_decoder(ex)
    shape.check()
    if not isinstance(steps, int) or not 1 <= steps <= MAX_PATH:
        raise ExploreError(422, f"steps: must be an integer in 1..{MAX_PATH}, got {steps}")
    if not isinstance(seed, int):
        raise ExploreError(422, f"seed: must be an integer, got {seed!r}")
    ids = _prompt(ex, text)
    if len(ids) + steps > ex.max_tokens:
        raise ExploreError(413, f"text: {len(ids)} tokens + {steps} steps exceed the limit of "
                                f"{ex.max_tokens} (--max-tokens)")
    eos = ex.config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    out = {}
    for name, how in (("greedy", Shape(0.0)), ("sampled", shape)):
        generator = torch.Generator().manual_seed(seed)
        with ex.lock, torch.inference_mode():
            run = _steps(ex.model, len(ids) + steps)
            logits, path = run(torch.tensor([ids]))[0].float(), []
            for i in range(steps):
                token = _draw(how.probs(logits), how, seed, generator)
                path.append({"id": token, "piece": ex.piece(token), "prob": rounded(logits.softmax(-1)[token])})
                if token in eos or i == steps - 1:
                    break
                logits = run(torch.tensor([[token]]))[0].float()
        out[name] = path
    return out
