"""Pretraining objectives: how examples are cut from token shards, batched, and scored.

`build_objective(cfg, tokenizer, seq_len)` returns an `Objective` bundling the four pieces the data
stream and the Trainer need:
    examples(shards, rng)     one epoch of examples        (mlm.packed_blocks, nsp.pair_examples, clm.clm_windows)
    collate(examples, rng)    a batch of tensors, masked   (mlm.mlm_collate, clm.clm_collate)
    loss(model, batch)        (loss, sums for evaluation)  (mlm.mlm_loss, clm.clm_loss)
    metrics(sums)             {"loss", "accuracy", ...}
and the model wrapper to train: MaskedLM (mlm), PreTraining (mlm+nsp, mlm+sop), CausalLM (clm),
Electra (electra: generator + discriminator), Seq2SeqLM (denoise: BART, objectives/denoise.py),
PermutationLM (plm: XLNet's permutation LM, objectives/plm.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

KINDS = ("mlm", "mlm+nsp", "mlm+sop", "clm", "electra", "denoise", "plm")


@dataclass
class ObjectiveConfig:
    kind: str = "mlm"
    mask_prob: float = 0.15          # share of tokens chosen for prediction
    whole_word: bool = False         # choose whole words (all their WordPiece pieces) at once
    sparse_prediction: bool = True   # run the MLM head on the chosen positions only
    short_seq_prob: float = 0.1      # NSP/SOP: share of pairs built to a random shorter length
    random_windows: bool = False     # CLM: windows at random offsets (nanoGPT) instead of a shuffled tiling
    # electra: the generator's width divisor and depth fraction (ELECTRA §3.2: 1/4 width; DeBERTa-v3: same
    # width, half depth), and how it shares the token embeddings: "shared" (ELECTRA) or "gdes" (DeBERTa-v3's
    # gradient-disentangled sharing, He et al. 2023 §3.2)
    generator_divisor: int = 4
    generator_depth: float = 1.0
    embedding_sharing: str = "shared"
    # denoise (BART, Lewis et al. 2019 §2.2): shares of tokens masked / deleted / infilled in Poisson spans,
    # probabilities of sentence permutation and document rotation; default: BART-large's infilling + permutation
    noise_mask: float = 0.0
    noise_delete: float = 0.0
    noise_infill: float = 0.3
    poisson_lambda: float = 3.0
    noise_permute: float = 1.0
    noise_rotate: float = 0.0
    # plm (XLNet, Yang et al. 2019 §2.3): predict the last 1/plm_k of each sampled factorization order (K = 6, §3.1)
    plm_k: float = 6.0

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"objective.kind={self.kind!r}: expected one of {', '.join(KINDS)}")
        if not 0 < self.mask_prob < 1:
            raise ValueError(f"objective.mask_prob={self.mask_prob}: must lie in (0, 1)")
        if not 0 <= self.short_seq_prob <= 1:
            raise ValueError(f"objective.short_seq_prob={self.short_seq_prob}: must lie in [0, 1]")
        if self.kind == "denoise":
            self.noise().validate()
        if not self.plm_k >= 1:
            raise ValueError(f"objective.plm_k={self.plm_k}: must be at least 1 (predict the last 1/K of each order)")
        if self.embedding_sharing not in ("shared", "gdes"):
            raise ValueError(f"objective.embedding_sharing={self.embedding_sharing!r}: expected shared or gdes")
        if self.generator_divisor < 1 or not 0 < self.generator_depth <= 1:
            raise ValueError(f"objective.generator_divisor={self.generator_divisor} must be >= 1 and "
                             f"objective.generator_depth={self.generator_depth} must lie in (0, 1]")

    def noise(self):
        from .denoise import NoiseConfig
        return NoiseConfig(mask=self.noise_mask, delete=self.noise_delete, infill=self.noise_infill,
                           poisson_lambda=self.poisson_lambda, permute=self.noise_permute, rotate=self.noise_rotate)


@dataclass
class Objective:
    kind: str
    examples: Callable
    collate: Callable
    loss: Callable
    metrics: Callable
    model_class: type


def build_objective(cfg: ObjectiveConfig, tokenizer, seq_len: int) -> Objective:
    from ..heads import MaskedLM, PreTraining
    from . import clm, mlm, nsp
    cfg.validate()
    if cfg.kind == "clm":
        eot = next((tokenizer.backend.token_to_id(tokenizer.special_tokens[r]) for r in ("eos_token", "sep_token")
                    if r in tokenizer.special_tokens), None)
        windows = partial(clm.clm_windows, seq_len=seq_len, eot_id=eot, random_windows=cfg.random_windows)
        return Objective(cfg.kind, lambda shards, rng: windows(shards, rng=rng), clm.clm_collate,
                         clm.clm_loss, clm.clm_metrics, clm.CausalLM)
    if cfg.kind == "denoise":
        return _denoise(cfg, tokenizer, seq_len)
    if cfg.kind == "plm":  # XLNet: the model reads the real tokens; the order lives in perm_mask (objectives/plm.py)
        from ..heads import PermutationLM
        from . import plm
        cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        if cls_id is None or sep_id is None:
            raise ValueError(f"tokenizer {tokenizer.name}: objective.kind=plm packs blocks with [CLS]- and [SEP]-like "
                             "tokens (cls_token, sep_token)")
        blocks = partial(mlm.packed_blocks, seq_len=seq_len, cls_id=cls_id, sep_id=sep_id)
        collate = partial(plm.plm_collate, k=cfg.plm_k, pad_id=tokenizer.pad_token_id or 0)
        return Objective(cfg.kind, lambda shards, rng: blocks(shards, rng=rng), lambda ex, rng: collate(ex, rng=rng),
                         plm.plm_loss, plm.plm_metrics, PermutationLM)
    vocab = mlm.Vocab.from_tokenizer(tokenizer)
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls_id is None or sep_id is None:
        raise ValueError(f"tokenizer {tokenizer.name}: masked LM needs [CLS]- and [SEP]-like tokens "
                         "(cls_token, sep_token)")
    collate = partial(mlm.mlm_collate, vocab=vocab, prob=cfg.mask_prob, whole_word=cfg.whole_word,
                      pad_id=tokenizer.pad_token_id or 0, sparse=cfg.sparse_prediction)
    if cfg.kind == "electra":  # replaced-token detection (Clark et al. 2020): see objectives/electra.py
        from . import electra
        blocks = partial(mlm.packed_blocks, seq_len=seq_len, cls_id=cls_id, sep_id=sep_id)
        collate = partial(electra.electra_collate, vocab=vocab, prob=cfg.mask_prob, pad_id=tokenizer.pad_token_id or 0)
        def build(config):  # the generator and the embedding sharing of the recipe
            gen = electra.generator_config(config, cfg.generator_divisor, cfg.generator_depth)
            return electra.Electra(config, gen, sharing=cfg.embedding_sharing)
        return Objective(cfg.kind, lambda shards, rng: blocks(shards, rng=rng), lambda ex, rng: collate(ex, rng=rng),
                         electra.electra_loss, electra.electra_metrics, build)
    if cfg.kind == "mlm":
        examples = partial(mlm.packed_blocks, seq_len=seq_len, cls_id=cls_id, sep_id=sep_id)
        model_class = MaskedLM
    else:
        examples = partial(nsp.pair_examples, max_len=seq_len, cls_id=cls_id, sep_id=sep_id,
                           task=cfg.kind.split("+")[1], short_seq_prob=cfg.short_seq_prob)
        model_class = PreTraining
    return Objective(cfg.kind, lambda shards, rng: examples(shards, rng=rng), lambda ex, rng: collate(ex, rng=rng),
                     mlm.mlm_loss, mlm.mlm_metrics, model_class)


def _denoise(cfg: ObjectiveConfig, tokenizer, seq_len: int) -> Objective:
    from ..models.seq2seq import Seq2SeqLM
    from . import denoise
    ids = {role: getattr(tokenizer, f"{role}_token_id") for role in ("bos", "eos", "pad", "mask")}
    absent = [role for role, i in ids.items() if i is None]
    if absent:
        raise ValueError(f"tokenizer {tokenizer.name}: objective.kind=denoise needs {', '.join(absent)} tokens "
                         "(a BART/RoBERTa vocabulary: <s> </s> <pad> <mask>; attnlab tokenizer train --kind bart)")
    noise_cfg = cfg.noise()
    collate = partial(denoise.denoise_collate, cfg=noise_cfg, bos_id=ids["bos"], eos_id=ids["eos"],
                      pad_id=ids["pad"], mask_id=ids["mask"], max_len=seq_len)
    return Objective(cfg.kind, lambda shards, rng: denoise.document_chunks(shards, seq_len, rng),
                     lambda ex, rng: collate(ex, rng=rng), denoise.denoise_loss, denoise.denoise_metrics, Seq2SeqLM)
