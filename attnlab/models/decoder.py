"""A causal language model: the `Encoder` stack with `causal=True` plus an LM head.

There is no second Transformer implementation for decoders: GPT-2 and LLaMA are the same `Encoder`
with different config switches (see `attnlab.config`), and `CausalLM` only adds the projection onto
the vocabulary, P(x_t | x_<t) = softmax(h_t W_vocab^T), with W_vocab the token embedding when tied
(Press & Wolf 2017; GPT-2 and SmolLM2 tie, LLaMA-7B does not).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from .base import Model, ModelOutput
from .encoder import Encoder

# The Hugging Face class each family's LM maps onto (written into config.json "architectures").
HF_ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "openai-gpt": "OpenAIGPTLMHeadModel",
                    "gpt_neo": "GPTNeoForCausalLM", "gpt_neox": "GPTNeoXForCausalLM", "ctrl": "CTRLLMHeadModel",
                    "mistral": "MistralForCausalLM", "mixtral": "MixtralForCausalLM"}


class CausalLM(Model):
    """Decoder stack + LM head. `forward(..., labels=ids)` gives the next-token loss (shifted inside)."""

    def __init__(self, config: ModelConfig) -> None:
        if not config.causal:
            raise ValueError(f"CausalLM needs causal=True (model_type={config.model_type!r} has causal=False)")
        super().__init__(config)
        self.backbone = Encoder(config)
        # CTRL's output projection has a bias of its own (Keskar et al. 2019), even with tied weights
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=bool(config.extra.get("lm_head_bias")))
        self.init_weights()

    @property
    def hf_architecture(self) -> str:  # per family, not per class: one class serves every decoder
        return HF_ARCHITECTURES.get(self.config.model_type, "CausalLM")

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.backbone.embeddings.tok.weight

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                past_key_values=None, use_cache: bool = False, labels: torch.Tensor | None = None,
                output_attentions: bool = False, output_hidden_states: bool = False,
                logits_to_keep: int = 0, document_ids: torch.Tensor | None = None) -> ModelOutput:
        """logits_to_keep > 0 projects only the last that many positions (generation needs one; the
        vocabulary projection is the single largest matmul of a small model)."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            inputs_embeds=inputs_embeds, past_key_values=past_key_values, use_cache=use_cache,
                            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                            document_ids=document_ids)
        hidden = out.last_hidden_state
        out.logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
        if labels is not None:  # position t predicts token t+1; -100 marks ignored targets
            out.loss = F.cross_entropy(out.logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                                       ignore_index=-100)
            if "router_loss" in out.extra:  # mixture of experts: + the weighted load-balancing (and z) loss
                out.loss = out.loss + out.extra["router_loss"]
        return out
