"""Continuous batching over a paged KV cache (Yu et al. 2022, "Orca": iteration-level scheduling;
Kwon et al. 2023, vLLM): requests join and leave the running batch at every decoding step instead of
waiting for a whole static batch to finish, so a short request never waits for a long one and the batch
stays full.

Every sequence is just `tokens = prompt + output` plus a block table saying how many of them already
have keys/values in the pool; a step feeds each running sequence the tokens it has not cached yet. For a
decoding sequence that is its last sampled token; for a newly admitted one it is the whole prompt
(prefill); for one that was preempted it is everything so far (recomputed). One `step()`:

  1. drop cancelled requests (their blocks go back to the pool at once);
  2. give every running sequence room for its next token; when the pool is empty, preempt the most
     recently admitted sequence (blocks freed, sequence back at the head of the queue, recomputed later),
     which keeps the oldest requests moving;
  3. continue the prompts admitted but not yet wholly cached, then admit waiting requests (preempted
     ones first; then, with admission="shortest", the default, the shortest prompt first unless one has
     waited over `patience` seconds, which go oldest first; with "fifo", oldest first) while the batch
     has a free row, the prefill token budget (`max_prefill_tokens` per step) has
     tokens left, and the pool has blocks for the whole prompt; otherwise they stay queued (a full pool
     queues, it never fails). A prompt longer than what is left of the budget is prefilled in chunks
     over several steps (sampled once its last chunk is in), so decode rows keep flowing between long
     prompts;
  4. run the decode rows (one token each) and the prefill rows (prompts, left-padded) as two forward
     passes in the same step, since padding a 1-token row to a prompt's length would waste the work;
     the prefill pass runs its linear layers on the real prompt tokens only when the prompts' padding is
     worth skipping (unpadded, attnlab.nn.varlen; see Encoder.unpad_min_padding);
     with `compile=True` the decode pass is a compiled graph (`compiled.PagedDecoder`) of fixed shapes:
     rows rounded up to a power of two (idle rows are padding), gather width up to a multiple of 128;
     on a GGUF model kept quantized with its pool on the CPU, it is one C call for the whole layer
     stack (`block_step.PagedBlockSteps`: a step of 1 / 64 rows of SmolLM2 ~4x / ~1.3x faster than the
     modules' step, whose Python dispatch is most of a step at a few rows);
  5. sample each row with its own settings, append, and finish rows on EOS / stop string / length.

When a forward pass (or sampling) raises, only the requests of that pass fail: each is finished with
`finish_reason="error"` and the exception as its `error`, its blocks go back to the pool, and the other
pass of the step and every later step run as usual (a request's K/V lives in its own blocks, so nothing
of the failed pass is read again). `stats["failed_steps"]` / `["failed_requests"]` count them and the
exception is logged with its traceback. Anything else that raises inside a step in the background loop
(scheduling, bookkeeping: the engine's own state is then in doubt) fails every request it holds, running
or queued, the same way, and the loop goes on with the requests that come next; a client callback that
raises is logged and ignored. So no request waits forever on a step that died.

    >>> engine = Engine(model, num_blocks=64)
    >>> outs = engine.generate([[1, 2, 3], [4, 5]], SamplingParams(max_new_tokens=8))
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .paged import BlockPool, BlockTable, PagedBatchCache
from .sampling import apply_repetition_penalty, top_k_filter, top_p_filter


log = logging.getLogger(__name__)

MIN_TEMPERATURE = 1e-5  # smaller temperatures decode greedily (the limit of sampling as temperature -> 0)
MIN_ROWS = 8  # the smallest compiled decode batch (see Engine._decode_rows)
PAD_WASTE = 1.25  # a prefill batch computes at most this many padded tokens per real one (see prefill_groups)
PAD_SLACK = 64    # ... or this many padded tokens in all: a forward's fixed cost (reading every weight) is more
ADMISSIONS = ("shortest", "fifo")


class QueueFull(RuntimeError):
    """The waiting queue is at its limit; the caller should retry later (HTTP 429)."""


@dataclass
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 0.0           # 0 = greedy
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: Sequence[str] = ()           # stop strings (need the engine's tokenizer)
    eos_token_ids: Sequence[int] | None = None  # None: the model's eos_token_id
    ignore_eos: bool = False


@dataclass
class Request:
    id: int
    prompt: list[int]
    params: SamplingParams
    output: list[int] = field(default_factory=list)
    finish_reason: str | None = None   # "stop" | "length" | "cancelled" | "error"
    error: str | None = None
    table: BlockTable = field(default_factory=BlockTable)
    on_event: Callable[["Request", int | None], None] | None = None  # (request, new token or None at the end)
    arrived: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    preemptions: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    generator: torch.Generator | None = None
    chunk: int = 0                     # tokens this step's prefill pass feeds it (set by the scheduler)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def _chunk(req: Request, budget: int) -> int:
    """Prompt tokens to prefill this step: all that are left, or the budget's worth, never leaving exactly
    one behind (a row with one uncached token is a decode row)."""
    left = len(req.tokens) - req.table.length
    n = min(left, budget)
    return n - 1 if left - n == 1 and n > 1 else n


def prefill_groups(chunks: Sequence[int], waste: float = PAD_WASTE, slack: int = PAD_SLACK) -> list[list[int]]:
    """Row indices split into prefill batches of similar length. A batch pads every row to its longest, so
    prompts of 30 and 400 tokens in one batch compute 800 positions for 430; on a mix of chat prompts
    (20-400 tokens) one batch per step computed 2.4x the real prompt tokens. Rows are taken longest first
    and a batch grows while its padded size stays within `waste` x its real tokens, or within `slack`
    padded tokens of them (short prompts then share one forward)."""
    order = sorted(range(len(chunks)), key=lambda i: -chunks[i])
    groups: list[list[int]] = []
    for i in order:
        g = groups[-1] if groups else None
        real = sum(chunks[j] for j in g) + chunks[i] if g else 0
        if g is not None and chunks[g[0]] * (len(g) + 1) <= max(waste * real, real + slack):
            g.append(i)
        else:
            groups.append([i])
    return groups


class Engine:
    def __init__(self, model, tokenizer=None, *, num_blocks: int = 256, block_size: int = 16,
                 max_batch: int = 32, max_waiting: int = 256, max_prefill_tokens: int = 2048,
                 compile: bool | dict = False, kv_dtype: torch.dtype | None = None,
                 admission: str = "shortest", patience: float = 10.0) -> None:
        """admission: which waiting request a free row takes. "shortest" (default): the shortest prompt,
        so that a burst of requests gets most of its first tokens after the short prompts' prefill rather
        than behind whichever long prompts came first (shortest job first minimises the mean wait); a
        request that has waited more than `patience` seconds goes before any shorter one, oldest first, so
        long prompts are never starved. "fifo": arrival order.
        compile: run decode steps through torch.compile (True, or a dict of `PagedDecoder` options such as
        autotune=False). Each new (rows, width) bucket compiles for minutes on first use; see `warmup`.
        kv_dtype: the KV pool's dtype (default the model's; torch.float16 halves it, see BlockPool.for_model)."""
        if compile and kv_dtype not in (None, next(model.parameters()).dtype):
            raise ValueError("a compiled decode step keeps the KV pool in the model's dtype: drop kv_dtype or compile")
        if not getattr(model.config, "causal", False) or not hasattr(model, "lm_head"):
            raise ValueError("the engine needs a causal LM (a decoder with an LM head)")
        self.model = model.eval()
        self.decoder = None
        if compile:
            from .compiled import PagedDecoder
            self.decoder = PagedDecoder(model, **(compile if isinstance(compile, dict) else {}))
        self.tokenizer = tokenizer
        self.pool = BlockPool.for_model(model, num_blocks, block_size, kv_dtype)
        # a model whose every layer attends within a sliding window (Mistral) keeps only each sequence's
        # recent blocks (paged.BlockPool.trim); one with global layers too keeps everything
        backbone, cfg = model.backbone, model.config
        local = cfg.sliding_window and all(backbone._is_local(i) for i in range(cfg.num_layers))
        self.window = cfg.sliding_window if local else None
        # a GGUF model kept quantized, its pool on the CPU: decoding steps as one C call (block_step.py)
        from .block_step import PagedBlockSteps
        self.block_steps = PagedBlockSteps(model, self.pool) if (
            self.decoder is None and PagedBlockSteps.usable(model, self.pool, self.window)) else None
        if max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be at least 1, got {max_prefill_tokens}")
        self.max_batch, self.max_waiting, self.max_prefill_tokens = max_batch, max_waiting, max_prefill_tokens
        if admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {', '.join(ADMISSIONS)}, got {admission!r}")
        if not patience >= 0:
            raise ValueError(f"patience must be a number of seconds >= 0, got {patience}")
        self.admission, self.patience = admission, patience
        self.context = model.config.max_position_embeddings
        eos = model.config.eos_token_id
        self.eos = [] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]
        self.pad = model.config.pad_token_id or 0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._cancel: set[int] = set()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.forward_lock = threading.Lock()  # taken by whoever else runs the model (the server's /viz)
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._stop = False
        self.stats = dict(requests=0, finished=0, prompt_tokens=0, generated_tokens=0, steps=0, preemptions=0, cancelled=0,
                          failed_steps=0, failed_requests=0)
        self.last_error: str | None = None  # the most recent failure, "ExceptionType: message"

    # ------------------------------------------------------------------ requests in and out
    def check(self, prompt_len: int, params: SamplingParams) -> None:
        """Reject at once what could never run (instead of queueing it forever)."""
        if prompt_len < 1:
            raise ValueError("prompt must have at least one token")
        if not isinstance(params.max_new_tokens, int) or params.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {params.max_new_tokens}")
        total = prompt_len + params.max_new_tokens
        if total > self.context:
            raise ValueError(f"prompt of {prompt_len} tokens + max_new_tokens={params.max_new_tokens} exceeds the "
                             f"model's context of {self.context} tokens")
        if self.pool.blocks_for(total) > self.pool.capacity_blocks:
            raise ValueError(f"prompt + max_new_tokens = {total} tokens does not fit the KV pool "
                             f"({self.pool.capacity_blocks * self.pool.block_size} tokens)")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need the engine's tokenizer")

    def add_request(self, prompt: Sequence[int], params: SamplingParams | None = None,
                    on_event: Callable | None = None) -> Request:
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt]
        self.check(len(prompt), params)
        req = Request(next(self._ids), prompt, params, on_event=on_event)
        if params.temperature >= MIN_TEMPERATURE:
            seed = params.seed if params.seed is not None else torch.seed()
            req.generator = torch.Generator().manual_seed(seed % 2 ** 64)  # any int (a client's) is a valid seed
        with self._wake:
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull(f"{len(self.waiting)} requests already queued (max {self.max_waiting})")
            self.waiting.append(req)
            self.stats["requests"] += 1
            self._wake.notify()
        return req

    def cancel(self, request: Request | int) -> None:
        """Stop a request (a client went away); its blocks are freed at the start of the next step."""
        with self._wake:
            self._cancel.add(request if isinstance(request, int) else request.id)
            self._wake.notify()

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._cancel)

    def _finish(self, req: Request, reason: str, error: str | None = None) -> None:
        req.finish_reason, req.error = reason, error
        self.pool.free(req.table)
        self.stats["finished"] += 1
        self._notify(req, None)
        req.done.set()

    @staticmethod
    def _notify(req: Request, token: int | None) -> None:
        """Tell the request's owner; its callback failing (e.g. the server's event loop has closed) must not
        stop the engine for everyone else."""
        if req.on_event is None:
            return
        try:
            req.on_event(req, token)
        except Exception:  # noqa: BLE001 - one client's problem, logged
            log.exception("request %d: its on_event callback raised; ignored", req.id)

    def _fail(self, reqs: list[Request], err: BaseException) -> None:
        """Finish `reqs` as failed by `err`, freeing their blocks (see the module docstring)."""
        reason = f"{type(err).__name__}: {err}"
        reqs = [r for r in reqs if not r.finished]  # one that ended in this step before the error keeps its end
        log.error("engine step failed for %d request(s): %s", len(reqs), reason, exc_info=err)
        self.stats["failed_steps"] += 1
        self.stats["failed_requests"] += len(reqs)
        self.last_error = reason
        for r in reqs:
            if r in self.running:
                self.running.remove(r)
            self._finish(r, "error", reason)

    # ------------------------------------------------------------------ scheduling
    def _drop_cancelled(self) -> None:
        with self._lock:
            cancel, self._cancel = self._cancel, set()
            dropped = [r for r in self.waiting if r.id in cancel]
            for r in dropped:
                self.waiting.remove(r)
        dropped += [r for r in self.running if r.id in cancel]
        self.running = [r for r in self.running if r.id not in cancel]
        for r in dropped:
            self.stats["cancelled"] += 1
            self._finish(r, "cancelled")

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.pool.free(req.table)
        req.preemptions += 1
        self.stats["preemptions"] += 1
        with self._lock:
            self.waiting.appendleft(req)

    def _schedule(self) -> tuple[list[Request], list[Request]]:
        decode: list[Request] = []
        partial: list[Request] = []  # admitted, prompt not wholly cached: blocks for all of it already held
        for req in list(self.running):
            if req not in self.running:
                continue  # preempted below to make room for an older one
            if len(req.tokens) - req.table.length > 1:
                partial.append(req)
                continue
            while not self.pool.ensure(req.table, req.table.length + 1):
                self._preempt(self.running[-1])
                if req not in self.running:
                    break
            else:
                decode.append(req)
        prefill: list[Request] = []
        budget = self.max_prefill_tokens
        for req in partial:
            if req in self.running and budget > 0:
                req.chunk = _chunk(req, budget)
                prefill.append(req)
                budget -= req.chunk
        admitted: list[Request] = []
        with self._lock:
            while self.waiting and budget > 0 and len(self.running) + len(admitted) < self.max_batch:
                req = self._next_waiting()
                n = len(req.tokens)
                if not self.pool.ensure(req.table, n):
                    break  # the pool is full: it waits for blocks to come back
                self.waiting.remove(req)
                req.chunk = _chunk(req, budget)
                admitted.append(req)
                budget -= req.chunk
        self.running += admitted
        return decode, prefill + admitted

    def _next_waiting(self) -> Request:
        """The waiting request to admit next (see `admission`). Preempted requests sit at the queue's head
        and go first: they had been running, and their clients are mid-stream."""
        head = self.waiting[0]
        if self.admission == "fifo" or head.preemptions:
            return head
        overdue = time.perf_counter() - self.patience
        return min(self.waiting, key=lambda r: (0, r.arrived, 0) if r.arrived < overdue
                   else (1, len(r.tokens), r.arrived))

    # ------------------------------------------------------------------ one iteration
    @torch.inference_mode()
    def _forward(self, reqs: list[Request], new: list[int] | None = None) -> torch.Tensor:
        """Logits after each row's `new` uncached tokens (default: all of them)."""
        new = new or [len(r.tokens) - r.table.length for r in reqs]
        cache = PagedBatchCache(self.pool, [r.table for r in reqs], new, window=self.window)
        ids = torch.full((len(reqs), cache.t), self.pad, dtype=torch.long)
        for i, (r, n) in enumerate(zip(reqs, new)):
            ids[i, cache.t - n:] = torch.tensor(r.tokens[r.table.length:r.table.length + n])
        with self.forward_lock:
            out = self.model(ids.to(cache.attention_mask.device), attention_mask=cache.attention_mask,
                             position_ids=cache.position_ids, past_key_values=cache, use_cache=True,
                             logits_to_keep=1)
        cache.commit()
        return out.logits[:, -1].float()

    @torch.inference_mode()
    def _block_decode(self, reqs: list[Request]) -> torch.Tensor:
        """One new token for each decode row through `PagedBlockSteps` (one C call for the layer stack)."""
        with self.forward_lock:
            logits = self.block_steps([r.table for r in reqs], [r.tokens[-1] for r in reqs])
        for r in reqs:
            r.table.length += 1
        return logits

    def _prefill(self, group: list[Request]) -> torch.Tensor:
        """Each row's chunk through the model, in batches of similar length (`prefill_groups`); logits in
        the group's order."""
        chunks = [r.chunk for r in group]
        parts = prefill_groups(chunks)
        if len(parts) == 1:
            return self._forward(group, chunks)
        logits: list[torch.Tensor | None] = [None] * len(group)
        for part in parts:
            out = self._forward([group[i] for i in part], [chunks[i] for i in part])
            for row, i in enumerate(part):
                logits[i] = out[row]
        return torch.stack(logits)

    @torch.inference_mode()
    def _decode_compiled(self, reqs: list[Request]) -> torch.Tensor:
        """One new token for each decode row through the compiled step (see `PagedDecoder`)."""
        from .compiled import capacity_bucket
        rows, bs, pool = self._decode_rows(len(reqs)), self.pool.block_size, self.pool
        totals = [r.table.length + 1 for r in reqs]
        # a row gathers the keys its new token may see: all of them, or the last `window` (Mistral)
        firsts = [max(r.table.first_held(bs), t - self.window if self.window else 0) for r, t in zip(reqs, totals)]
        width = capacity_bucket(max(t - f for t, f in zip(totals, firsts)), pool.capacity_blocks * bs)
        token = torch.full((rows, 1), self.pad, dtype=torch.long)
        position = torch.zeros(rows, 1, dtype=torch.long)
        write = torch.zeros(rows, dtype=torch.long)  # idle rows write to and read the scratch slot 0
        read = torch.zeros(rows, width, dtype=torch.long)
        allowed = torch.zeros(rows, 1, 1, width, dtype=torch.bool)
        allowed[:, 0, 0, 0] = True  # an idle row attends to one (scratch) column: no empty softmax
        for i, (r, total, first) in enumerate(zip(reqs, totals, firsts)):
            slots = r.table.slots(first, total, bs)
            token[i, 0], position[i, 0], write[i] = r.tokens[-1], total - 1, slots[-1]
            read[i, :len(slots)] = torch.tensor(slots)
            allowed[i, 0, 0, :len(slots)] = True
        device = pool.keys[0].device
        with self.forward_lock:
            logits = self.decoder.step(self.model, token.to(device), position.to(device), allowed.to(device),
                                       write.to(device), read.flatten().to(device), pool.keys, pool.values)
        for r in reqs:
            r.table.length += 1
            pool.trim(r.table, self.window)
        return logits[:len(reqs)].float()

    def _decode_rows(self, n: int) -> int:
        """Rows of the compiled decode step for n running sequences: a power of two from MIN_ROWS up to
        max_batch, so a few graphs serve every batch size and a half-empty batch does not pay for a full one."""
        rows = MIN_ROWS
        while rows < n:
            rows *= 2
        return min(rows, self.max_batch)

    def warmup(self, max_tokens: int | None = None) -> None:
        """Compile the decode step now, for every row bucket and every gather-width bucket up to
        `max_tokens` (default: the first width bucket), so that no request waits minutes for a compile
        later. No-op without compile."""
        from .compiled import CAPACITY_STEP
        if self.decoder is None:
            return
        limit = min(max_tokens or CAPACITY_STEP, self.context, self.pool.capacity_blocks * self.pool.block_size,
                    self.window or self.context)  # a sliding-window row never gathers more than the window
        buckets = sorted({self._decode_rows(n) for n in range(1, self.max_batch + 1)})
        for total in sorted({min(t, limit) for t in range(CAPACITY_STEP, limit + CAPACITY_STEP, CAPACITY_STEP)}):
            probe = Request(-1, [self.pad] * (total - 1), SamplingParams(max_new_tokens=1))
            if not self.pool.ensure(probe.table, total):
                raise ValueError(f"warmup: the KV pool has no room for a {total}-token probe sequence")
            try:
                for rows in buckets:  # every row is the same probe: only the shapes matter here
                    probe.table.length = total - 1
                    self._decode_compiled([probe] * rows)
            finally:
                self.pool.free(probe.table)

    def _sample(self, reqs: list[Request], logits: torch.Tensor) -> list[int]:
        tokens = logits.argmax(-1).tolist()
        for i, r in enumerate(reqs):
            p = r.params
            sample = p.temperature >= MIN_TEMPERATURE  # below it (e.g. 5e-324 = 0 in float32): greedy
            if not sample and p.repetition_penalty == 1.0:
                continue
            row = logits[i:i + 1]
            if p.repetition_penalty != 1.0:
                row = apply_repetition_penalty(row, torch.tensor([r.tokens]), p.repetition_penalty)
            if sample:
                # best logit at 0 first: dividing by a tiny temperature then gives -inf, never inf - inf = nan
                row = torch.nan_to_num(row, nan=float("-inf"), posinf=torch.finfo(row.dtype).max)
                row = (row - row.max(-1, keepdim=True).values) / p.temperature
                if p.top_k is not None:
                    row = top_k_filter(row, p.top_k)
                if p.top_p is not None:
                    row = top_p_filter(row, p.top_p)
                tokens[i] = int(torch.multinomial(row.softmax(-1), 1, generator=r.generator))
            else:
                tokens[i] = int(row.argmax(-1))
        return tokens

    def _append(self, req: Request, token: int) -> None:
        req.output.append(token)
        self.stats["generated_tokens"] += 1
        if req.first_token_at is None:
            req.first_token_at = time.perf_counter()
        self._notify(req, token)
        p = req.params
        eos = self.eos if p.eos_token_ids is None else list(p.eos_token_ids)
        if not p.ignore_eos and token in eos:
            self._finish(req, "stop")
        elif p.stop and self._stop_hit(req):
            self._finish(req, "stop")
        elif len(req.output) >= p.max_new_tokens or len(req.tokens) >= self.context:
            self._finish(req, "length")

    def _stop_hit(self, req: Request) -> bool:
        window = max(len(s) for s in req.params.stop) + 8  # a token is at least one character
        text = self.tokenizer.decode(req.output[-window:], skip_special_tokens=False)
        return any(s and s in text for s in req.params.stop)

    def step(self) -> int:
        """One scheduling iteration; returns how many tokens it generated."""
        self._drop_cancelled()
        decode, prefill = self._schedule()
        produced = 0
        for group in (decode, prefill):
            if not group:
                continue
            if group is prefill:
                self.stats["prompt_tokens"] += sum(r.chunk for r in group if not r.preemptions)
            try:
                if group is decode and self.decoder is not None:
                    ready, tokens = group, self._sample(group, self._decode_compiled(group))
                elif group is decode and self.block_steps is not None and self.block_steps.runs_now():
                    ready, tokens = group, self._sample(group, self._block_decode(group))
                elif group is decode:
                    ready, tokens = group, self._sample(group, self._forward(group))
                else:  # a row whose prompt still has chunks to go samples nothing yet
                    logits = self._prefill(group)
                    rows = [i for i, r in enumerate(group) if r.table.length == len(r.tokens)]
                    ready = [group[i] for i in rows]
                    tokens = self._sample(ready, logits[rows]) if rows else []
            except Exception as err:  # a failing batch must not take the other requests' server down
                self._fail(group, err)
                continue
            for r, t in zip(ready, tokens):
                self._append(r, t)
                produced += 1
        self.running = [r for r in self.running if not r.finished]
        self.stats["steps"] += 1
        return produced

    # ------------------------------------------------------------------ driving it
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams] | None = None
                 ) -> list[list[int]]:
        """Run prompts to completion in this thread (all admitted as the batch allows); outputs in order."""
        many = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        reqs = [self.add_request(p, sp) for p, sp in zip(prompts, many)]
        while not all(r.finished for r in reqs):
            self.step()
        return [r.output for r in reqs]

    def start(self) -> "Engine":
        """Run the scheduling loop in a background thread (the server's mode)."""
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._loop, name="attnlab-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stop and not self.has_work:
                    self._wake.wait()
                if self._stop:
                    return
            try:
                self.step()
            except Exception as err:  # noqa: BLE001 - outside a forward pass (scheduling, bookkeeping)
                with self._lock:
                    held, self.waiting = list(self.running) + list(self.waiting), deque()
                self._fail(held, err)
                self.running = []
