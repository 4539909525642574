"""Layer-to-layer distillation: what a student learns from the inside of its teacher, not only from its
outputs. Two recipes of the notes, on top of DistilBERT's soft targets (objectives/distill.py):

TinyBERT (Jiao et al. 2020, §3.1), on each mapped pair of layers (uniform map: student layer m <- teacher
layer g(m) = m·N/M, 1-based, so a 3-layer student of a 6-layer teacher learns from teacher layers 2, 4, 6):
- attention: the student's attention matrices against the teacher's, head by head (the paper takes the MSE
  of the unnormalised scores; here it is the KL of the distributions, as MiniLM does, so both recipes share
  one term and padded keys weigh nothing);
- hidden states: MSE(H_S W_h, H_T), W_h a learned (d_student -> d_teacher) projection, so the student may
  be narrower (Eq. 8);
- embeddings: MSE(E_S W_e, E_T), its own projection W_e (Eq. 9).
MiniLM (Wang et al. 2020, §3.1-3.2), on the last layer only:
- attention distributions: KL(A_T ‖ A_S) per head and query;
- value relation: KL(VR_T ‖ VR_S), VR = softmax(V Vᵀ / √d_k) per head. Both are T×T, so the widths never
  have to match and no projection is needed. The heads are the concatenated values cut into the teacher's
  number of relation heads (MiniLMv2, Wang et al. 2021, §3.1), which is MiniLM's per-head relation when
  both have that many heads.
Attention KL needs as many heads in the student as in the teacher (one distribution per head to match).

Worked example of one attention row, two keys: teacher (0.8, 0.2), student (0.5, 0.5):
    KL = 0.8·ln(0.8/0.5) + 0.2·ln(0.2/0.5) = 0.3760 - 0.1833 = 0.1927
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

_TINY = 1e-12  # log(0) guard: a key masked in both rows gives log(tiny) - log(tiny) = 0, never nan


def uniform_layer_map(teacher_layers: int, student_layers: int) -> list[int]:
    """TinyBERT's uniform strategy (§4.2), 0-based: student layer i learns from teacher layer
    (i + 1)·N/M - 1, e.g. [1, 3, 5] for 3 of 6 layers (the last student layer always sees the last)."""
    if not 0 < student_layers <= teacher_layers:
        raise ValueError(f"student layers must be between 1 and the teacher's {teacher_layers}, got {student_layers}")
    return [(i + 1) * teacher_layers // student_layers - 1 for i in range(student_layers)]


def check_layer_map(layer_map: list[int], teacher_layers: int, student_layers: int) -> list[int]:
    """A layer map as given (--layer-map 1,3,5): one teacher layer per student layer, each a real layer,
    in increasing order (a deeper student layer learns from a deeper teacher layer)."""
    text = ",".join(str(i) for i in layer_map)
    if len(layer_map) != student_layers:
        raise ValueError(f"layer map {text}: {len(layer_map)} teacher layers for a {student_layers}-layer student")
    bad = [i for i in layer_map if not 0 <= i < teacher_layers]
    if bad:
        raise ValueError(f"layer map {text}: teacher layer {bad[0]} does not exist (the teacher has "
                         f"{teacher_layers} layers, 0-{teacher_layers - 1})")
    if any(b <= a for a, b in zip(layer_map, layer_map[1:])):
        raise ValueError(f"layer map {text}: teacher layers must increase with the student's")
    return list(layer_map)


def _rows(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """(B, T) real-token mask as float weights (all ones without a mask)."""
    if mask is None:
        return like.new_ones(like.shape[0], like.shape[-2])
    return mask.to(like.dtype)


def _kl_rows(t_log: torch.Tensor, s_log: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """KL(t ‖ s) of (B, H, T, T) log-distributions, summed over keys, averaged over heads and real queries."""
    kl = (t_log.exp() * (t_log - s_log)).sum(-1).mean(1)  # (B, T)
    w = _rows(mask, kl)
    return (kl * w).sum() / w.sum().clamp_min(1)


def attention_kl(student_attn: torch.Tensor, teacher_attn: torch.Tensor, mask: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """KL(A_T ‖ A_S) of attention weights (B, H, T, T) (softmax outputs, as output_attentions returns them)."""
    if student_attn.size(1) != teacher_attn.size(1):
        raise ValueError(f"attention transfer needs as many student heads as teacher heads; student has "
                         f"{student_attn.size(1)}, teacher {teacher_attn.size(1)} (set the student's heads to "
                         f"{teacher_attn.size(1)})")
    log = lambda a: a.float().clamp_min(_TINY).log()  # noqa: E731
    return _kl_rows(log(teacher_attn), log(student_attn), mask)


def value_relation(values: torch.Tensor, heads: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """log softmax(V_h V_hᵀ / √d_h) per relation head: values (B, T, d) cut into `heads` pieces of d/heads.
    Padded keys get a large negative score (finite, so that masked entries subtract to 0, not nan)."""
    b, t, d = values.shape
    if d % heads:
        raise ValueError(f"value relation: width {d} does not split into {heads} relation heads")
    v = values.float().view(b, t, heads, d // heads).transpose(1, 2)
    scores = v @ v.transpose(-1, -2) / (d // heads) ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask.bool()[:, None, None, :], -1e9)
    return F.log_softmax(scores, dim=-1)


def value_relation_kl(student_values: torch.Tensor, teacher_values: torch.Tensor, heads: int,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """MiniLM's value-relation transfer: KL(VR_T ‖ VR_S), averaged over relation heads and real queries."""
    return _kl_rows(value_relation(teacher_values, heads, mask), value_relation(student_values, heads, mask), mask)


def projected_mse(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, projection: nn.Module | None,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    """MSE(h_S W, h_T) over the real tokens (TinyBERT Eq. 8-9); `projection` None means equal widths."""
    s = projection(student_hidden.float()) if projection is not None else student_hidden.float()
    if s.size(-1) != teacher_hidden.size(-1):
        raise ValueError(f"hidden-state MSE: student width {student_hidden.size(-1)} needs a projection to the "
                         f"teacher's {teacher_hidden.size(-1)}")
    err = (s - teacher_hidden.float()).pow(2).mean(-1)  # (B, T)
    w = _rows(mask, err[..., None])
    return (err * w).sum() / w.sum().clamp_min(1)


class Projections(nn.Module):
    """TinyBERT's learned maps from the student's width to the teacher's: `hidden` (W_h, shared by every
    mapped layer) and `embed` (W_e). They train with the student and are thrown away after. Start: the
    identity for equal widths (a student equal to its teacher then has zero loss), else `basis` (d_t, d_s)
    when given (the PCA basis the student's embeddings were reduced with), else random."""

    def __init__(self, student_width: int, teacher_width: int, basis: torch.Tensor | None = None) -> None:
        super().__init__()
        self.hidden = nn.Linear(student_width, teacher_width, bias=False)
        self.embed = nn.Linear(student_width, teacher_width, bias=False)
        with torch.no_grad():
            for p in (self.hidden, self.embed):
                if student_width == teacher_width:
                    p.weight.copy_(torch.eye(teacher_width))
                elif basis is not None:
                    p.weight.copy_(basis)


@contextmanager
def capture_values(model: nn.Module):
    """Collect each layer's value projection V (B, T, d) while `model` runs (a forward hook on every
    self-attention's `v`; the fused QKV GEMM steps aside for hooked modules). Yields the list it fills."""
    backbone = getattr(model, "backbone", model)
    found: list[torch.Tensor] = []
    handles = [layer.attn.v.register_forward_hook(lambda m, i, out: found.append(out)) for layer in backbone.layers]
    try:
        yield found
    finally:
        for h in handles:
            h.remove()


def padded_values(values: list[torch.Tensor], mask: torch.Tensor | None) -> list[torch.Tensor]:
    """Values in the (B, T, d) layout: an unpadded batch (attnlab.nn.varlen) gives (N, d) rows, the real
    tokens first in row-major order of the mask (then any rounding rows, dropped); padding becomes zeros (the
    relation masks those keys anyway)."""
    out = []
    for v in values:
        if v.dim() == 2:
            full = v.new_zeros(*mask.shape, v.size(-1))
            keep = mask.bool()
            full[keep] = v[:int(keep.sum())]
            v = full
        out.append(v)
    return out


@torch.no_grad()
def pca_basis(matrix: torch.Tensor, k: int) -> tuple[torch.Tensor, float]:
    """The top-k principal directions (d, k) of the rows of `matrix` (n, d), and the share of the variance
    they keep."""
    x = matrix.float() - matrix.float().mean(0)
    _, s, vh = torch.linalg.svd(x, full_matrices=False)
    var = s.pow(2)
    return vh[:k].T.contiguous(), float(var[:k].sum() / var.sum())


@torch.no_grad()
def init_narrow_student(student: nn.Module, teacher: nn.Module) -> tuple[torch.Tensor, float]:
    """Start a narrower student from its teacher where a narrower copy has a meaning, and randomly elsewhere.
    The teacher's token embedding rows are projected on their top principal directions, P (d_t, d_s), and
    the position / segment tables, the pooler (Pᵀ W P, Pᵀ b) and the classifier (W P) are carried through
    the same basis, so words keep their neighbours. Transformer layers stay random: a post-LN layer
    normalises over the whole width, which no d_s-dimensional copy reproduces, so they learn from the layer
    losses instead. Returns (P, share of the embedding variance kept)."""
    s_bb, t_bb = getattr(student, "backbone", student), getattr(teacher, "backbone", teacher)
    d_s = student.config.hidden_size
    if student.config.emb_size != d_s or teacher.config.emb_size != teacher.config.hidden_size:
        raise ValueError("a narrower student needs embeddings as wide as the layers (no ALBERT factorization)")
    basis, kept = pca_basis(t_bb.embeddings.tok.weight, d_s)
    for name in ("tok", "pos", "seg"):
        s_e, t_e = getattr(s_bb.embeddings, name, None), getattr(t_bb.embeddings, name, None)
        if s_e is not None and t_e is not None and s_e.weight.size(0) == t_e.weight.size(0):
            s_e.weight.copy_(t_e.weight.float() @ basis)
    s_pool, t_pool = getattr(s_bb, "pooler", None), getattr(t_bb, "pooler", None)
    dense = lambda p: getattr(p, "dense", None)  # noqa: E731
    if dense(s_pool) is not None and dense(t_pool) is not None:
        dense(s_pool).weight.copy_(basis.T @ dense(t_pool).weight.float() @ basis)
        if dense(s_pool).bias is not None and dense(t_pool).bias is not None:
            dense(s_pool).bias.copy_(basis.T @ dense(t_pool).bias.float())
    s_cls, t_cls = getattr(student, "classifier", None), getattr(teacher, "classifier", None)
    if isinstance(s_cls, nn.Linear) and isinstance(t_cls, nn.Linear) and s_cls.out_features == t_cls.out_features:
        s_cls.weight.copy_(t_cls.weight.float() @ basis)
        if s_cls.bias is not None and t_cls.bias is not None:
            s_cls.bias.copy_(t_cls.bias)
    return basis, kept
