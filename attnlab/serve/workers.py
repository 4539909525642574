"""What runs the model behind the HTTP handlers, off the event loop:

- `EncoderWorker`: one thread that takes every queued embedding/classification job at once and runs
  them as one length-sorted batch (dynamic batching: 64 clients sending one sentence each cost a few
  batched forward passes, not 64 single-sentence ones).
- `TokenStream`: the bridge from the decoding engine's thread to an asyncio handler: tokens arrive in
  an asyncio queue, and are turned into text pieces that never split a UTF-8 character and never
  show a stop string (text that might start one is held back until it is clearly not one), at a cost
  per token that grows with neither the output nor the stop strings (text.py).
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from ..inference.embed import embed
from ..inference.engine import QueueFull
from .text import IncrementalDecoder, StopMatcher


@dataclass
class Job:
    kind: str                  # "embed" | "classify"
    texts: list[str]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    cancelled: bool = False
    extra: dict = field(default_factory=dict)


class EncoderWorker:
    def __init__(self, model, tokenizer, *, max_queued: int = 256, max_batch_texts: int = 256,
                 max_length: int | None = None, lock: threading.Lock | None = None) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_queued, self.max_batch_texts, self.max_length = max_queued, max_batch_texts, max_length
        self.jobs: deque[Job] = deque()
        # held around every forward pass; also by /viz (which hooks the same model) and, when `lock` is a
        # decoding engine's forward_lock, by the engine's passes
        self.lock = lock or threading.Lock()
        self._wake = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.start()

    def start(self) -> "EncoderWorker":
        """Run the batching loop in a background thread (again after `stop`, e.g. a second server lifespan)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop = False
            self._thread = threading.Thread(target=self._loop, name="attnlab-encoder", daemon=True)
            self._thread.start()
        return self

    @property
    def queue_depth(self) -> int:
        return len(self.jobs)

    def submit(self, kind: str, texts: list[str]) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        job = Job(kind, texts, loop, loop.create_future())
        with self._wake:
            if len(self.jobs) >= self.max_queued:
                raise QueueFull(f"{len(self.jobs)} requests already queued (max {self.max_queued})")
            self.jobs.append(job)
            self._wake.notify()
        job.future.add_done_callback(lambda f: setattr(job, "cancelled", f.cancelled()))
        return job.future

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
                while not self._stop and not self.jobs:
                    self._wake.wait()
                if self._stop:
                    return
                batch, n = [], 0
                while self.jobs and (not batch or n + len(self.jobs[0].texts) <= self.max_batch_texts):
                    job = self.jobs.popleft()
                    if not job.cancelled:  # a timed-out client's work is skipped
                        batch.append(job)
                        n += len(job.texts)
            for kind in ("embed", "classify"):
                jobs = [j for j in batch if j.kind == kind]
                if jobs:
                    self._run(kind, jobs)

    def _run(self, kind: str, jobs: list[Job]) -> None:
        texts = [t for j in jobs for t in j.texts]
        try:
            with self.lock:
                out = embed(self.model, self.tokenizer, texts, progress=False, max_length=self.max_length) \
                    if kind == "embed" else self._classify(texts)
        except Exception as err:  # noqa: BLE001 - reported to every waiting client
            for j in jobs:
                _deliver(j, None, err)
            return
        start = 0
        for j in jobs:
            _deliver(j, out[start:start + len(j.texts)], None)
            start += len(j.texts)

    @torch.inference_mode()
    def _classify(self, texts: list[str]) -> np.ndarray:
        """Class probabilities, (len(texts), num_labels), in input order (batches sorted by length)."""
        from ..inference.embed import pad_batch
        enc = self.tokenizer(texts, max_length=self.max_length or self.model.config.max_position_embeddings,
                             truncation=True)
        ids = enc["input_ids"]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = np.zeros((len(ids), self.model.config.extra.get("num_labels") or 2), dtype=np.float32)
        for s in range(0, len(order), 32):
            idx = order[s:s + 32]
            input_ids, mask = pad_batch([ids[i] for i in idx], self.model.config.pad_token_id or 0)
            probs = self.model(input_ids=input_ids, attention_mask=mask).logits.float().softmax(-1)
            if probs.size(-1) != out.shape[1]:
                out = np.zeros((len(ids), probs.size(-1)), dtype=np.float32)
            out[idx] = probs.numpy()
        return out


def _deliver(job: Job, value, error) -> None:
    """Hand a result to the job's event loop; a loop that has closed (its client is gone) is skipped, so the
    worker thread never dies of it."""
    try:
        job.loop.call_soon_threadsafe(_set, job.future, value, error)
    except RuntimeError:
        pass


def _set(future: asyncio.Future, value, error) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


class TokenStream:
    """Engine tokens → text pieces for one request, consumed by an asyncio handler. Each token's work is
    proportional to its own text (see text.py): it runs on the event loop that answers every client."""

    def __init__(self, tokenizer, loop: asyncio.AbstractEventLoop, stops: list[str], skip_ids: set[int]) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.loop = loop
        self.decoder = IncrementalDecoder(tokenizer)
        self.stops, self.skip = stops, skip_ids
        self.matcher = StopMatcher(stops)
        self.pending = ""  # text that may still be the start of a stop string: at most max(len(stop)) - 1 chars
        self.text = ""
        self.stopped = False

    def on_event(self, request, token) -> None:  # engine thread
        self.loop.call_soon_threadsafe(self.queue.put_nowait, token)

    def push(self, token: int | None) -> str:
        """The text that may be shown now (None = the request ended: flush)."""
        if self.stopped:
            return ""
        if token is None:
            piece = self.pending + self.decoder.flush()
            self.pending = ""
        else:
            if token in self.skip:
                return ""
            new = self.decoder.push(token)
            self.pending += new
            hit = self.matcher.feed(new) if self.matcher.stops else None
            if hit is not None:  # a stop string: show what came before it, nothing after
                piece, self.pending, self.stopped = self.pending[:len(self.pending) - len(new) + hit], "", True
            else:
                keep = self.matcher.held
                piece, self.pending = (self.pending[:-keep], self.pending[-keep:]) if keep else (self.pending, "")
        self.text += piece
        return piece
