"""Pieces of a fine-tuning run's stages that stand on their own (tasks/finetune.py holds the run): task
distillation's student, the SetFit stage, and the summary a run writes to metrics.json."""
from __future__ import annotations

import os
import sys
import time

from .finetune_options import FinetuneOptions


def first_process() -> bool:
    """Whether this process speaks for the run: always, but under torchrun only rank 0 (RANK is set before the
    process group exists, and every rank runs the same stages and would say the same lines)."""
    return os.environ.get("RANK", "0") == "0"


def _say(line: str) -> None:
    """A note for the user on stderr (stdout stays the JSON summary), said once (first_process)."""
    if first_process():
        print(line, file=sys.stderr, flush=True)


def distillation_student(teacher, options: FinetuneOptions, name: str):
    """Task distillation (Sanh et al. 2019, section 3 applied to a task): `teacher` is a model already fine-tuned on
    the task; a student of options.student_layers layers starts from every other teacher layer (and the teacher's
    head), or, narrower (student_width / student_heads), from the teacher's embeddings, pooler and classifier
    through a PCA basis with random layers (init_narrow_student). Returns (the student, the Distillation that
    trains it on the teacher's soft targets, the labels and its hidden states, options.distill's terms)."""
    from ..objectives.distill import DistillConfig, Distillation, init_student_from_teacher, student_config
    from ..objectives.layer_distill import init_narrow_student
    teacher = teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    o = options
    net = type(teacher)(student_config(teacher.config, o.student_layers, o.student_width, o.student_heads))
    basis = None
    if net.config.hidden_size != teacher.config.hidden_size:
        basis, kept = init_narrow_student(net, teacher)
        _say(f"finetune {name}: a {net.config.hidden_size}-wide student: embeddings, pooler and classifier from the "
             f"teacher's through the top {net.config.hidden_size} principal directions of its token embeddings "
             f"({100 * kept:.1f}% of their variance), layers random")
    else:
        init_student_from_teacher(net, teacher)
    return net, Distillation(net, teacher, o.distill or DistillConfig(), basis)


def setfit_stage(name: str, net, feats: list[dict], pad_id: int, steps: int, pairing: str, why: str,
                 seed: int, precision: str = "fp32") -> None:
    """SetFit's contrastive stage on `net`'s encoder (tasks/setfit.py, Tunstall et al. 2022), and its report."""
    from .setfit import SETFIT_BATCH, SETFIT_LR, contrastive_stage
    t0 = time.time()
    losses = contrastive_stage(net, feats, pad_id, steps, seed=seed, pairing=pairing, precision=precision)
    k = max(1, len(losses) // 10)
    pairs = (f"{steps * SETFIT_BATCH:,} pairs" if pairing == "sampled" else
             f"every pair in batches of {SETFIT_BATCH} sentences, {steps * SETFIT_BATCH * (SETFIT_BATCH - 1) // 2:,} pairs")
    _say(f"finetune {name}: SetFit stage: {steps} pair steps ({pairs} of training sentences, lr {SETFIT_LR:g}), "
         f"because {why}; pair loss {sum(losses[:k]) / k:.3f} -> {sum(losses[-k:]) / k:.3f}, "
         f"{time.time() - t0:.0f} s")


def summarize(run) -> dict:
    """metrics.json of a finished FinetuneRun: what ran (the resolved options), how long, the kept model's scores."""
    o, net, best = run.options, run.net, run.best
    pooled = type(net).__name__ == "SequenceClassification"
    teacher, n_labeled = run.distill_teacher, run.n_labeled
    return {
        "task": run.task.name, "model": str(run.model), "train": run.train_path, "valid": run.valid_desc,
        "train_examples": len(run.train_ex), "valid_examples": len(run.valid_ex), "steps": run.step,
        "best_step": best.get("step"),
        **({"max_minutes": o.max_minutes, "stopped_by_time": run.stopped_by == "max_minutes"} if o.max_minutes else {}),
        "epochs": run.epochs, "lr": run.lr, "batch_size": run.batch_size,
        "max_length": run.max_length, "seed": o.seed, "freeze_embeddings": run.freeze_embeddings,
        "precision": run.trainer.precision,  # "auto" resolved
        **({"layer_decay": o.layer_decay} if o.layer_decay != 1.0 else {}),
        **({"ema": run.ema} if run.ema else {}),
        **({"pooling": net.config.classifier_pooling, "head_init": run.head_init, "setfit_steps": run.setfit_steps,
            **({"setfit_pairs": run.setfit_pairs} if run.setfit_steps else {})}
           if pooled else {}),
        **({"from_scratch": True} if o.from_scratch else {}),
        **({"labeled_examples": n_labeled, "self_training": run.self_info} if run.self_train else {}),
        **({"teacher": {**run.teacher_info, "kd": run.kd, "temperature": run.temperature}} if run.lm_teacher else {}),
        **({"self_distillation": {"weight": o.self_distill, "temperature": run.self_distill_t,
                                  "teacher": str(run.teacher_dir),
                                  "teacher_best_step": run.teacher_summary.get("best_step"),
                                  **{f"teacher_{k}": v for k, v in run.teacher_summary.items()
                                     if k.startswith("eval_")}}} if o.self_distill else {}),
        **({"lora": o.lora, "trainable_parameters": sum(p.numel() for p in net.parameters() if p.requires_grad)}
           if o.lora else {}),
        **({"student_layers": o.student_layers, "teacher_layers": teacher.config.num_layers,
            "student_width": net.config.hidden_size, "student_heads": net.config.num_heads,
            "distill": vars(run.trained.cfg),
            "parameters": net.num_parameters(), "teacher_parameters": teacher.num_parameters()}
           if teacher is not None else {}),
        "wall_time_s": round(run.trained_at - run.started, 1),
        **{k: v for k, v in best.items() if k.startswith("eval_")},
        **run.tested}
