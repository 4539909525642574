"""Encoder-decoder Transformer: the original architecture of Vaswani et al. 2017 (§3, Figure 1) and T5
(Raffel et al. 2020), as one class chosen by config switches (presets "transformer-base", "t5-small").

    source ids ──Encoder (bidirectional)──► memory (B, S, d)
                                              │ keys/values of every decoder block's cross-attention
    target ids ──DecoderStack (causal)────────┴──► hidden (B, T, d) ──lm_head──► logits (B, T, V)

The decoder stack is the same `Encoder` stack with `causal=True` whose `Block`s are built with
`cross_attention=True`: self-attention (masked, so that position t sees only < t+1), then
"encoder-decoder attention" with queries from the decoder and keys/values from the memory (§3.2.3), then
the FFN. Nothing here is a second block implementation.

Decoder-only values live in `config.extra`: `num_decoder_layers` (default num_layers),
`decoder_start_token_id` (default pad_token_id, as T5), `share_embeddings` (default true: one
source/target vocabulary, §3.4), `label_smoothing` (§5.4), `scale_decoder_outputs` (T5: hidden states
times d^-0.5 before the tied output projection), `final_logits_bias` (BART: a (1, V) buffer added to the
logits), `position_offset` (BART: learned positions counted from 2 in both stacks; M2M-100: fairseq's
sinusoids counted from 2 over the real tokens, `pad_aware_positions`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..nn import AttentionMask, Block
from .base import Model, ModelOutput
from .encoder import Encoder


class CrossKVCache:
    """Cross-attention keys/values depend on the encoder output only, so during decoding they are
    projected once, at the first step, and reused at every later step. `Attention` calls
    `update(layer, k, v)`; the first call per layer stores, later calls return what was stored (the
    decoder then passes a zero-length memory, so nothing is projected again)."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def ready(self) -> bool:
        return all(k is not None for k in self.keys)

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer_idx] is None:
            self.keys[layer_idx], self.values[layer_idx] = k, v
        return self.keys[layer_idx], self.values[layer_idx]

    def reorder(self, index: torch.Tensor) -> None:
        self.keys = [k.index_select(0, index) if k is not None else None for k in self.keys]
        self.values = [v.index_select(0, index) if v is not None else None for v in self.values]


class DecoderStack(Encoder):
    """The causal `Encoder` stack whose blocks also cross-attend to the encoder output (§3.1, decoder)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.layers = nn.ModuleList(Block(config, cross_attention=True) for _ in range(config.num_layers))
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, past_key_values=None,
                cross_cache: CrossKVCache | None = None,
                output_attentions: bool = False, output_hidden_states: bool = False) -> ModelOutput:
        """input_ids (B, T) target prefix; memory (B, S, d); memory_mask (B, S) 1 = real source token;
        attention_mask (B, past + T) target padding. With `past_key_values` only the new tokens are given."""
        offset = past_key_values.get_seq_length() if past_key_values is not None else 0
        self._check_inputs(input_ids, attention_mask, None, None, offset)
        b, t = input_ids.shape
        device = input_ids.device
        position_ids = self.offset_positions(input_ids, b, t, offset, device)  # BART's, M2M-100's start at 2
        x = self.embeddings(input_ids, None, position_ids)
        mask = AttentionMask.build(attention_mask, t, offset + t, causal=True, query_offset=offset, device=device)
        cross_mask = AttentionMask.build(memory_mask, t, memory.size(1), device=device)
        rope = self.rope(position_ids) if self.rope is not None else None
        bias = self.relative_bias(t, offset + t, offset) if self.relative_bias is not None else None
        # keys/values already projected: hand attention an empty memory (see CrossKVCache)
        source = memory[:, :0] if cross_cache is not None and cross_cache.ready else memory
        hidden, attns, crosses = ([x] if output_hidden_states else None), [], []
        for i, layer in enumerate(self.layers):
            x, (w, wc) = layer(x, mask, rope=rope, bias=bias, memory=source, memory_mask=cross_mask,
                               cache=past_key_values, cross_cache=cross_cache, layer_idx=i,
                               need_weights=output_attentions)
            attns.append(w)
            crosses.append(wc)
            if output_hidden_states:
                hidden.append(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if output_hidden_states:
                hidden[-1] = x
        return ModelOutput(last_hidden_state=x, hidden_states=tuple(hidden) if hidden is not None else None,
                           attentions=tuple(attns) if output_attentions else None,
                           cross_attentions=tuple(crosses) if output_attentions else None,
                           past_key_values=past_key_values)


def encoder_config(config: ModelConfig) -> ModelConfig:
    return config.replace(causal=False, pooler=False)


def decoder_config(config: ModelConfig) -> ModelConfig:
    return config.replace(causal=True, pooler=False,
                          num_layers=int(config.extra.get("num_decoder_layers") or config.num_layers))


class Seq2SeqLM(Model):
    """Encoder + decoder + output projection onto the vocabulary. HF keyword names in and out:
    `model(input_ids, attention_mask, decoder_input_ids | labels, decoder_attention_mask)`."""

    @property
    def hf_architecture(self) -> str:  # per family, as CausalLM: one class serves T5 and the original Transformer
        return {"t5": "T5ForConditionalGeneration", "bart": "BartForConditionalGeneration",
                "m2m_100": "M2M100ForConditionalGeneration"}.get(
            self.config.model_type, "Transformer")

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        if config.sliding_window:
            raise ValueError(f"model_type={config.model_type!r}: sliding_window is not supported by encoder-decoders")
        self.encoder = Encoder(encoder_config(config))
        self.decoder = DecoderStack(decoder_config(config))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.extra.get("final_logits_bias"):
            # BART: a bias on the tied output projection, a buffer (saved, not trained) as in fairseq/HF
            self.register_buffer("final_logits_bias", torch.zeros(1, config.vocab_size))
        else:
            self.final_logits_bias = None
        self.init_weights()

    @property
    def decoder_start_token_id(self) -> int:
        start = self.config.extra.get("decoder_start_token_id")
        return int(start if start is not None else (self.config.pad_token_id or 0))

    def init_weights(self) -> None:
        super().init_weights()
        if self.config.scale_embeddings:
            # The original Transformer (as tensor2tensor/fairseq): Xavier-uniform matrices, and embeddings
            # N(0, d^-1/2) so that after the sqrt(d) scaling (§3.4) they have unit variance like the sinusoids.
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.xavier_uniform_(module.weight)
            for emb in {id(m): m for m in (self.encoder.embeddings.tok, self.decoder.embeddings.tok)}.values():
                nn.init.normal_(emb.weight, std=self.config.hidden_size ** -0.5)
                if emb.padding_idx is not None:
                    with torch.no_grad():
                        emb.weight[emb.padding_idx].zero_()
            self.tie_weights()

    def tie_weights(self) -> None:
        if not hasattr(self, "lm_head"):  # called by Model.init_weights before the modules exist
            return
        if self.config.extra.get("share_embeddings", True):  # one joint vocabulary (§3.4)
            self.decoder.embeddings.tok = self.encoder.embeddings.tok
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.decoder.embeddings.tok.weight

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: the decoder reads <start> y_1 .. y_{T-1} and predicts y_1 .. y_T (§3.1)."""
        ids = labels.new_full(labels.shape, self.decoder_start_token_id)
        ids[:, 1:] = labels[:, :-1]
        return ids.masked_fill(ids == -100, self.config.pad_token_id or 0)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs) -> ModelOutput:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    def decode(self, decoder_input_ids: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None = None,
               decoder_attention_mask: torch.Tensor | None = None, past_key_values=None,
               cross_cache: CrossKVCache | None = None, output_attentions: bool = False,
               output_hidden_states: bool = False, logits_to_keep: int = 0) -> ModelOutput:
        out = self.decoder(decoder_input_ids, memory, memory_mask, decoder_attention_mask, past_key_values,
                           cross_cache, output_attentions, output_hidden_states)
        hidden = out.last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        if self.config.extra.get("scale_decoder_outputs"):
            hidden = hidden * self.config.hidden_size ** -0.5  # T5: rescale before the tied projection
        out.logits = self.lm_head(hidden)
        if self.final_logits_bias is not None:
            out.logits = out.logits + self.final_logits_bias
        return out

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None, decoder_attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, encoder_outputs: ModelOutput | torch.Tensor | None = None,
                past_key_values=None, cross_cache: CrossKVCache | None = None, use_cache: bool = False,
                output_attentions: bool = False, output_hidden_states: bool = False,
                logits_to_keep: int = 0) -> ModelOutput:
        if encoder_outputs is None:
            if input_ids is None:
                raise ValueError("pass input_ids (the source) or encoder_outputs")
            encoder_outputs = self.encode(input_ids, attention_mask, output_attentions=output_attentions,
                                          output_hidden_states=output_hidden_states)
        enc = encoder_outputs if isinstance(encoder_outputs, ModelOutput) \
            else ModelOutput(last_hidden_state=encoder_outputs)
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("pass decoder_input_ids or labels (the target; shifted right inside)")
            decoder_input_ids = self.shift_right(labels)
        out = self.decode(decoder_input_ids, enc.last_hidden_state, attention_mask, decoder_attention_mask,
                          past_key_values, cross_cache, output_attentions, output_hidden_states, logits_to_keep)
        if labels is not None:
            smoothing = float(self.config.extra.get("label_smoothing", 0.0)) if self.training else 0.0
            out.loss = F.cross_entropy(out.logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                                       label_smoothing=smoothing)
        out.extra["encoder_last_hidden_state"] = enc.last_hidden_state
        if enc.attentions is not None:
            out.extra["encoder_attentions"] = enc.attentions
        if enc.hidden_states is not None:
            out.extra["encoder_hidden_states"] = enc.hidden_states
        if not use_cache:
            out.past_key_values = None
        return out
