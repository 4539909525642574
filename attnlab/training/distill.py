"""`attnlab distill --corpus`: distil a masked-LM teacher into a shallower student on a prepared corpus
(DistilBERT, Sanh et al. 2019). The losses live in attnlab/objectives/distill.py; this is the run."""
from __future__ import annotations

from pathlib import Path

import torch

from ..data.shards import open_shards
from ..data.stream import BatchStream, fixed_batches
from ..heads import MaskedLM
from ..interop.hf import config_from_hf_dir, load_pretrained
from ..interop.registry import FAMILIES
from ..models.base import Model
from ..objectives import ObjectiveConfig, build_objective
from ..objectives.distill import DistillConfig, distill_loss, init_student_from_teacher, student_config
from ..tokenizers import load_tokenizer
from .args import TrainArgs
from .trainer import Trainer


def distill_sums(student: Model, teacher: Model, batch: dict, cfg: DistillConfig) -> tuple[torch.Tensor, dict]:
    """`distill_loss` in the Trainer's (loss, sums) form; `distill_metrics` turns the sums into means."""
    loss, parts = distill_loss(student, teacher, batch, cfg)
    sums = {"loss_sum": loss.detach(), "n": torch.tensor(1.0)}
    sums.update({f"{k}_sum": v for k, v in parts.items()})
    return loss, sums


def distill_metrics(sums: dict[str, float]) -> dict[str, float]:
    n = max(sums["n"], 1)
    return {k.removesuffix("_sum"): v / n for k, v in sums.items() if k.endswith("_sum")}


def distill(teacher_dir, corpus, output_dir, student_layers: int, *, layout: str = "same", seq_len: int = 128,
            batch_size: int = 32, max_steps: int = 1000, lr: float = 5e-4, warmup_steps: int = 0,
            cfg: DistillConfig = DistillConfig(), eval_batches: int = 20, seed: int = 0,
            progress: bool = True) -> dict[str, float]:
    """Distil a masked-LM teacher (a Hugging Face directory) into a student with `student_layers` layers
    initialised from every other teacher layer, on a prepared corpus (attnlab prepare) with dynamic MLM
    masking. layout="distilbert" gives the student DistilBERT's layout (no token types, no pooler).
    The student's checkpoints go to output_dir/checkpoints/step-N/model (Hugging Face layout)."""
    if layout not in ("same", "distilbert"):
        raise ValueError(f"--layout {layout!r}: expected 'same' or 'distilbert'")
    cfg.validate()
    corpus = Path(corpus)
    t_cfg, _ = config_from_hf_dir(Path(teacher_dir))
    mlm_arch = next((n for n, (c, _) in FAMILIES[t_cfg.model_type].architectures.items() if c is MaskedLM), None)
    if mlm_arch is None:
        raise ValueError(f"{teacher_dir}: model_type={t_cfg.model_type!r} has no masked-LM head to distil from")
    teacher = load_pretrained(teacher_dir, architecture=mlm_arch)
    for p in teacher.parameters():
        p.requires_grad_(False)
    tokenizer = load_tokenizer(corpus / "tokenizer")
    if tokenizer.vocab_size > teacher.config.vocab_size:
        raise ValueError(f"{corpus}: tokenizer has {tokenizer.vocab_size} tokens, the teacher only "
                         f"{teacher.config.vocab_size}; prepare the corpus with the teacher's tokenizer")
    changes = dict(model_type="distilbert", type_vocab_size=0, pooler=False, norm_eps=1e-12) \
        if layout == "distilbert" else {}
    student = MaskedLM(student_config(teacher.config, student_layers, **changes))
    init_student_from_teacher(student, teacher)
    objective = build_objective(ObjectiveConfig(kind="mlm"), tokenizer, seq_len)
    train = BatchStream(open_shards(corpus, "train"), objective.examples, objective.collate, batch_size, seed=seed)
    heldout = open_shards(corpus, "heldout")
    evals = fixed_batches(heldout, objective.examples, objective.collate, batch_size, seed=seed,
                          max_batches=eval_batches) if heldout else None
    args = TrainArgs(output_dir=str(output_dir), max_steps=max_steps, lr=lr, warmup_steps=warmup_steps,
                     seed=seed, progress=progress, log_every=max(1, min(10, max_steps)))
    trainer = Trainer(student, args, train, loss_fn=lambda model, batch: distill_sums(model, teacher, batch, cfg),
                      eval_data=evals, metrics_fn=distill_metrics)
    return trainer.train()
