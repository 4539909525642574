"""Text generation for causal LMs: greedy, sampling (temperature, top-k, top-p), repetition penalty,
EOS and stop strings, beam search, and a streaming iterator that yields text as it is decoded.

Decoding is autoregressive: run the prompt once (prefill), then feed one token per step while the
KV cache (`kv_cache.py`) keeps every earlier key/value, so step t attends over t cached positions.

    >>> ids = generate(model, tok("The cat", return_tensors="pt")["input_ids"], max_new_tokens=8)
    >>> for piece in stream(model, tok, "The cat", max_new_tokens=8): print(piece, end="")

Batches are left-padded (`encode_prompts`), so that every row's newest token sits in the last column;
positions come from the attention mask, so padding never shifts a row's positions.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import torch

from ..nn.linear_attention import LinearAttentionCache
from .beam import beam_search
from .kv_cache import KVCache
# the logits processors are part of this module's public surface too
from .text_stream import TextStreamer, prompt_tokens_kept, text_pieces  # noqa: F401  (TextStreamer re-exported)
from .sampling import NEG, apply_repetition_penalty, check_sampling, top_k_filter, top_p_filter  # noqa: F401

# ----------------------------------------------------------------------------------- prompts
def encode_prompts(tokenizer, prompts: str | Sequence[str], pad_token_id: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenize prompts (no special tokens added: chat templates carry their own) and left-pad them."""
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    rows = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    if any(not r for r in rows):
        raise ValueError("a prompt encodes to no tokens; generation needs at least one")
    width = max(len(r) for r in rows)
    pad = pad_token_id if pad_token_id is not None else (getattr(tokenizer, "pad_token_id", None) or 0)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def fit_context(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, max_new_tokens: int, context: int,
                truncation: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A prompt that leaves no room for max_new_tokens is an error, or loses its oldest tokens when
    truncation="left"."""
    keep = prompt_tokens_kept(input_ids.size(1), max_new_tokens, context, truncation)
    if keep == input_ids.size(1):
        return input_ids, attention_mask
    return input_ids[:, -keep:], attention_mask[:, -keep:] if attention_mask is not None else None


def _eos_set(model, eos_token_id) -> list[int]:
    if eos_token_id is None:
        eos_token_id = model.config.eos_token_id
    if eos_token_id is None:
        return []
    return [int(e) for e in (eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id])]


class _StopStrings:
    """Finds stop strings in the text generated so far (decoding only a recent window of tokens)."""

    def __init__(self, tokenizer, stops: Sequence[str] | None) -> None:
        self.stops = [s for s in (stops or []) if s]
        if self.stops and tokenizer is None:
            raise ValueError("stop_strings need the tokenizer (pass tokenizer=...)")
        self.tokenizer = tokenizer
        self.window = max((len(s) for s in self.stops), default=0) + 8  # a token is >= 1 byte

    def hit(self, new_tokens: list[int]) -> bool:
        if not self.stops:
            return False
        text = self.tokenizer.decode(new_tokens[-self.window:], skip_special_tokens=False)
        return any(s in text for s in self.stops)


# ----------------------------------------------------------------------------------- decoding
@torch.inference_mode()
def generate_tokens(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                    max_new_tokens: int = 32, temperature: float = 0.0, top_k: int | None = None,
                    top_p: float | None = None, repetition_penalty: float = 1.0, seed: int | None = None,
                    eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None,
                    stop_strings: Sequence[str] | None = None, tokenizer=None,
                    compile: bool = False) -> Iterator[torch.Tensor]:
    """Yield the next token of every row, (B,), step by step; rows that finished (EOS or a stop string)
    get `pad_token_id`. Stops when every row has finished or after max_new_tokens.
    temperature=0 is greedy (argmax); > 0 samples from softmax(logits / temperature).
    compile=True decodes through a compiled step with a static cache (`compiled.py`): ~2.5x faster on
    a CPU once compiled, but the first call compiles for minutes."""
    cfg = model.config
    b = input_ids.size(0)
    padded = attention_mask is not None and not bool(attention_mask.all())
    mask = attention_mask.long() if padded else None
    eos = torch.tensor(_eos_set(model, eos_token_id), dtype=torch.long, device=input_ids.device)
    pad = pad_token_id if pad_token_id is not None else (cfg.pad_token_id if cfg.pad_token_id is not None else
                                                         (int(eos[0]) if eos.numel() else 0))
    generator = None
    if temperature > 0 and seed is not None:
        generator = torch.Generator(device=input_ids.device).manual_seed(int(seed))
    stopper = _StopStrings(tokenizer, stop_strings)
    if compile:
        from .compiled import static_decoder
        next_logits = static_decoder(model).session(input_ids, mask, max_new_tokens)
    elif b == 1 and mask is None and _block_steps_apply(model):
        from .block_step import BlockSteps
        next_logits = BlockSteps(model, input_ids.size(1) + max_new_tokens)
    else:
        next_logits = _EagerSteps(model, mask, input_ids.size(1) + max_new_tokens)
    seqs = input_ids  # grows only when the repetition penalty needs the history
    new_tokens: list[list[int]] = [[] for _ in range(b)]
    finished = torch.zeros(b, dtype=torch.bool, device=input_ids.device)
    step_input = input_ids
    for step in range(max_new_tokens):
        logits = next_logits(step_input)
        if repetition_penalty != 1.0:
            logits = apply_repetition_penalty(logits, seqs, repetition_penalty)
        if temperature > 0:
            logits = logits / temperature
            if top_k is not None:
                logits = top_k_filter(logits, top_k)
            if top_p is not None:
                logits = top_p_filter(logits, top_p)
            token = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)
        else:
            token = logits.argmax(-1)
        token = token.masked_fill(finished, pad)
        yield token
        if eos.numel():
            finished |= torch.isin(token, eos)
        if stopper.stops:
            for i, t in enumerate(token.tolist()):
                if not finished[i]:
                    new_tokens[i].append(t)
                    if stopper.hit(new_tokens[i]):
                        finished[i] = True
        if bool(finished.all()) or step == max_new_tokens - 1:
            return
        step_input = token[:, None]
        if repetition_penalty != 1.0:
            seqs = torch.cat([seqs, step_input], dim=1)


def _block_steps_apply(model) -> bool:
    """A GGUF model kept quantized decodes through one C call per token (`block_step.py`)."""
    lm_head = getattr(model, "lm_head", None)
    if type(lm_head).__name__ != "BlockLinear":  # cheap test first: no import for ordinary models
        return False
    from .block_step import supported
    return supported(model)


class _EagerSteps:
    """Next-token logits (B, V) in fp32 for the prompt (first call), then for one token per call, with a
    growing KV cache and attention mask."""

    def __init__(self, model, mask: torch.Tensor | None, max_length: int) -> None:
        self.model, self.mask = model, mask
        # linear attention decodes with its recurrent state (O(1) per token) instead of every past key/value;
        # sliding-window layers roll their cache
        self.cache = LinearAttentionCache(model.config.num_layers) if model.config.attention_kind == "linear" \
            else KVCache.for_model(model, max_length=max_length)

    def __call__(self, step_input: torch.Tensor) -> torch.Tensor:
        if self.mask is not None and self.cache.get_seq_length():
            self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.size(0), 1)], dim=1)
        out = self.model(step_input, attention_mask=self.mask, past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1)
        return out.logits[:, -1].float()


def generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
             max_new_tokens: int = 32, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, repetition_penalty: float = 1.0, seed: int | None = None,
             eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None,
             stop_strings: Sequence[str] | None = None, tokenizer=None, num_beams: int = 1,
             length_penalty: float = 1.0, early_stopping: bool | str = False,
             truncation: str = "error", compile: bool = False) -> torch.Tensor:
    """Prompt + continuation, (B, T_prompt + T_new), like transformers' `generate`. Rows that stop early
    are padded with pad_token_id. num_beams > 1 runs beam search (deterministic; see `beam_search`).
    compile=True: see `generate_tokens` (not with beam search)."""
    check_sampling(temperature, top_k, top_p, repetition_penalty, num_beams, max_new_tokens)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.size(1) == 0:
        raise ValueError(f"input_ids must have shape (batch, prompt_len >= 1), got {tuple(input_ids.shape)}")
    if attention_mask is not None:
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids has "
                             f"{tuple(input_ids.shape)}")
        if not bool(attention_mask[:, -1].all()):
            raise ValueError("generation needs left padding (every row's last column a real token); "
                             "use attnlab.inference.generate.encode_prompts")
    input_ids, attention_mask = fit_context(input_ids, attention_mask, max_new_tokens,
                                            model.config.max_position_embeddings, truncation)
    if max_new_tokens == 0:
        return input_ids
    if num_beams > 1:
        if compile:
            raise ValueError("compile=True covers greedy and sampled decoding, not beam search (num_beams > 1)")
        return beam_search(model, input_ids, attention_mask, num_beams=num_beams, max_new_tokens=max_new_tokens,
                           length_penalty=length_penalty, early_stopping=early_stopping,
                           repetition_penalty=repetition_penalty, eos_token_id=_eos_set(model, eos_token_id),
                           pad_token_id=pad_token_id)
    steps = list(generate_tokens(model, input_ids, attention_mask, max_new_tokens=max_new_tokens,
                                 temperature=temperature, top_k=top_k, top_p=top_p,
                                 repetition_penalty=repetition_penalty, seed=seed, eos_token_id=eos_token_id,
                                 pad_token_id=pad_token_id, stop_strings=stop_strings, tokenizer=tokenizer,
                                 compile=compile))
    return torch.cat([input_ids, torch.stack(steps, dim=1)], dim=1)


# ----------------------------------------------------------------------------------- streaming
def stream(model, tokenizer, prompt: str | torch.Tensor, *, stop_strings: Sequence[str] | None = None,
           truncation: str = "error", **kwargs) -> Iterator[str]:
    """Yield the continuation of one prompt as text pieces, as soon as each is decodable. Stop strings
    end the stream and are not yielded themselves. kwargs: as `generate` (num_beams > 1 yields the
    finished text once, since a beam's text can change until the search ends)."""
    ids = encode_prompts(tokenizer, prompt)[0] if isinstance(prompt, str) else prompt.reshape(1, -1)
    max_new = kwargs.pop("max_new_tokens", 32)
    check_sampling(kwargs.get("temperature", 0.0), kwargs.get("top_k"), kwargs.get("top_p"),
                   kwargs.get("repetition_penalty", 1.0), kwargs.get("num_beams", 1), max_new)
    ids, _ = fit_context(ids, None, max_new, model.config.max_position_embeddings, truncation)
    stops = [s for s in (stop_strings or []) if s]
    if kwargs.get("num_beams", 1) > 1:
        out = generate(model, ids, max_new_tokens=max_new, **kwargs)
        text = tokenizer.decode(out[0, ids.size(1):])
        cut = min((text.find(s) for s in stops if s in text), default=-1)
        yield text if cut < 0 else text[:cut]
        return
    kwargs.pop("num_beams", None)
    kwargs.pop("length_penalty", None)
    kwargs.pop("early_stopping", None)
    eos = set(_eos_set(model, kwargs.get("eos_token_id")))
    tokens = (int(token[0]) for token in generate_tokens(model, ids, max_new_tokens=max_new,
                                                         stop_strings=stops or None, tokenizer=tokenizer, **kwargs))
    yield from text_pieces(tokens, tokenizer, eos, stops)
