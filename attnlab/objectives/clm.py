"""Causal language modelling: predict token t+1 from tokens <= t over packed documents (GPT).

Documents are concatenated with an end-of-text token between them (when the tokenizer has one) and
cut into windows of seq_len + 1 tokens; the model reads window[:-1] and is scored on window[1:]
(`CausalLM` shifts internally, so labels are the input ids). Windows either tile the stream in a
shuffled order (`random_windows=False`: every token seen once per epoch) or start at uniformly random
offsets, as nanoGPT's get_batch does (more distinct contexts from a small corpus).

    stream  a b c <eot> d e f g ...      seq_len = 3
    window  [a b c <eot>] -> input a b c, targets b c <eot>
"""
from __future__ import annotations

import math
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..data.shards import Shard
from ..nn.moe import expert_counts

try:  # the decoder wrapper lives in models/decoder.py
    from ..models.decoder import CausalLM
except ImportError:  # pragma: no cover - a tree without it: the smallest wrapper that trains
    from torch import nn

    from ..models.base import Model
    from ..models.encoder import Encoder

    class CausalLM(Model):  # type: ignore[no-redef]
        def __init__(self, config: ModelConfig) -> None:
            super().__init__(config)
            self.backbone = Encoder(config)
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.init_weights()

        def tie_weights(self) -> None:
            if self.config.tie_word_embeddings:
                self.lm_head.weight = self.backbone.embeddings.tok.weight

        def forward(self, input_ids=None, attention_mask=None, labels=None, **kw):
            out = self.backbone(input_ids=input_ids, attention_mask=attention_mask)
            out.logits = self.lm_head(out.last_hidden_state)
            if labels is not None:
                out.loss = F.cross_entropy(out.logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                                           ignore_index=-100)
            return out

__all__ = ["CausalLM", "clm_windows", "clm_collate", "clm_loss", "clm_metrics", "tokens_per_byte", "with_bits_per_byte"]


def _stream(shard: Shard, eot_id: int | None) -> np.ndarray:
    tokens = np.asarray(shard.tokens[:shard.num_tokens], dtype=np.int64)
    if eot_id is None:
        return tokens
    return np.insert(tokens, shard.sentences[shard.documents[1:]], eot_id)


def clm_windows(shards: list[Shard], seq_len: int, rng: np.random.Generator, *, eot_id: int | None = None,
                random_windows: bool = False) -> Iterator[np.ndarray]:
    """One epoch of (seq_len + 1)-token windows. With random windows, an "epoch" is as many windows as
    tile the data once, drawn from shards in proportion to their size."""
    span = seq_len + 1
    if random_windows:
        sizes = np.array([s.num_tokens + s.num_documents for s in shards], dtype=np.float64)
        usable = np.maximum(sizes - span, 0)
        if usable.sum() == 0:
            return
        count = int(sizes.sum()) // span
        picks = rng.choice(len(shards), size=count, p=usable / usable.sum())
        for s in np.unique(picks):
            stream = _stream(shards[s], eot_id)
            starts = rng.integers(0, len(stream) - span + 1, int((picks == s).sum()))
            for k in starts:
                yield stream[k:k + span]
        return
    for s in rng.permutation(len(shards)):
        stream = _stream(shards[s], eot_id)
        for k in rng.permutation(len(stream) // span):
            yield stream[k * span:(k + 1) * span]


def clm_collate(examples: list[np.ndarray], rng: np.random.Generator | None = None) -> dict[str, torch.Tensor]:
    ids = torch.from_numpy(np.stack(examples))
    return {"input_ids": ids[:, :-1].contiguous(), "labels": ids[:, 1:].contiguous()}


def clm_loss(model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean next-token cross-entropy. The batch holds inputs and the already shifted targets, so all
    seq_len positions are scored (CausalLM's own shifted loss would drop the last one)."""
    out = model(input_ids=batch["input_ids"])
    logits = out.logits.float().flatten(0, 1)
    target = batch["labels"].flatten()
    loss = F.cross_entropy(logits, target)
    with torch.no_grad():
        n = torch.tensor(float(target.numel()))
        sums = {"loss_sum": loss.detach() * n, "n": n, "correct": (logits.argmax(-1) == target).sum().float()}
    if "router_loss" in out.extra:  # mixture of experts: the weighted balancing loss trains the routers
        cfg = getattr(model, "module", model).config  # DDP wraps the model
        sums.update(expert_sums(out.extra["router_logits"], cfg.experts_top_k))
        return loss + out.extra["router_loss"], sums
    return loss, sums


def expert_sums(router_logits: tuple, top_k: int) -> dict[str, torch.Tensor]:
    """Top-k assignments per expert ("expert_0", ...), summed over layers: `clm_metrics` turns them into
    each expert's share of the routed tokens."""
    counts = expert_counts(router_logits, top_k, router_logits[0].size(-1))
    return {f"expert_{j}": c for j, c in enumerate(counts)}


def clm_metrics(sums: dict[str, float]) -> dict[str, float]:
    loss = sums["loss_sum"] / max(sums["n"], 1)
    out = {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "accuracy": sums["correct"] / max(sums["n"], 1)}
    return {**out, **expert_shares(sums)}


def expert_shares(sums: dict[str, float]) -> dict[str, float]:
    """{"expert_share_j": share of routed tokens} from expert_sums' counts (empty for a dense model)."""
    counts = {k: v for k, v in sums.items() if k.startswith("expert_") and k[7:].isdigit()}
    total = sum(counts.values()) or 1.0
    return {f"expert_share_{k[7:]}": v / total for k, v in counts.items()}


def tokens_per_byte(shards: list[Shard], tokenizer, max_tokens: int = 1_000_000) -> float:
    """Tokens per UTF-8 byte of the text in `shards` (documents decoded back to text, up to `max_tokens`
    tokens). Val loss is nats per *token*, which depends on the tokenizer; times this ratio / ln 2 it is
    bits per *byte*, comparable between a character model, a BPE model and any other (as
    lm-evaluation-harness reports for wikitext). End-of-text separators are not counted on either side."""
    tokens = n_bytes = 0
    for shard in shards:
        for d in range(shard.num_documents):
            ids = shard.document_tokens(d)
            tokens += len(ids)
            n_bytes += len(tokenizer.decode(ids, skip_special_tokens=False).encode("utf-8"))
            if tokens >= max_tokens:
                return tokens / max(n_bytes, 1)
    return tokens / max(n_bytes, 1)


def with_bits_per_byte(metrics_fn, ratio: float):
    """`metrics_fn` plus "bits_per_byte" = loss (nats/token) x tokens per byte / ln 2."""
    def metrics(sums: dict[str, float]) -> dict[str, float]:
        out = metrics_fn(sums)
        return {**out, "bits_per_byte": out["loss"] * ratio / math.log(2)}
    return metrics
