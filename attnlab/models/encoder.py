"""The Transformer stack: embeddings, N blocks, optional final norm and pooler.

With `causal=False` it is BERT's bidirectional encoder (Devlin et al. 2019); with `causal=True` the same
stack is a GPT-style decoder (the decoder models add an LM head and a KV cache on top of it).
Every variant in the notes is a config switch: see `attnlab.config.ModelConfig`.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig
from ..nn.disentangled import RelativePositions
from ..nn.dropout import Dropout
from ..nn.feedforward import activation_fn
from ..nn.relative_xl import RelativeXL, XLPositions, cache_mems, segment_matrix, stream_masks
from ..nn.moe import collect_router_logits, load_balancing_loss, router_z_loss
from ..nn.varlen import Varlen
from ..nn import AttentionMask, Block, Embeddings, RelativePositionBias, RotaryEmbedding, make_norm
from .base import Model, ModelOutput


class Pooler(nn.Module):
    """BERT's pooler: tanh(W h_[CLS] + b), the sentence vector the NSP head reads (§3.1). DeBERTa's
    ContextPooler is the same with GELU after a dropout (config.extra pooler_activation, pooler_dropout)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation_fn(config.extra.get("pooler_activation") or "tanh")
        self.dropout = Dropout(float(config.extra.get("pooler_dropout") or 0.0))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(self.dropout(hidden[:, 0])))


def _cpu_autocast_training(device: torch.device) -> bool:
    """bf16 autocast with gradients on a CPU. There an unpadded batch gives every product a new row count (the
    batch's real tokens), and oneDNN keeps resources for each new shape: MiniLM fine-tuning on SQuAD's batches
    (32 x 256) grew by ~8 MB a step (12 GB a process after 2,300 steps) unpadded, and stayed flat padded, where
    the shapes repeat. fp32 products (MKL) keep nothing per shape, and inference keeps unpadding."""
    return device.type == "cpu" and torch.is_autocast_enabled("cpu") and torch.is_grad_enabled()


class Encoder(Model):
    hf_architecture = "BertModel"
    unpad = True  # run padded batches unpadded (same numbers, less work); set False to compare
    # ... when at least this share of the batch is padding. Below it, the per-layer scatter of Q/K/V into
    # the padded layout costs more than the padding's linear work saves (measured on length-sorted
    # batches of real sentences: 10% faster than unpadding every batch; benchmarks/encoder_inference.py)
    unpad_min_padding = 0.1
    # Training rounds the unpadded row count up to one of this many sizes per octave (padding rows, computed
    # and dropped; at most 1/16 more work): a new row count every batch gives glibc's heap (kept large by
    # nn/precision.tune_malloc) blocks of a new size every step. fp32 fine-tuning on SQuAD's windows, one
    # process: 7.0 GB at step 150 with each batch's own width and count, 5.1-5.8 GB with widths at multiples
    # of 32 (tasks/finetune.py), 4.4-4.8 GB with the row count rounded too. Inference keeps the exact count.
    unpad_sizes_per_octave = 16

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.rope = RotaryEmbedding(config.rotary_dim, config.rope_theta) if config.position == "rope" else None
        # ModernBERT rotates local (sliding-window) layers with a smaller theta than global ones
        # (Warner et al. 2024, §2.1: 10k local, 160k global)
        local_theta = config.extra.get("local_rope_theta")
        self.local_rope = RotaryEmbedding(config.rotary_dim, local_theta) \
            if self.rope is not None and local_theta is not None else None
        # T5 shares one bias table across all layers (Raffel et al. 2020, §2.1)
        self.relative_bias = RelativePositionBias(
            config.num_heads, config.relative_num_buckets, config.relative_max_distance,
            bidirectional=not config.causal) if config.position == "relative_bias" else None
        # DeBERTa: one table of relative-position embeddings for every layer's c2p / p2c scores (He et al. 2021)
        self.rel_positions = RelativePositions(config) if config.disentangled_attention else None
        # Transformer-XL / XLNet: relative sinusoids, mems, the query stream's start vector (nn/relative_xl.py)
        self.xl = RelativeXL(config) if config.position == "relative_xl" else None
        if config.share_layers:  # ALBERT: one block applied num_layers times (Lan et al. 2020, §3.1)
            block = Block(config)
            self.layers = nn.ModuleList([block] * config.num_layers)
        else:
            self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        if config.extra.get("skip_first_attn_norm"):
            # ModernBERT: the embeddings end in a LayerNorm, so the first pre-LN block does not norm again
            self.layers[0].attn_norm = nn.Identity()
        self.final_norm = make_norm(config) if config.has_final_norm else None
        self.pooler = Pooler(config) if config.pooler else None
        self.init_weights()

    def offset_positions(self, input_ids: torch.Tensor | None, b: int, t: int, offset: int, device) -> torch.Tensor:
        """Position ids counted from config.extra["position_offset"] (0 without it), after `offset` cached tokens."""
        cfg = self.config
        if ("position_offset" in cfg.extra and cfg.extra.get("pad_aware_positions", True)
                and input_ids is not None and cfg.pad_token_id is not None):
            # RoBERTa, M2M-100 (fairseq): real tokens count from position_offset (pad_token_id + 1), whatever
            # padding surrounds them; pad tokens take position pad_token_id
            real = input_ids != cfg.pad_token_id
            start = cfg.extra["position_offset"] + offset
            return torch.where(real, real.long().cumsum(-1) + start - 1, cfg.pad_token_id)
        # BART (pad_aware_positions: false): positions from position_offset = 2, padding or not
        start = offset + cfg.extra.get("position_offset", 0)
        return torch.arange(start, start + t, device=device).expand(b, t)

    def _check_inputs(self, input_ids, attention_mask, token_type_ids, inputs_embeds, past: int = 0) -> None:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        ref = input_ids if input_ids is not None else inputs_embeds[..., 0]
        if ref.dim() != 2:
            raise ValueError(f"input_ids must have shape (batch, seq_len), got {tuple(ref.shape)}")
        if token_type_ids is not None and token_type_ids.shape != ref.shape:
            raise ValueError(f"token_type_ids has shape {tuple(token_type_ids.shape)} but input_ids has {tuple(ref.shape)}")
        # with a KV cache the mask covers the cached tokens too: (batch, past + seq_len)
        if attention_mask is not None and attention_mask.shape != (ref.size(0), past + ref.size(1)):
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)} but expected "
                             f"{(ref.size(0), past + ref.size(1))} (input_ids {tuple(ref.shape)}"
                             + (f" after {past} cached tokens)" if past else ")"))
        # the range checks read values back to the host: a graph break under torch.compile (training with
        # train.compile validates ids once per batch outside the compiled region instead, see the Trainer)
        if torch.compiler.is_compiling():
            return
        if input_ids is not None and input_ids.numel():
            lo, hi = int(input_ids.min()), int(input_ids.max())
            if lo < 0 or hi >= self.config.vocab_size:
                bad = hi if hi >= self.config.vocab_size else lo
                raise ValueError(f"token id {bad} is outside the vocabulary (vocab_size={self.config.vocab_size})")
        if token_type_ids is not None and token_type_ids.numel() and self.embeddings.seg is not None:
            if int(token_type_ids.max()) >= self.config.type_vocab_size or int(token_type_ids.min()) < 0:
                raise ValueError(f"token_type_ids must lie in [0, {self.config.type_vocab_size}), "
                                 f"got {int(token_type_ids.max())}")

    def _check_langs(self, langs: torch.Tensor | None, ref: torch.Tensor) -> None:
        if langs is None:
            return
        n = self.config.num_languages
        if n == 0:
            raise ValueError("langs given, but this model has no language embeddings (config num_languages=0)")
        if langs.shape != ref.shape:
            raise ValueError(f"langs has shape {tuple(langs.shape)} but input_ids has {tuple(ref.shape)}")
        if not torch.compiler.is_compiling() and langs.numel() and (int(langs.min()) < 0 or int(langs.max()) >= n):
            raise ValueError(f"langs must lie in [0, {n}) (config num_languages={n}), got {int(langs.max())}")

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, past_key_values=None, use_cache: bool = False,
                output_attentions: bool = False, output_hidden_states: bool = False,
                unpad: bool | None = None, document_ids: torch.Tensor | None = None,
                global_attention_mask: torch.Tensor | None = None, mems=None, perm_mask: torch.Tensor | None = None,
                target_mapping: torch.Tensor | None = None, use_mems: bool | None = None,
                langs: torch.Tensor | None = None) -> ModelOutput:
        """`langs` (B, T): each token's language id for the language embeddings (XLM; config.num_languages).
        `document_ids` (B, T): a packed batch's document of each token; attention stays inside a document
        (pass `position_ids` that restart at each document too). `unpad`: with padding and nothing cached yet, run every linear layer on the real tokens only (see
        attnlab.nn.varlen); outputs are re-padded with zeros at padding positions. True: whenever there is
        padding; False: never; None (default): if `self.unpad` and padding is at least `unpad_min_padding`
        of the batch. `global_attention_mask` (B, T), 1 = global token (Longformer: it sees and is seen by
        every token; with `global_attention` its output comes from separate projections).
        `mems`, `perm_mask`, `target_mapping`, `use_mems`: XLNet's inputs (position relative_xl), see `_xl_forward`."""
        if self.xl is not None:
            return self._xl_forward(input_ids, attention_mask, token_type_ids, inputs_embeds, mems, perm_mask,
                                    target_mapping, use_mems, output_attentions, output_hidden_states)
        if mems is not None or perm_mask is not None or target_mapping is not None:
            raise ValueError("mems, perm_mask and target_mapping are XLNet's inputs: they need position: relative_xl")
        offset = past_key_values.get_seq_length() if past_key_values is not None else 0
        self._check_inputs(input_ids, attention_mask, token_type_ids, inputs_embeds, offset)
        self._check_langs(langs, input_ids if input_ids is not None else inputs_embeds[..., 0])
        cfg = self.config
        b, t = (input_ids if input_ids is not None else inputs_embeds[..., 0]).shape
        device = (input_ids if input_ids is not None else inputs_embeds).device
        if position_ids is None:
            if cfg.causal and attention_mask is not None:
                # left padding: a row's first real token is position 0, whatever padding precedes it
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -t:]
            else:
                position_ids = self.offset_positions(input_ids, b, t, offset, device)
        varlen = None
        # A KV cache still allows it for a first pass (a padded batch of prompts, nothing cached yet): the
        # cache receives keys/values in the padded layout, zeros at padding, which the mask hides later.
        if unpad is None:
            unpad = (self.unpad and attention_mask is not None and offset == 0
                     and not _cpu_autocast_training(device)
                     and 1 - attention_mask.float().mean().item() >= self.unpad_min_padding)
        if unpad and attention_mask is not None and offset == 0 and not bool(attention_mask.all()):
            varlen = Varlen.from_mask(attention_mask, self.unpad_sizes_per_octave if torch.is_grad_enabled() else 0)
            gather = lambda t_: varlen.unpad(t_) if t_ is not None else None  # noqa: E731
            x = self.embeddings(gather(input_ids), gather(token_type_ids), gather(position_ids), gather(inputs_embeds),
                                gather(langs))
        else:
            x = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds, langs)
        repad = varlen.pad if varlen is not None else (lambda t_: t_)

        mask = AttentionMask.build(attention_mask, t, offset + t, causal=cfg.causal, query_offset=offset,
                                   device=device, documents=document_ids, global_tokens=global_attention_mask)
        local = AttentionMask.build(attention_mask, t, offset + t, causal=cfg.causal, query_offset=offset,
                                    window=cfg.sliding_window, device=device, documents=document_ids,
                                    global_tokens=global_attention_mask) if cfg.sliding_window else mask
        rope = self.rope(position_ids) if self.rope is not None else None
        local_rope = self.local_rope(position_ids) if self.local_rope is not None else rope
        bias = self.relative_bias(t, offset + t, offset) if self.relative_bias is not None else None
        positions = self.rel_positions(t, device) if self.rel_positions is not None else None

        hidden_states, attentions = [repad(x)] if output_hidden_states else None, [] if output_attentions else None
        key_start = getattr(past_key_values, "key_start", None)  # a rolling (sliding-window) KV cache
        for i, layer in enumerate(self.layers):
            is_local = self._is_local(i)
            layer_mask = local if is_local else mask
            if key_start is not None and key_start(i) and layer_mask.allowed is not None:
                # the cache returns keys from absolute position key_start(i) on: drop the columns before it
                layer_mask = AttentionMask(layer_mask.allowed[..., key_start(i):], layer_mask.is_causal)
            x, (w, _) = layer(x, layer_mask, rope=local_rope if is_local else rope, bias=bias,
                              cache=past_key_values, layer_idx=i, need_weights=output_attentions, varlen=varlen,
                              positions=positions)
            if output_hidden_states:
                hidden_states.append(repad(x))
            if output_attentions:
                attentions.append(w)
        if self.final_norm is not None:
            x = self.final_norm(x)
            if output_hidden_states:
                hidden_states[-1] = repad(x)
        x = repad(x)
        return ModelOutput(
            last_hidden_state=x,
            pooler_output=self.pooler(x) if self.pooler is not None else None,
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            attentions=tuple(attentions) if attentions is not None else None,
            past_key_values=past_key_values if use_cache else None,
            extra=self._router_outputs(attention_mask, varlen, t) if cfg.num_experts else {})

    def _xl_forward(self, input_ids, attention_mask, token_type_ids, inputs_embeds, mems, perm_mask, target_mapping,
                    use_mems, output_attentions, output_hidden_states) -> ModelOutput:
        """XLNet (Yang et al. 2019): the content stream h through every block with Transformer-XL relative
        attention over [mems; h]; with `target_mapping` (B, M, T) also the query stream g (M rows from the
        trainable w), which becomes `last_hidden_state`. `perm_mask` (B, T, T), 1 = may not see. `mems`: one
        (mlen, B, d) tensor per layer, time first as transformers keeps them, returned (as `mems`) when
        use_mems (default: extra.use_mems_eval / use_mems_train, else in eval mode only, as transformers). Hidden states / attentions of both
        streams interleave per layer (h, g) as transformers returns them."""
        b, t = (input_ids if input_ids is not None else inputs_embeds[..., 0]).shape
        mlen = mems[0].size(0) if mems is not None and mems[0] is not None else 0
        self._check_inputs(input_ids, attention_mask, None, inputs_embeds)
        if mems is not None and (len(mems) != len(self.layers) or any(m.shape[1:] != (b, self.config.hidden_size)
                                                                      for m in mems)):
            raise ValueError(f"mems: expected {len(self.layers)} tensors of shape (mem_len, {b}, "
                             f"{self.config.hidden_size}), got {[tuple(m.shape) for m in mems]}")
        if target_mapping is not None and (target_mapping.dim() != 3 or target_mapping.shape[::2] != (b, t)):
            raise ValueError(f"target_mapping has shape {tuple(target_mapping.shape)}; expected ({b}, num_predict, {t})")
        if token_type_ids is not None and token_type_ids.shape != (b, t):
            raise ValueError(f"token_type_ids has shape {tuple(token_type_ids.shape)} but input_ids has {(b, t)}")
        if use_mems is None:  # transformers' defaults, and the checkpoint's own when its config.json has them
            use_mems = bool(self.config.extra.get("use_mems_train", False) if self.training
                            else self.config.extra.get("use_mems_eval", True))
        device = (input_ids if input_ids is not None else inputs_embeds).device
        mask_h, mask_g = stream_masks(t, mlen, b, self.config.causal, attention_mask, perm_mask, device)
        table, index = self.xl.positions(t, mlen, device)
        pos_h = XLPositions(table, index, segment_matrix(token_type_ids, mlen), mask_h)
        pos_g = pos_h.for_mask(mask_g)
        h = self.embeddings(input_ids, None, None, inputs_embeds)
        g = self.xl.query_stream(b, target_mapping.size(1)) if target_mapping is not None else None
        past = [m.transpose(0, 1) for m in mems] if mems is not None else [None] * len(self.layers)
        new_mems, hidden_states, attentions = [], [], []
        for layer, mem in zip(self.layers, past):
            if use_mems:
                new_mems.append(cache_mems(mem, h, self.xl.mem_len, self.xl.reuse_len).transpose(0, 1))
            hidden_states += [h] if g is None else [h, g]
            context = h if mem is None else torch.cat([mem, h], dim=1)
            h_next, w = layer.stream(h, context, pos_h, need_weights=output_attentions)
            if g is not None:
                g, w_g = layer.stream(g, context, pos_g, target_mapping, need_weights=output_attentions)
                w = (w, w_g)
            h = h_next
            attentions.append(w)
        hidden_states += [h] if g is None else [h, g]
        return ModelOutput(last_hidden_state=self.xl.dropout(g if g is not None else h),
                           hidden_states=tuple(hidden_states) if output_hidden_states else None,
                           attentions=tuple(attentions) if output_attentions else None,
                           extra={"mems": tuple(new_mems) if use_mems else None})

    def _router_outputs(self, attention_mask, varlen, t: int) -> dict:
        """An MoE stack's router logits per layer, (B*T, E) as transformers returns them (zeros at padding
        of an unpadded batch), the load-balancing loss over real tokens, and `router_loss`: what training adds
        to the LM loss (the aux and z losses times their coefficients)."""
        cfg = self.config
        logits = collect_router_logits(self.layers)
        if varlen is not None:
            logits = tuple(varlen.pad(lg).flatten(0, 1) for lg in logits)
        mask = attention_mask[:, -t:] if attention_mask is not None else None
        aux = load_balancing_loss(logits, cfg.num_experts, cfg.experts_top_k, mask)
        router_loss = cfg.router_aux_loss_coef * aux
        if cfg.router_z_loss_coef:
            router_loss = router_loss + cfg.router_z_loss_coef * router_z_loss(logits)
        return {"router_logits": logits, "aux_loss": aux, "router_loss": router_loss}

    def _is_local(self, layer_idx: int) -> bool:
        """Which layers use the sliding window. Every layer, unless `global_every` (ModernBERT: every
        3rd layer is global) is set in config.extra."""
        if not self.config.sliding_window:
            return False
        every = self.config.extra.get("global_every")
        return not (every and layer_idx % every == 0)
