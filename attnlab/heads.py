"""Heads that sit on a backbone, and the wrappers that pair them.

A head is a small module that reads hidden states; a wrapper is `backbone + heads (+ loss when labels
are given)`. The backbone knows nothing of them (DESIGN: heads and objectives wrap a backbone).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .models.base import Model, ModelOutput
from .models.encoder import Encoder
from .nn import make_norm
from .nn.feedforward import activation_fn


class MLMHead(nn.Module):
    """Masked-LM head (BERT §3.1, Task #1): dense + activation + LayerNorm, then a projection onto the
    vocabulary whose matrix is the input embedding (tied), plus a per-token output bias."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e = config.emb_size  # ALBERT predicts in the factorized embedding space
        self.dense = nn.Linear(config.hidden_size, e)
        self.act = activation_fn(config.activation if not config.is_glu else "gelu")
        self.norm = make_norm(config, e)
        self.decoder = nn.Linear(e, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(self.act(self.dense(hidden)))) + self.bias


class NSPHead(nn.Module):
    """Next-sentence prediction (BERT §3.1, Task #2): IsNext / NotNext from the pooled [CLS] vector.
    ALBERT's sentence-order prediction uses the same shape."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.linear = nn.Linear(config.hidden_size, 2)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.linear(pooled)


class _WithBackbone(Model):
    """Shared plumbing of wrappers: a backbone built from the same config, weights tied after init."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.backbone = Encoder(config)

    def _run_backbone(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                      inputs_embeds=None, output_attentions=False, output_hidden_states=False) -> ModelOutput:
        return self.backbone(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                             position_ids=position_ids, inputs_embeds=inputs_embeds,
                             output_attentions=output_attentions, output_hidden_states=output_hidden_states)


class MaskedLM(_WithBackbone):
    """Encoder + MLM head: the equivalent of BertForMaskedLM."""
    hf_architecture = "BertForMaskedLM"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.mlm = MLMHead(config)
        self.init_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.mlm.decoder.weight = self.backbone.embeddings.tok.weight

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels: torch.Tensor | None = None, output_attentions=False,
                output_hidden_states=False) -> ModelOutput:
        out = self._run_backbone(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                                 output_attentions, output_hidden_states)
        out.logits = self.mlm(out.last_hidden_state)
        if labels is not None:  # -100 marks positions that were not selected for prediction
            out.loss = F.cross_entropy(out.logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return out


class PreTraining(MaskedLM):
    """Encoder + MLM head + NSP head: the equivalent of BertForPreTraining. `logits` are the MLM
    logits, `nsp_logits` the next-sentence logits; the loss is their sum when both labels are given."""
    hf_architecture = "BertForPreTraining"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.nsp = NSPHead(config)
        self.init_weights()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None, output_attentions=False,
                output_hidden_states=False) -> ModelOutput:
        out = super().forward(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, labels,
                              output_attentions, output_hidden_states)
        if out.pooler_output is None:
            raise ValueError("the NSP head reads the pooled [CLS] vector; this config has pooler=False")
        out.extra["nsp_logits"] = self.nsp(out.pooler_output)
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(out.extra["nsp_logits"].float(), next_sentence_label)
            out.loss = nsp_loss if out.loss is None else out.loss + nsp_loss
        return out
