"""Generation for encoder-decoders, on the decoder-only machinery of `generate.py` / `beam.py`.

The source is encoded once. The decoder is then a causal LM over the target prefix whose every step
also reads the fixed encoder output; `_DecoderLM` presents it with the call signature the greedy,
sampling and beam loops use, so those loops (and their KV cache for decoder self-attention) are reused
unchanged. Cross-attention keys/values are projected from the encoder output at the first step only
(`CrossKVCache`).

    >>> out = generate(model, batch["input_ids"], batch["attention_mask"], max_new_tokens=64, num_beams=4)
    >>> tokenizer.batch_decode(out)          # out[:, 0] is the decoder start token
"""
from __future__ import annotations

import torch

from ..models.base import ModelOutput
from ..models.seq2seq import CrossKVCache, Seq2SeqLM
from .generate import generate as _generate


class _DecoderLM:
    """model(ids, attention_mask=, past_key_values=, use_cache=, logits_to_keep=) over the target prefix,
    with the encoder output held fixed."""

    def __init__(self, model: Seq2SeqLM, memory: torch.Tensor, memory_mask: torch.Tensor | None) -> None:
        self.model, self.memory, self.memory_mask = model, memory, memory_mask
        self.config = model.decoder.config  # num_layers of the decoder: the size of the self-attention cache
        self.cross = CrossKVCache(self.config.num_layers)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, past_key_values=None,
                 use_cache: bool = False, logits_to_keep: int = 0) -> ModelOutput:
        rows = input_ids.size(0)
        if rows != self.memory.size(0):  # beam search: each source row became num_beams consecutive rows
            n = rows // self.memory.size(0)
            self.memory = self.memory.repeat_interleave(n, dim=0)
            if self.memory_mask is not None:
                self.memory_mask = self.memory_mask.repeat_interleave(n, dim=0)
            self.cross = CrossKVCache(self.config.num_layers)
        return self.model.decode(input_ids, self.memory, self.memory_mask, attention_mask, past_key_values,
                                 self.cross, logits_to_keep=logits_to_keep)


@torch.inference_mode()
def generate(model: Seq2SeqLM, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
             max_new_tokens: int = 64, num_beams: int = 1, forced_bos_token_id: int | None = None,
             **kwargs) -> torch.Tensor:
    """(B, 1 + new) target ids starting with the decoder start token, like transformers' `generate` for
    encoder-decoders. kwargs: as `attnlab.inference.generate.generate` (temperature, top_k, top_p,
    length_penalty, early_stopping, eos_token_id, ...). Finished rows are padded with pad_token_id.
    `forced_bos_token_id` (M2M-100's target-language token) is the first generated token whatever the
    logits: the decoder starts from (start, forced), which is what forcing it gives, score included
    (transformers' forcing leaves that step a log-probability of 0); it counts in max_new_tokens."""
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if attention_mask is not None and not bool(attention_mask.all()):
        memory_mask = attention_mask
    else:
        memory_mask = None
    memory = model.encode(input_ids, attention_mask).last_hidden_state
    start = torch.full((input_ids.size(0), 1), model.decoder_start_token_id, dtype=torch.long, device=input_ids.device)
    if forced_bos_token_id is not None:
        start = torch.cat((start, torch.full_like(start, forced_bos_token_id)), dim=1)
        max_new_tokens -= 1
    return _generate(_DecoderLM(model, memory, memory_mask), start, None, max_new_tokens=max_new_tokens,
                     num_beams=num_beams, **kwargs)
