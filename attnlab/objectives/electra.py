"""ELECTRA's replaced-token detection (Clark et al. 2020, §2).

A small masked-LM generator fills masked positions with tokens it samples; the discriminator, which is the
model we keep, then labels every token as original or replaced. Both are trained together:

    loss = L_MLM(generator) + λ · L_Disc(discriminator),   λ = 50 (§2; the value from Appendix A)

The discriminator learns from all tokens rather than the 15% that are masked, which is where ELECTRA's
efficiency comes from (§3). Details that matter:
- the generator is small (1/4 of the discriminator's width works best, §3.2, Figure 3) and shares the
  token, position and segment embeddings (and their LayerNorm) with the discriminator (§3.2);
- samples are drawn from the generator's softmax and not back-propagated through (§2: "we do not
  back-propagate the discriminator loss through the generator");
- a sampled token equal to the original counts as original (§2).
DeBERTa-v3 (He et al. 2023, §3-4) keeps the objective but changes the sharing: with `sharing="gdes"`
(gradient-disentangled embedding sharing) the discriminator reads E_D = sg(E_G) + E_Δ, so the RTD loss moves
only E_Δ (zeros at the start) and the generator's MLM loss alone shapes E_G: the two losses no longer pull
the one table in opposite directions ("tug-of-war", §3.2). Its generator has the discriminator's width and
half its depth (`generator_config(cfg, divisor=1, depth=0.5)`); the exported discriminator holds E_G + E_Δ.
Masking reuses BERT's `mask_tokens` with ELECTRA's rates: chosen positions get [MASK] 85% of the time and
stay unchanged otherwise (no random replacement; the released ELECTRA code's `mask`).

Worked example:
    original      the  cat  sat  on  the  mat
    masked        the [M]   sat  on  the  [M]       generator input (15% chosen, here 2)
    sampled            dog                 mat      generator samples at the chosen positions
    corrupted     the  dog  sat  on  the  mat       discriminator input
    is_replaced    0    1    0   0    0    0        "mat" was sampled back: original
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..heads import MaskedLM, ReplacedTokenDetection
from .mlm import IGNORE, Vocab, mask_tokens

SHARED_EMBEDDINGS = ("tok", "pos", "seg", "norm")  # the embedding project (E -> H) stays per network


def generator_config(discriminator: ModelConfig, divisor: int = 4, depth: float = 1.0) -> ModelConfig:
    """The generator: the discriminator's embeddings, 1/divisor of its width (§3.2) and `depth` times its
    layers (DeBERTa-v3: divisor 1, depth 0.5)."""
    heads = max(1, discriminator.num_heads // divisor)
    hidden = max(heads, discriminator.hidden_size // divisor)
    hidden -= hidden % heads
    return replace(discriminator, hidden_size=hidden, num_heads=heads, num_kv_heads=None, head_dim=None,
                   intermediate_size=max(1, discriminator.intermediate_size // divisor),
                   num_layers=max(1, round(discriminator.num_layers * depth)),
                   embedding_size=discriminator.emb_size, pooler=False, extra=dict(discriminator.extra))


class Electra(nn.Module):
    """Generator + discriminator with shared embeddings. The discriminator is what is kept and fine-tuned:
    `save(dir)` writes it as an ElectraForPreTraining directory and the generator as dir/generator
    (ElectraForMaskedLM). Training checkpoints hold both under our own names (no single HF class does)."""
    hf_architecture = ""  # a pair of models: checkpoints use attnlab's own tensor names

    def __init__(self, config: ModelConfig, generator: ModelConfig | None = None, rtd_weight: float = 50.0,
                 temperature: float = 1.0, sharing: str = "shared") -> None:
        super().__init__()
        if sharing not in ("shared", "gdes"):
            raise ValueError(f"objective.embedding_sharing={sharing!r}: expected shared or gdes")
        self.sharing = sharing
        config = replace(config, pooler=False, extra=dict(config.extra))
        self.discriminator = ReplacedTokenDetection(config)
        self.generator = MaskedLM(generator or generator_config(config))
        if self.generator.config.emb_size != config.emb_size:
            raise ValueError(f"generator embedding_size={self.generator.config.emb_size} must equal the "
                             f"discriminator's ({config.emb_size}) to share the embeddings")
        self.tie_weights()  # share the embeddings; the generator's output matrix is the shared token embedding
        self.rtd_weight, self.temperature = rtd_weight, temperature

    @property
    def config(self) -> ModelConfig:
        return self.discriminator.config

    def tie_weights(self) -> None:
        for name in SHARED_EMBEDDINGS:
            if name == "tok" and self.sharing == "gdes":
                continue  # the generator keeps E_G; the discriminator's own table is E_Δ
            setattr(self.generator.backbone.embeddings, name, getattr(self.discriminator.backbone.embeddings, name))
        self.generator.tie_weights()
        if self.sharing == "gdes" and getattr(self, "_gdes_hook", None) is None:
            with torch.no_grad():
                self.discriminator.backbone.embeddings.tok.weight.zero_()  # E_Δ = 0: E_D starts as E_G
            tok = self.discriminator.backbone.embeddings.tok
            self._gdes_hook = tok.register_forward_hook(self._add_generator_embedding)

    def _add_generator_embedding(self, module, args, out):
        """GDES: E_D[ids] = sg(E_G[ids]) + E_Δ[ids]; the stop-gradient keeps RTD gradients out of E_G."""
        return out + self.generator.backbone.embeddings.tok(args[0]).detach()

    def save(self, path) -> Path:
        """The discriminator (ElectraForPreTraining, or attnlab's own layout where the family has no RTD class)
        in path, the generator in path/generator. Under GDES the discriminator is written with E_G + E_Δ."""
        from ..interop.native import save_model
        path = Path(path)
        if self.sharing != "gdes":
            save_model(self.discriminator, path)
        else:
            tok = self.discriminator.backbone.embeddings.tok
            delta = tok.weight.detach().clone()
            self._gdes_hook.remove()
            try:
                with torch.no_grad():
                    tok.weight.add_(self.generator.backbone.embeddings.tok.weight)
                save_model(self.discriminator, path)
            finally:
                with torch.no_grad():
                    tok.weight.copy_(delta)
                self._gdes_hook = tok.register_forward_hook(self._add_generator_embedding)
        save_model(self.generator, path / "generator")
        return path

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """A saved state stores each shared tensor once (under the discriminator); point the generator's
        shared names at the same tensors before loading."""
        sd = dict(state_dict)
        for key in list(sd):
            parts = key.split(".")
            if key.startswith("discriminator.backbone.embeddings.") and parts[3] in SHARED_EMBEDDINGS \
                    and not (parts[3] == "tok" and self.sharing == "gdes"):
                sd.setdefault("generator" + key[len("discriminator"):], sd[key])
        owner = "generator" if self.sharing == "gdes" else "discriminator"  # whose table the generator predicts with
        if f"{owner}.backbone.embeddings.tok.weight" in sd and self.generator.config.tie_word_embeddings:
            sd.setdefault("generator.mlm.decoder.weight", sd[f"{owner}.backbone.embeddings.tok.weight"])
        return super().load_state_dict(sd, strict, assign)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, generator: torch.Generator | None = None) -> dict:
        """input_ids: masked ids; labels: original ids at the chosen positions, -100 elsewhere.
        Returns a dict with `loss` and its parts, the corrupted ids and the replaced labels."""
        chosen = labels != IGNORE
        gen = self.generator(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                             labels=labels, masked_positions=chosen)
        with torch.no_grad():  # sampling is not differentiated (§2)
            probs = F.softmax(gen.logits.float() / self.temperature, dim=-1)
            sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            original = torch.where(chosen, labels, input_ids)
            corrupted = original.clone()
            corrupted[chosen] = sampled
            replaced = (corrupted != original).long()
        disc = self.discriminator(input_ids=corrupted, attention_mask=attention_mask, token_type_ids=token_type_ids,
                                  labels=replaced)
        with torch.no_grad():
            real = attention_mask.bool() if attention_mask is not None else torch.ones_like(chosen)
            disc_correct = (((disc.logits > 0).long() == replaced) & real).sum().float()
            gen_correct = (gen.logits.argmax(-1) == labels[chosen]).sum().float()
        return {"loss": gen.loss + self.rtd_weight * disc.loss, "mlm_loss": gen.loss.detach(),
                "rtd_loss": disc.loss.detach(), "corrupted": corrupted, "replaced": replaced,
                "rtd_logits": disc.logits, "sums": {
                    "mlm_loss_sum": gen.loss.detach() * chosen.sum(), "mlm_n": chosen.sum().float(),
                    "mlm_correct": gen_correct, "rtd_loss_sum": disc.loss.detach() * real.sum(),
                    "rtd_weighted_sum": self.rtd_weight * disc.loss.detach() * real.sum(),
                    "rtd_n": real.sum().float(), "rtd_correct": disc_correct,
                    "replaced_n": (replaced.bool() & real).sum().float()}}


def electra_collate(examples: list, vocab: Vocab, rng: np.random.Generator, prob: float = 0.15,
                    pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Stack or pad examples (arrays of ids, e.g. mlm.packed_blocks) and mask them ELECTRA's way."""
    length = max(len(e) for e in examples)
    ids = np.full((len(examples), length), pad_id, dtype=np.int64)
    valid = np.zeros(ids.shape, dtype=bool)
    for i, e in enumerate(examples):
        ids[i, :len(e)], valid[i, :len(e)] = e, True
    inputs, labels = mask_tokens(ids, vocab, rng, prob, mask_frac=0.85, random_frac=0.0, valid=valid)
    batch = {"input_ids": torch.from_numpy(inputs), "labels": torch.from_numpy(labels)}
    if not valid.all():
        batch["attention_mask"] = torch.from_numpy(valid.astype(np.int64))
    return batch


def electra_loss(model: Electra, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The Trainer's loss hook: (loss, sums for evaluation)."""
    out = model(**{k: v for k, v in batch.items() if k in ("input_ids", "labels", "attention_mask", "token_type_ids")})
    return out["loss"], out["sums"]


def electra_metrics(sums: dict[str, float]) -> dict[str, float]:
    mlm = sums["mlm_loss_sum"] / max(sums["mlm_n"], 1)
    rtd = sums["rtd_loss_sum"] / max(sums["rtd_n"], 1)
    return {"loss": mlm + sums["rtd_weighted_sum"] / max(sums["rtd_n"], 1), "mlm_loss": mlm, "rtd_loss": rtd,
            "mlm_accuracy": sums["mlm_correct"] / max(sums["mlm_n"], 1),
            "rtd_accuracy": sums["rtd_correct"] / max(sums["rtd_n"], 1),
            "replaced_fraction": sums["replaced_n"] / max(sums["rtd_n"], 1)}
