"""Heads that sit on a backbone, and the wrappers that pair them.

A head is a small module that reads hidden states; a wrapper is `backbone + heads (+ loss when labels
are given)`. The backbone knows nothing of them (DESIGN: heads and objectives wrap a backbone).
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .models.base import Model, ModelOutput
from .models.encoder import Encoder
from .nn import make_norm
from .nn.dropout import Dropout
from .nn.feedforward import activation_fn


class MLMHead(nn.Module):
    """Masked-LM head (BERT §3.1, Task #1): dense + activation + LayerNorm, then a projection onto the
    vocabulary whose matrix is the input embedding (tied), plus a per-token output bias."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e = config.emb_size  # ALBERT predicts in the factorized embedding space
        # XLM's prediction layer has no transform, only the tied projection and its bias (extra.head_transform)
        self.transform = config.extra.get("head_transform", True)
        if self.transform:
            self.dense = nn.Linear(config.hidden_size, e, bias=config.bias)  # ModernBERT's head is bias-free too
            # RoBERTa, ELECTRA and ModernBERT fix the head's activation apart from the blocks' (extra.head_activation)
            self.act = activation_fn(config.extra.get("head_activation")
                                     or (config.activation if not config.is_glu else "gelu"))
            self.norm = make_norm(config, e)
        self.decoder = nn.Linear(e, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.transform:
            hidden = self.norm(self.act(self.dense(hidden)))
        return self.decoder(hidden) + self.bias


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

    uses_pooler = True  # HF's token-level heads build BERT with add_pooling_layer=False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        # extra.head_pooler: the pooler belongs to the classification head, not the backbone (DeBERTa:
        # DebertaV2Model has none, DebertaV2ForSequenceClassification has a ContextPooler)
        pooled = self.reads_pooler(config) and (config.pooler or bool(config.extra.get("head_pooler")))
        self.backbone = Encoder(config if pooled == config.pooler else replace(config, pooler=pooled))

    @classmethod
    def reads_pooler(cls, config: ModelConfig) -> bool:
        """Whether this head reads the backbone's pooler (else the backbone is built without one)."""
        return cls.uses_pooler

    def _run_backbone(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                      inputs_embeds=None, output_attentions=False, output_hidden_states=False,
                      langs=None) -> ModelOutput:
        extra = {"langs": langs} if langs is not None else {}  # only when given: another backbone need not take it
        return self.backbone(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                             position_ids=position_ids, inputs_embeds=inputs_embeds,
                             output_attentions=output_attentions, output_hidden_states=output_hidden_states, **extra)


class MaskedLM(_WithBackbone):
    """Encoder + MLM head: the equivalent of BertForMaskedLM."""
    hf_architecture = "BertForMaskedLM"
    uses_pooler = False  # as in HF's *ForMaskedLM: RoBERTa/ALBERT MLM checkpoints carry no pooler

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.mlm = MLMHead(config)
        self.init_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.mlm.decoder.weight = self.backbone.embeddings.tok.weight

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels: torch.Tensor | None = None, output_attentions=False,
                output_hidden_states=False, masked_positions: torch.Tensor | None = None,
                langs: torch.Tensor | None = None) -> ModelOutput:
        """masked_positions (bool, batch x seq): sparse prediction. Only those positions go through the
        head, so `logits` is (n_selected, vocab) and (batch, seq) labels are gathered the same way. The
        vocab projection is the largest matmul of a small model; pretraining predicts ~15% of tokens.
        langs (batch x seq): language ids for a backbone with language embeddings (XLM, TLM)."""
        out = self._run_backbone(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                                 output_attentions, output_hidden_states, langs)
        hidden = out.last_hidden_state
        if masked_positions is not None:
            hidden = hidden[masked_positions]
            if labels is not None and labels.shape == masked_positions.shape:
                labels = labels[masked_positions]
        out.logits = self.mlm(hidden)
        if labels is not None:  # -100 marks positions that were not selected for prediction
            out.loss = F.cross_entropy(out.logits.reshape(-1, out.logits.size(-1)).float(), labels.flatten(),
                                       ignore_index=-100)
        return out


class PreTraining(MaskedLM):
    """Encoder + MLM head + NSP head: the equivalent of BertForPreTraining. `logits` are the MLM
    logits, `nsp_logits` the next-sentence logits; the loss is their sum when both labels are given."""
    hf_architecture = "BertForPreTraining"
    uses_pooler = True  # NSP / SOP read the pooled [CLS] vector

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.nsp = NSPHead(config)
        self.init_weights()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None, output_attentions=False,
                output_hidden_states=False, masked_positions: torch.Tensor | None = None) -> ModelOutput:
        out = super().forward(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, labels,
                              output_attentions, output_hidden_states, masked_positions)
        if out.pooler_output is None:
            raise ValueError("the NSP head reads the pooled [CLS] vector; this config has pooler=False")
        out.extra["nsp_logits"] = self.nsp(out.pooler_output)
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(out.extra["nsp_logits"].float(), next_sentence_label)
            out.loss = nsp_loss if out.loss is None else out.loss + nsp_loss
        return out


class PermutationLM(_WithBackbone):
    """XLNet's LM (Yang et al. 2019, §2.3): backbone (position relative_xl) + a projection onto the vocabulary,
    tied to the input embedding, with its own bias; the equivalent of XLNetLMHeadModel. With `target_mapping`
    (B, M, T) the logits are the query stream's, (B, M, vocab), and `labels` are (B, M); without it they are
    the content stream's for every position. `mems` come back in `out.mems`."""
    hf_architecture = "XLNetLMHeadModel"
    uses_pooler = False

    def __init__(self, config: ModelConfig) -> None:
        if config.position != "relative_xl":
            raise ValueError(f"PermutationLM needs position='relative_xl' (XLNet), not {config.position!r}")
        super().__init__(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=True)
        self.init_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.backbone.embeddings.tok.weight

    def forward(self, input_ids=None, attention_mask=None, mems=None, perm_mask=None, target_mapping=None,
                token_type_ids=None, inputs_embeds=None, labels: torch.Tensor | None = None, use_mems=None,
                output_attentions=False, output_hidden_states=False) -> ModelOutput:
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                            inputs_embeds=inputs_embeds, mems=mems, perm_mask=perm_mask, target_mapping=target_mapping,
                            use_mems=use_mems, output_attentions=output_attentions,
                            output_hidden_states=output_hidden_states)
        out.logits = self.lm_head(out.last_hidden_state)
        if labels is not None:  # -100 marks prediction rows that carry no target
            out.loss = F.cross_entropy(out.logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return out


class RTDHead(nn.Module):
    """ELECTRA's replaced-token detection (Clark et al. 2020, §2): for every token, one logit saying
    "this token was replaced by the generator". Dense + activation, then a projection to one number."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation_fn(config.activation if not config.is_glu else "gelu")
        self.out = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.dense(hidden))).squeeze(-1)


class ReplacedTokenDetection(_WithBackbone):
    """Encoder + RTD head: ELECTRA's discriminator (ElectraForPreTraining). `logits` is (batch, seq);
    `labels` (1 = replaced, 0 = original) give a binary cross-entropy over the real (unpadded) tokens."""
    hf_architecture = "ElectraForPreTraining"
    uses_pooler = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.rtd = RTDHead(config)
        self.init_weights()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels: torch.Tensor | None = None, output_attentions=False,
                output_hidden_states=False) -> ModelOutput:
        out = self._run_backbone(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                                 output_attentions, output_hidden_states)
        out.logits = self.rtd(out.last_hidden_state)
        if labels is not None:
            keep = attention_mask.bool() if attention_mask is not None else torch.ones_like(labels, dtype=torch.bool)
            out.loss = F.binary_cross_entropy_with_logits(out.logits[keep].float(), labels[keep].float())
        return out


# ----------------------------------------------------------------------------------- fine-tuning heads
def num_labels(config: ModelConfig) -> int:
    """How many outputs a classification head has: the size of `id2label` when config.json names the
    labels, else `num_labels`, else 2 (the Hugging Face default)."""
    if config.extra.get("id2label"):
        return len(config.extra["id2label"])
    return int(config.extra.get("num_labels", 2))


def is_regression(config: ModelConfig) -> bool:
    """STS-B style: one real-valued output trained with MSE (HF infers the same from num_labels == 1)."""
    return config.extra.get("problem_type") == "regression" or num_labels(config) == 1


def _head_dropout(config: ModelConfig) -> nn.Dropout:
    p = config.extra.get("classifier_dropout")
    return Dropout(config.dropout if p is None else p)


class _Classifier(_WithBackbone):
    """Backbone + dropout + one linear layer onto `num_labels` outputs (BERT §4: "just one additional
    output layer"); subclasses choose which hidden states it reads."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.dropout = _head_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, num_labels(config))
        self.init_weights()


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The mean of `hidden` (batch, seq, dim) over the real tokens (attention_mask 1), [CLS] and [SEP]
    included, as sentence-transformers' mean pooling (Reimers & Gurevych 2019, §3): padding changes nothing."""
    if attention_mask is None:
        return hidden.mean(dim=1)
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


class SequenceClassification(_Classifier):
    """Encoder + dropout + linear on a sentence vector: BertForSequenceClassification (BERT §4.1) reads the
    pooled [CLS] vector (config.classifier_pooling "cls"); "mean" reads the masked mean of the last hidden
    states instead and has no pooler (sentence-transformers models such as all-MiniLM-L6-v2 were trained
    that way and ship none). One output with MSE loss for regression (STS-B), else cross-entropy over
    `num_labels` classes."""
    hf_architecture = "BertForSequenceClassification"

    @classmethod
    def reads_pooler(cls, config: ModelConfig) -> bool:
        return config.classifier_pooling == "cls"

    def sentence_vector(self, out: ModelOutput, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """What the classifier reads from the backbone's output `out` (before dropout)."""
        if self.config.classifier_pooling == "mean":
            return mean_pool(out.last_hidden_state, attention_mask)
        if out.pooler_output is None:
            raise ValueError("sequence classification reads the pooled [CLS] vector; this config has pooler=False "
                             "(or set classifier_pooling='mean')")
        return out.pooler_output

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels: torch.Tensor | None = None, output_attentions=False,
                output_hidden_states=False) -> ModelOutput:
        out = self._run_backbone(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                                 output_attentions, output_hidden_states)
        out.logits = self.classifier(self.dropout(self.sentence_vector(out, attention_mask)))
        if labels is not None:
            if is_regression(self.config):
                out.loss = F.mse_loss(out.logits.squeeze(-1).float(), labels.float())
            else:
                out.loss = F.cross_entropy(out.logits.float(), labels)
        return out


class TokenClassification(_Classifier):
    """Encoder + dropout + linear on every token: BertForTokenClassification (NER, BERT §5.3).
    Labels of -100 (padding, non-first sub-tokens, specials) are left out of the loss."""
    hf_architecture = "BertForTokenClassification"
    uses_pooler = False


    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels: torch.Tensor | None = None, output_attentions=False,
                output_hidden_states=False) -> ModelOutput:
        out = self._run_backbone(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                                 output_attentions, output_hidden_states)
        out.logits = self.classifier(self.dropout(out.last_hidden_state))
        if labels is not None:
            out.loss = F.cross_entropy(out.logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return out


class QuestionAnswering(_WithBackbone):
    """Encoder + one linear layer giving each token a start and an end score: BertForQuestionAnswering
    (BERT §4.2, SQuAD). `logits` is (batch, seq, 2); `start_logits` / `end_logits` are its halves. The loss
    is the mean of start and end cross-entropies; positions beyond the sequence are clamped and ignored."""
    hf_architecture = "BertForQuestionAnswering"
    uses_pooler = False

    def __init__(self, config: ModelConfig) -> None:
        if num_labels(config) != 2:  # transformers sizes qa_outputs by num_labels: a saved config must say 2
            config.extra = {k: v for k, v in config.extra.items() if k not in ("id2label", "label2id")}
            config.extra["num_labels"] = 2
        super().__init__(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None, output_attentions=False,
                output_hidden_states=False) -> ModelOutput:
        out = self._run_backbone(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                                 output_attentions, output_hidden_states)
        out.logits = self.qa_outputs(out.last_hidden_state)
        start, end = out.logits.unbind(-1)
        out.extra["start_logits"], out.extra["end_logits"] = start, end
        if start_positions is not None and end_positions is not None:
            t = start.shape[1]
            s, e = start_positions.clamp(0, t), end_positions.clamp(0, t)  # t = "outside", ignored
            out.loss = (F.cross_entropy(start.float(), s, ignore_index=t)
                        + F.cross_entropy(end.float(), e, ignore_index=t)) / 2
        return out
