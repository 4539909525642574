"""Before the Transformer: the RNN encoder-decoder, without and with attention — the notes' starting point.

Without attention (Sutskever et al. 2014; Cho et al. 2014) the decoder starts from one fixed-size vector,
the encoder's final state: the whole source must fit through it, the bottleneck the notes describe.
With attention the decoder looks back at every encoder output at every step:
- additive (Bahdanau et al. 2015): e_tj = v·tanh(W s_{t-1} + U h_j), computed from the previous decoder
  state, so the context c_t is an input of the step that produces s_t (a loop over target positions);
- dot / general (Luong et al. 2015, sec. 3.1): score(h_t, h̄_j) = h_t·h̄_j or h_t·W h̄_j from the current
  state, then h̃_t = tanh(W_c [c_t; h_t]) (eq. 5); the decoder RNN runs over the whole target at once.

Switches (ModelConfig.extra): cell = gru | lstm, attention = none | additive | dot | general. The encoder
is bidirectional (each direction hidden_size/2, outputs concatenated to hidden_size); its final states
pass through a tanh bridge to start the decoder. Same calling convention as `Seq2SeqLM` (labels in,
loss out; encode/decode for generation), so `finetune translation`, `translate` and beam search use it
unchanged. The decoder's "KV cache" is its recurrent state: one entry per call, keys = h, values = c
(LSTM) or h (GRU), reordered with the beams like any cache.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ConfigError, ModelConfig
from .base import Model, ModelOutput
from .seq2seq import Seq2SeqLM

CELLS = ("gru", "lstm")
ATTENTIONS = ("none", "additive", "dot", "general")


class _DecoderInfo(nn.Module):
    """What generation asks of `model.decoder`: its config (num_layers sizes the state cache,
    max_position_embeddings bounds the output length)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config


class RNNSeq2Seq(Model):
    hf_architecture = "RNNSeq2Seq"  # no Hugging Face class: saved in attnlab's own layout
    self_attention = False          # `attnlab viz` draws its source alignment instead of attention pages

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.cell = config.extra.get("cell", "gru")
        self.attention = config.extra.get("attention", "additive")
        if self.cell not in CELLS:
            raise ConfigError(f"extra.cell={self.cell!r}: expected one of {', '.join(CELLS)}")
        if self.attention not in ATTENTIONS:
            raise ConfigError(f"extra.attention={self.attention!r}: expected one of {', '.join(ATTENTIONS)}")
        h, n = config.hidden_size, config.num_layers
        if h % 2:
            raise ConfigError(f"hidden_size={h} must be even (two encoder directions of hidden_size/2)")
        rnn = nn.GRU if self.cell == "gru" else nn.LSTM
        self.embed = nn.Embedding(config.vocab_size, h, padding_idx=config.pad_token_id)
        self.encoder = rnn(h, h // 2, num_layers=n, batch_first=True, bidirectional=True,
                           dropout=config.dropout if n > 1 else 0.0)
        self.bridge = nn.Linear(h, h)  # encoder final state -> decoder initial state (Bahdanau et al. A.2.2)
        self.decoder = _DecoderInfo(config)
        if self.attention == "additive":
            self.w_query, self.w_key = nn.Linear(h, h, bias=False), nn.Linear(h, h)
            self.v = nn.Linear(h, 1, bias=False)
            step_cell = nn.GRUCell if self.cell == "gru" else nn.LSTMCell
            self.cells = nn.ModuleList([step_cell(2 * h if i == 0 else h, h) for i in range(n)])
            self.combine = nn.Linear(3 * h, h)  # [s_t; c_t; y_{t-1}] -> output layer (Bahdanau et al. A.2.2)
        else:
            self.decoder_rnn = rnn(h, h, num_layers=n, batch_first=True, dropout=config.dropout if n > 1 else 0.0)
            if self.attention == "general":
                self.w_general = nn.Linear(h, h, bias=False)
            self.combine = nn.Linear(2 * h if self.attention != "none" else h, h)
        self.dropout = nn.Dropout(config.dropout)
        self.lm_head = nn.Linear(h, config.vocab_size, bias=False)
        self.init_weights()

    def init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.xavier_uniform_(p)
            else:
                nn.init.zeros_(p)
        with torch.no_grad():
            self.embed.weight.normal_(0, self.config.hidden_size ** -0.5)
            if self.embed.padding_idx is not None:
                self.embed.weight[self.embed.padding_idx].zero_()
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings and hasattr(self, "lm_head"):
            self.lm_head.weight = self.embed.weight

    # the same teacher forcing and start token as the Transformer encoder-decoder
    decoder_start_token_id = Seq2SeqLM.decoder_start_token_id
    shift_right = Seq2SeqLM.shift_right

    # ------------------------------------------------------------------ encoder
    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_) -> ModelOutput:
        """Encoder outputs (B, S, H): forward and backward states concatenated; padding positions zero."""
        lengths = (attention_mask.sum(1) if attention_mask is not None
                   else torch.full((input_ids.size(0),), input_ids.size(1))).cpu()
        if int(lengths.min()) < 1:
            raise ValueError("a source row is empty (attention_mask all zero)")
        packed = nn.utils.rnn.pack_padded_sequence(self.dropout(self.embed(input_ids)), lengths,
                                                   batch_first=True, enforce_sorted=False)
        out, _ = self.encoder(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=input_ids.size(1))
        return ModelOutput(last_hidden_state=out)

    def initial_state(self, memory: torch.Tensor, memory_mask: torch.Tensor | None):
        """The fixed-size summary of the source: the forward direction's output at the last real token and
        the backward direction's at the first, through the bridge; one copy per decoder layer."""
        half = self.config.hidden_size // 2
        last = (memory_mask.sum(1) - 1 if memory_mask is not None
                else torch.full((memory.size(0),), memory.size(1) - 1, device=memory.device)).long()
        rows = torch.arange(memory.size(0), device=memory.device)
        summary = torch.cat([memory[rows, last, :half], memory[:, 0, half:]], dim=-1)
        h0 = torch.tanh(self.bridge(summary))
        state = h0[None].repeat(self.config.num_layers, 1, 1).contiguous()
        return (state, torch.zeros_like(state)) if self.cell == "lstm" else state

    # ------------------------------------------------------------------ decoder
    def _attend(self, query: torch.Tensor, memory: torch.Tensor, keys: torch.Tensor | None,
                memory_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, T, H) -> context (B, T, H), weights (B, T, S)."""
        if self.attention == "additive":
            scores = self.v(torch.tanh(self.w_query(query)[:, :, None] + keys[:, None])).squeeze(-1)
        elif self.attention == "general":
            scores = query @ self.w_general(memory).transpose(1, 2)
        else:
            scores = query @ memory.transpose(1, 2)
        if memory_mask is not None:
            scores = scores.masked_fill(~memory_mask[:, None].bool(), torch.finfo(scores.dtype).min)
        weights = scores.softmax(-1)
        return weights @ memory, weights

    def _state_in(self, cache, memory, memory_mask):
        if cache is None or cache.get_seq_length() == 0:
            return self.initial_state(memory, memory_mask)
        n = self.config.num_layers
        h = torch.stack([cache.keys[i][:, 0, cache.lengths[i] - 1] for i in range(n)])
        if self.cell == "lstm":
            return h, torch.stack([cache.values[i][:, 0, cache.lengths[i] - 1] for i in range(n)])
        return h

    def _state_out(self, cache, state) -> None:
        if cache is None:
            return
        h, c = state if self.cell == "lstm" else (state, state)
        for i in range(self.config.num_layers):
            cache.update(i, h[i][:, None, None], c[i][:, None, None])

    def decode(self, decoder_input_ids: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None = None,
               decoder_attention_mask: torch.Tensor | None = None, past_key_values=None, cross_cache=None,
               output_attentions: bool = False, output_hidden_states: bool = False,
               logits_to_keep: int = 0) -> ModelOutput:
        state = self._state_in(past_key_values, memory, memory_mask)
        emb = self.dropout(self.embed(decoder_input_ids))
        weights = None
        if self.attention == "additive":
            keys = self.w_key(memory)  # U h_j once per source, not per step
            layers = list(state) if self.cell == "gru" else list(zip(*state))
            outputs, all_weights = [], []
            for t in range(emb.size(1)):
                top = layers[-1] if self.cell == "gru" else layers[-1][0]
                context, w = self._attend(top[:, None], memory, keys, memory_mask)
                x = torch.cat([emb[:, t], context[:, 0]], dim=-1)
                for i, cell in enumerate(self.cells):
                    layers[i] = cell(x, layers[i])
                    x = self.dropout(layers[i] if self.cell == "gru" else layers[i][0])
                outputs.append(torch.cat([x, context[:, 0], emb[:, t]], dim=-1))
                all_weights.append(w[:, 0])
            hidden = torch.tanh(self.combine(torch.stack(outputs, 1)))
            weights = torch.stack(all_weights, 1)
            state = torch.stack(layers) if self.cell == "gru" else tuple(torch.stack(s) for s in zip(*layers))
        else:
            out, state = self.decoder_rnn(emb, state)
            if self.attention == "none":
                hidden = torch.tanh(self.combine(self.dropout(out)))
            else:
                context, weights = self._attend(out, memory, None, memory_mask)
                hidden = torch.tanh(self.combine(self.dropout(torch.cat([context, out], dim=-1))))  # Luong eq. 5
        self._state_out(past_key_values, state)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        result = ModelOutput(logits=self.lm_head(self.dropout(hidden)), past_key_values=past_key_values)
        if output_attentions:  # one "head" of cross-attention, the alignment of Bahdanau et al. Fig. 3
            result.attentions = []
            result.cross_attentions = [weights[:, None]] if weights is not None else []
        return result

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                past_key_values=None, use_cache: bool = False, output_attentions: bool = False,
                logits_to_keep: int = 0, **_) -> ModelOutput:
        if input_ids is None:
            raise ValueError("pass input_ids (the source)")
        memory = self.encode(input_ids, attention_mask).last_hidden_state
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("pass decoder_input_ids or labels (the target; shifted right inside)")
            decoder_input_ids = self.shift_right(labels)
        out = self.decode(decoder_input_ids, memory, attention_mask, None, past_key_values,
                          output_attentions=output_attentions, logits_to_keep=logits_to_keep)
        if labels is not None:
            smoothing = float(self.config.extra.get("label_smoothing", 0.0)) if self.training else 0.0
            out.loss = F.cross_entropy(out.logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                                       label_smoothing=smoothing)
        if not use_cache:
            out.past_key_values = None
        return out
