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

Layer-to-layer terms (TinyBERT's attention / projected hidden-state / embedding losses, MiniLM's
last-layer attention and value relation) live in objectives/layer_distill.py; `DistillConfig` weighs them
with the rest, `STYLES` names each paper's mix, and `Distillation` holds the student together with the
projections a narrower student needs.

Worked example of the soft-target loss, T = 2, one position, two classes:
    teacher logits (2, 0) -> softmax(/2) = (0.731, 0.269); student logits (0, 0) -> (0.5, 0.5)
    KL = 0.731·ln(0.731/0.5) + 0.269·ln(0.269/0.5) = 0.1109;  × T² = 0.4438
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..models.base import Model
from .layer_distill import (Projections, attention_kl, capture_values, check_layer_map, padded_values,
                            projected_mse, uniform_layer_map, value_relation_kl)


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


def student_config(teacher: ModelConfig, num_layers: int, width: int | None = None, heads: int | None = None,
                   **changes) -> ModelConfig:
    """The teacher's config with fewer layers (and any other `changes`, e.g. model_type="distilbert",
    type_vocab_size=0, pooler=False for a DistilBERT-layout student). `width` makes it narrower: the FFN
    keeps the teacher's ratio to the width, `heads` defaults to the teacher's (attention transfer matches
    head by head), each head then narrower."""
    if width is not None and width != teacher.hidden_size:
        heads = heads or teacher.num_heads
        if width <= 0 or width % heads:
            raise ValueError(f"student width {width} does not split into {heads} heads")
        changes = dict(hidden_size=width, num_heads=heads, head_dim=None, embedding_size=None,
                       num_kv_heads=None if teacher.num_kv_heads is None else heads,
                       intermediate_size=teacher.intermediate_size * width // teacher.hidden_size) | changes
    elif heads is not None and heads != teacher.num_heads:
        raise ValueError(f"student heads {heads}: a student as wide as its teacher keeps its {teacher.num_heads} heads")
    config = replace(teacher, num_layers=num_layers, extra=dict(teacher.extra), **changes)
    config.validate()
    return config


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
    alpha_cos: float = 1.0    # hidden-state directions (equal widths only)
    alpha_attn: float = 0.0   # attention-distribution KL (TinyBERT on mapped layers, MiniLM on the last)
    alpha_hidden: float = 0.0  # MSE of projected hidden states on mapped layers (TinyBERT)
    alpha_embed: float = 0.0  # MSE of projected embedding outputs (TinyBERT)
    alpha_value: float = 0.0  # value-relation KL (MiniLM)
    match: str = "mapped"     # where attention and value terms look: "mapped" layers or the "last" layer
    layer_map: list[int] | None = field(default=None)  # teacher layer of each student layer; None = uniform

    def validate(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"distill temperature={self.temperature}: must be positive")
        weights = ("alpha_ce", "alpha_task", "alpha_cos", "alpha_attn", "alpha_hidden", "alpha_embed", "alpha_value")
        if min(getattr(self, w) for w in weights) < 0:
            raise ValueError(f"distill weights {', '.join(weights)} must be non-negative")
        if self.match not in ("mapped", "last"):
            raise ValueError(f"distill match={self.match!r}: expected 'mapped' or 'last'")

    @property
    def layer_terms(self) -> bool:
        return any((self.alpha_attn, self.alpha_hidden, self.alpha_embed, self.alpha_value))


# Each paper's mix of terms for task distillation. DistilBERT (Sanh et al. 2019, §3): soft targets at T=2,
# labels and hidden-state cosine. TinyBERT (Jiao et al. 2020, Eq. 7-11): every layer term on the uniform map
# and soft targets at T=1, no labels. MiniLM (Wang et al. 2020, Eq. 5-7): last-layer attention and value
# relation, equal weights; the soft targets stand in for the fine-tuning MiniLM does after its
# task-agnostic distillation.
STYLES: dict[str, dict] = {
    "distilbert": dict(temperature=2.0, alpha_ce=5.0, alpha_task=2.0, alpha_cos=1.0),
    "tinybert": dict(temperature=1.0, alpha_ce=1.0, alpha_task=0.0, alpha_cos=0.0, alpha_attn=1.0,
                     alpha_hidden=1.0, alpha_embed=1.0, match="mapped"),
    "minilm": dict(temperature=1.0, alpha_ce=1.0, alpha_task=0.0, alpha_cos=0.0, alpha_attn=1.0,
                   alpha_value=1.0, match="last"),
}


def distill_loss(student: Model, teacher: Model, batch: dict, cfg: DistillConfig = DistillConfig(),
                 projections: Projections | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One batch of the distillation loss for any wrapper with `logits` (MaskedLM, SequenceClassification,
    ...): DistilBERT's terms, and the layer terms `cfg` weighs in (`projections` map a narrower student's
    hidden states to the teacher's width; None = equal widths). For MLM batches with `masked_positions`,
    both networks predict only there. Returns (loss, parts)."""
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids",
                                                       "masked_positions")}
    want_hidden = cfg.alpha_cos > 0 or cfg.alpha_hidden > 0 or cfg.alpha_embed > 0
    want = dict(output_hidden_states=want_hidden, output_attentions=cfg.alpha_attn > 0)
    values = (lambda m: capture_values(m)) if cfg.alpha_value > 0 else (lambda m: nullcontext([]))  # noqa: E731
    if teacher.training:  # only on a change: eval() drops the teacher's stacked Q/K/V weights (nn/attention.py)
        teacher.eval()
    with torch.no_grad(), values(teacher) as t_values:
        t_out = teacher(**_fit(teacher, inputs), **want)
    with values(student) as s_values:
        s_out = student(**_fit(student, inputs), labels=batch.get("labels"), **want)
    parts = {"ce": soft_target_loss(s_out.logits, t_out.logits, cfg.temperature)}
    loss = cfg.alpha_ce * parts["ce"]
    if cfg.alpha_task > 0 and s_out.loss is not None:
        parts["task"] = s_out.loss
        loss = loss + cfg.alpha_task * s_out.loss
    if cfg.alpha_cos > 0:
        parts["cos"] = hidden_cosine_loss(s_out.hidden_states[-1], t_out.hidden_states[-1],
                                          batch.get("attention_mask"))
        loss = loss + cfg.alpha_cos * parts["cos"]
    if cfg.layer_terms:
        mask = batch.get("attention_mask")
        n_s, n_t = student.config.num_layers, teacher.config.num_layers
        mapped = list(enumerate(_layer_map(cfg, n_t, n_s)))
        pairs = mapped if cfg.match == "mapped" else [(n_s - 1, n_t - 1)]  # MiniLM: the last layers only
        terms = _layer_terms(s_out, t_out, padded_values(s_values, mask), padded_values(t_values, mask),
                             cfg, mapped, pairs, projections, mask, teacher.config.num_heads)
        for name, value in terms.items():
            parts[name] = value
            loss = loss + getattr(cfg, f"alpha_{name}") * value
    return loss, {k: v.detach() for k, v in parts.items()}


def _layer_map(cfg: DistillConfig, teacher_layers: int, student_layers: int) -> list[int]:
    if cfg.layer_map is None:
        return uniform_layer_map(teacher_layers, student_layers)
    return check_layer_map(cfg.layer_map, teacher_layers, student_layers)


def _layer_terms(s_out, t_out, s_values, t_values, cfg: DistillConfig, mapped: list[tuple[int, int]],
                 pairs: list[tuple[int, int]], projections: Projections | None, mask,
                 relation_heads: int) -> dict[str, torch.Tensor]:
    """The layer terms `cfg` weighs in, each a mean over its (student, teacher) layer pairs: attention and
    value terms over `pairs`, hidden states over `mapped` (TinyBERT sums over layers; a mean keeps a
    weight's meaning whatever the depth). Hidden state i + 1 is layer i's output, 0 the embeddings."""
    mean = lambda xs: torch.stack(xs).mean()  # noqa: E731
    terms = {}
    if cfg.alpha_attn > 0:
        terms["attn"] = mean([attention_kl(s_out.attentions[i], t_out.attentions[j], mask) for i, j in pairs])
    if cfg.alpha_value > 0:
        terms["value"] = mean([value_relation_kl(s_values[i], t_values[j], relation_heads, mask) for i, j in pairs])
    hidden_proj = projections.hidden if projections is not None else None
    if cfg.alpha_hidden > 0:
        terms["hidden"] = mean([projected_mse(s_out.hidden_states[i + 1], t_out.hidden_states[j + 1], hidden_proj, mask)
                                for i, j in mapped])
    if cfg.alpha_embed > 0:
        terms["embed"] = projected_mse(s_out.hidden_states[0], t_out.hidden_states[0],
                                       projections.embed if projections is not None else None, mask)
    return terms


class Distillation(nn.Module):
    """What trains in a distillation run: the `student` and, when the loss maps hidden states across widths,
    TinyBERT's `projections` (thrown away after). The teacher is held but not registered: it is frozen,
    takes no optimizer state and stays out of checkpoints. `basis` (d_t, d_s) starts the projections (the
    PCA basis of init_narrow_student). Calling it with a batch returns distill_loss's (loss, parts)."""

    def __init__(self, student: Model, teacher: Model, cfg: DistillConfig, basis: torch.Tensor | None = None) -> None:
        super().__init__()
        cfg.validate()
        _layer_map(cfg, teacher.config.num_layers, student.config.num_layers)  # a bad map fails before training
        self.student, self.cfg = student, cfg
        self.__dict__["teacher"] = teacher
        d_s, d_t = student.config.hidden_size, teacher.config.hidden_size
        projected = (cfg.alpha_hidden or cfg.alpha_embed) and d_s != d_t
        self.projections = Projections(d_s, d_t, basis) if projected else None
        if cfg.alpha_cos > 0 and d_s != d_t:
            raise ValueError(f"hidden-state cosine needs equal widths; student has {d_s}, teacher {d_t} "
                             "(set alpha_cos=0 for a narrower student, or use the projected MSE)")

    def forward(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return distill_loss(self.student, self.teacher, batch, self.cfg, self.projections)


def _fit(model: Model, inputs: dict) -> dict:
    """Leave out what a model does not take: token types for a student without a segment table."""
    backbone = getattr(model, "backbone", model)
    if backbone.embeddings.seg is None:
        inputs = {k: v for k, v in inputs.items() if k != "token_type_ids"}
    if "masked_positions" in inputs and not hasattr(model, "mlm"):
        inputs = {k: v for k, v in inputs.items() if k != "masked_positions"}
    return inputs
