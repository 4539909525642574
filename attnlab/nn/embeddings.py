"""Input embeddings: token + absolute position + segment, then LayerNorm and dropout (BERT, §3.2 and
Figure 2), plus XLM's language embedding when the config has languages (Lample & Conneau 2019, §3.1). RoPE and relative-bias models add no position vector here; ALBERT factorizes the token
embedding (size E) and projects it up to the hidden size H (Lan et al. 2020, §3.1)."""
from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig
from .dropout import Dropout
from .norms import make_norm
from .positions import sinusoidal_table


class Embeddings(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e = config.emb_size
        self.tok = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.pos = nn.Embedding(config.max_position_embeddings, e) if config.position == "learned" else None
        if config.position == "sinusoidal":
            table = sinusoidal_table(config.max_position_embeddings, e, halves=config.extra.get("sinusoid_halves", False),
                                     fairseq=config.extra.get("sinusoid_fairseq", False), padding_idx=config.pad_token_id)
            self.register_buffer("sinusoid", table, persistent=False)
        else:
            self.sinusoid = None
        self.seg = nn.Embedding(config.type_vocab_size, e) if config.type_vocab_size > 0 else None
        self.lang = nn.Embedding(config.num_languages, e) if config.num_languages > 0 else None
        self.norm = make_norm(config, e) if config.embedding_norm else None
        self.dropout = Dropout(config.dropout)
        self.project = nn.Linear(e, config.hidden_size) if e != config.hidden_size else None
        self.max_positions = config.max_position_embeddings
        self.scale = float(e) ** 0.5 if config.scale_embeddings else None

    def forward(self, input_ids: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                langs: torch.Tensor | None = None) -> torch.Tensor:
        x = self.tok(input_ids) if inputs_embeds is None else inputs_embeds
        if self.scale is not None and inputs_embeds is None:
            # Vaswani et al. 2017, §3.4: embeddings times sqrt(d_model), so that they are not drowned by
            # the unit-amplitude sinusoids added next (the same matrix is the output projection)
            x = x * self.scale
        if self.pos is not None or self.sinusoid is not None:
            # reading the max back is a sync a compiled graph cannot hold; compiled callers check capacity first
            top = int(position_ids.max()) if position_ids.numel() and not torch.compiler.is_compiling() else 0
            if top >= self.max_positions:
                raise ValueError(f"sequence needs position {top}, but max_position_embeddings="
                                 f"{self.max_positions}; truncate the input (e.g. --max-length {self.max_positions})")
            x = x + (self.pos(position_ids) if self.pos is not None else self.sinusoid[position_ids].to(x.dtype))
        if self.seg is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(x[..., 0], dtype=torch.long)
            x = x + self.seg(token_type_ids)
        if self.lang is not None and langs is not None:  # no langs: none added, as transformers' XLM
            x = x + self.lang(langs)
        if self.norm is not None:
            x = self.norm(x)
        x = self.dropout(x)
        return self.project(x) if self.project is not None else x
