"""The torch-free side of generation: the options' checks, how much of a prompt fits the context, and turning
a stream of token ids into text pieces (partial UTF-8 held back, EOS, stop strings). `generate.stream` and the torch-free
decoder (`lean.py`) both print through `text_pieces`, so they print the same text for the same tokens."""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence


def check_sampling(temperature: float, top_k: int | None, top_p: float | None, repetition_penalty: float,
                   num_beams: int, max_new_tokens: int) -> None:
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and (not isinstance(top_k, int) or top_k <= 0):
        raise ValueError(f"top_k must be a positive integer, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
    if not repetition_penalty > 0:
        raise ValueError(f"repetition_penalty must be > 0 (1.0 = none), got {repetition_penalty}")
    if not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be a positive integer, got {num_beams}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens}")


def prompt_tokens_kept(prompt: int, max_new_tokens: int, context: int, truncation: str) -> int:
    """How many of a prompt's `prompt` tokens to keep (the newest): all when prompt + max_new_tokens fits the
    context; fewer with truncation="left"; else a ValueError saying what to change."""
    if truncation not in ("error", "left"):
        raise ValueError(f"truncation must be 'error' or 'left', got {truncation!r}")
    if prompt + max_new_tokens <= context:
        return prompt
    keep = context - max_new_tokens
    if truncation == "error" or keep <= 0:
        raise ValueError(f"prompt of {prompt} tokens + max_new_tokens={max_new_tokens} exceeds the "
                         f"model's context of {context} tokens (max_position_embeddings); shorten the prompt, lower "
                         f"max_new_tokens" + (", or pass truncation='left' to drop the oldest prompt tokens"
                                              if keep > 0 else ""))
    return keep


class TextStreamer:
    """Turns tokens into text pieces as they arrive. A byte-level BPE token can hold part of a UTF-8
    character (an emoji is 4 bytes, often split over two tokens); such a piece decodes to U+FFFD, so
    text is held back until the character is complete. Decoding the whole list each time (rather than
    token by token) keeps spaces and merges exactly as a full decode would."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.sent = 0  # characters already yielded

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        text = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)
        if text.endswith("\ufffd"):
            return ""
        piece, self.sent = text[self.sent:], len(text)
        return piece

    def flush(self) -> str:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)
        piece, self.sent = text[self.sent:], len(text)
        return piece


def text_pieces(tokens: Iterable[int], tokenizer, eos: set[int], stops: Sequence[str] = ()) -> Iterator[str]:
    """Text pieces of a stream of new token ids, each yielded as soon as it decodes; the stream ends at an EOS
    id or at the first stop string (which is not yielded; text that might begin one is held back)."""
    streamer = TextStreamer(tokenizer)
    stops = [s for s in stops if s]
    pending = ""  # text that might be the start of a stop string
    for t in tokens:
        if t in eos:
            break
        pending += streamer.push(t)
        if stops:
            hits = [pending.find(s) for s in stops if s in pending]
            if hits:
                yield pending[:min(hits)]
                return
            keep = max((k for s in stops for k in range(1, len(s)) if pending.endswith(s[:k])), default=0)
            ready, pending = (pending[:-keep], pending[-keep:]) if keep else (pending, "")
        else:
            ready, pending = pending, ""
        if ready:
            yield ready
    pending += streamer.flush()
    if pending:
        yield pending
