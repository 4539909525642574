"""Knowledge distillation as DistilBERT does it (Sanh et al. 2019, §2-3; Hinton et al. 2015).

The student is trained on a linear combination of three losses:
    L = α_ce · L_ce + α_task · L_task + α_cos · L_cos
- L_ce: the teacher's soft targets. KL(softmax(z_t / T) ‖ softmax(z_s / T)) · T². Softening with a
  temperature T > 1 exposes the teacher's "dark knowledge" (how wrong answers rank); the T² keeps the
  gradient scale independent of T (Hinton et al. 2015, §2).
- L_task: the usual loss on hard labels (masked LM during pretraining distillation, or a task's labels).
- L_cos: cosine distance between student and teacher hidden states, aligning their directions (§2).
DistilBERT's weights were α_ce = 5, α_task (MLM) = 2, α_cos = 1.

The student is the teacher with fewer layers and is initialised from it, one layer out of two (§2:
"we initialize the student from the teacher by taking one layer out of two").

Worked example of the soft-target loss, T = 2, one position, two classes:
    teacher logits (2, 0) -> softmax(/2) = (0.731, 0.269); student logits (0, 0) -> (0.5, 0.5)
    KL = 0.731·ln(0.731/0.5) + 0.269·ln(0.269/0.5) = 0.1109;  × T² = 0.4438
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..models.base import Model


def soft_target_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 2.0) -> torch.Tensor:
    """KL(teacher ‖ student) on temperature-softened distributions, times T², averaged over the rows
    (every leading dimension is a row: positions for MLM, examples for classification)."""
    v = student_logits.size(-1)
    s = F.log_softmax(student_logits.reshape(-1, v).float() / temperature, dim=-1)
    t = F.log_softmax(teacher_logits.reshape(-1, v).float() / temperature, dim=-1)
    return F.kl_div(s, t, reduction="batchmean", log_target=True) * temperature ** 2


def hidden_cosine_loss(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor,
                       mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of 1 - cos(h_s, h_t) over the real tokens (DistilBERT's cosine embedding loss)."""
    if student_hidden.size(-1) != teacher_hidden.size(-1):
        raise ValueError(f"hidden-state cosine needs equal widths; student has {student_hidden.size(-1)}, "
                         f"teacher {teacher_hidden.size(-1)} (set alpha_cos=0 for a narrower student)")
    cos = F.cosine_similarity(student_hidden.float(), teacher_hidden.float(), dim=-1)
    if mask is not None:
        cos = cos[mask.bool()]
    return (1 - cos).mean()


def student_layers(teacher_layers: int, student_layers: int) -> list[int]:
    """Which teacher layers initialise the student: one out of two for half the depth (0, 2, 4, ...);
    for other ratios, evenly spaced from layer 0."""
    if not 0 < student_layers <= teacher_layers:
        raise ValueError(f"student layers must be between 1 and the teacher's {teacher_layers}, got {student_layers}")
    return [i * teacher_layers // student_layers for i in range(student_layers)]


def student_config(teacher: ModelConfig, num_layers: int, **changes) -> ModelConfig:
    """The teacher's config with fewer layers (and any other `changes`, e.g. model_type="distilbert",
    type_vocab_size=0, pooler=False for a DistilBERT-layout student)."""
    return replace(teacher, num_layers=num_layers, extra=dict(teacher.extra), **changes)


def init_student_from_teacher(student: Model, teacher: Model, layers: list[int] | None = None) -> list[int]:
    """Copy embeddings, the chosen teacher layers, final norm, pooler and heads into the student wherever
    names and shapes agree (a DistilBERT-layout student simply has no segment table or pooler to fill).
    Returns the teacher layer indices used."""
    s_sd, t_sd = student.state_dict(), teacher.state_dict()
    prefix = "backbone." if hasattr(student, "backbone") else ""
    s_n = student.config.num_layers
    layers = layers or student_layers(teacher.config.num_layers, s_n)
    if len(layers) != s_n:
        raise ValueError(f"{len(layers)} teacher layers given for a {s_n}-layer student")
    t_prefix = "backbone." if hasattr(teacher, "backbone") else ""
    with torch.no_grad():
        for key, value in s_sd.items():
            body = key[len(prefix):] if key.startswith(prefix) else None
            if body is not None and body.startswith("layers."):
                i, rest = body[len("layers."):].split(".", 1)
                source = f"{t_prefix}layers.{layers[int(i)]}.{rest}"
            elif body is not None:
                source = t_prefix + body
            else:
                source = key  # a head
            if source in t_sd and t_sd[source].shape == value.shape:
                value.copy_(t_sd[source])
    return layers


@dataclass
class DistillConfig:
    temperature: float = 2.0
    alpha_ce: float = 5.0     # soft targets
    alpha_task: float = 2.0   # hard labels (MLM or the task's)
    alpha_cos: float = 1.0    # hidden-state directions

    def validate(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"distill temperature={self.temperature}: must be positive")
        if min(self.alpha_ce, self.alpha_task, self.alpha_cos) < 0:
            raise ValueError("distill weights alpha_ce, alpha_task, alpha_cos must be non-negative")


def distill_loss(student: Model, teacher: Model, batch: dict, cfg: DistillConfig = DistillConfig()
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One batch of DistilBERT's loss for any wrapper with `logits` (MaskedLM, SequenceClassification, ...).
    For MLM batches with `masked_positions`, both networks predict only there. Returns (loss, parts)."""
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids",
                                                       "masked_positions")}
    want_hidden = cfg.alpha_cos > 0
    teacher.eval()
    with torch.no_grad():
        t_out = teacher(**_fit(teacher, inputs), output_hidden_states=want_hidden)
    s_out = student(**_fit(student, inputs), labels=batch.get("labels"), output_hidden_states=want_hidden)
    parts = {"ce": soft_target_loss(s_out.logits, t_out.logits, cfg.temperature)}
    loss = cfg.alpha_ce * parts["ce"]
    if cfg.alpha_task > 0 and s_out.loss is not None:
        parts["task"] = s_out.loss
        loss = loss + cfg.alpha_task * s_out.loss
    if want_hidden:
        parts["cos"] = hidden_cosine_loss(s_out.hidden_states[-1], t_out.hidden_states[-1],
                                          batch.get("attention_mask"))
        loss = loss + cfg.alpha_cos * parts["cos"]
    return loss, {k: v.detach() for k, v in parts.items()}


def _fit(model: Model, inputs: dict) -> dict:
    """Leave out what a model does not take: token types for a student without a segment table."""
    backbone = getattr(model, "backbone", model)
    if backbone.embeddings.seg is None:
        inputs = {k: v for k, v in inputs.items() if k != "token_type_ids"}
    if "masked_positions" in inputs and not hasattr(model, "mlm"):
        inputs = {k: v for k, v in inputs.items() if k != "masked_positions"}
    return inputs
