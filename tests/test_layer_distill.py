"""TinyBERT / MiniLM layer distillation on tiny models: each term is 0 for a student equal to its teacher,
projections make narrower students work, gradients reach the student (and projections) only, and the CLI
refuses a bad layer map with one line."""
import json
import math

import numpy as np
import pytest
import torch

from attnlab.config import preset
from attnlab.heads import SequenceClassification
from attnlab.objectives.distill import STYLES, DistillConfig, Distillation, distill_loss, student_config
from attnlab.objectives.layer_distill import (Projections, attention_kl, check_layer_map, init_narrow_student,
                                              pca_basis, projected_mse, uniform_layer_map, value_relation_kl)

from _pretrain_utils import one_thread

V = 40
EVERY_TERM = DistillConfig(temperature=1.0, alpha_ce=1.0, alpha_task=0.0, alpha_cos=1.0, alpha_attn=1.0,
                           alpha_hidden=1.0, alpha_embed=1.0, alpha_value=1.0)


@pytest.fixture(autouse=True)
def _single_thread():
    with one_thread():
        yield


def _tiny(**over):
    kw = dict(vocab_size=V, hidden_size=32, num_layers=4, num_heads=4, intermediate_size=64,
              max_position_embeddings=32, dropout=0.0, attention_dropout=0.0)
    return preset("bert-tiny", **{**kw, **over})


def _batch(seed=0, n=6, t=10):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, V, (n, t), generator=g)
    mask = torch.ones(n, t, dtype=torch.long)
    for row in range(n):  # ragged: padding at the end of most rows
        mask[row, t - row:] = 0
    return {"input_ids": ids * mask, "attention_mask": mask, "labels": torch.randint(0, 2, (n,), generator=g)}


def _teacher(seed=0):
    torch.manual_seed(seed)
    teacher = SequenceClassification(_tiny()).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def test_uniform_map_and_bad_maps():
    assert uniform_layer_map(6, 3) == [1, 3, 5] and uniform_layer_map(12, 4) == [2, 5, 8, 11]
    assert uniform_layer_map(4, 4) == [0, 1, 2, 3]
    assert check_layer_map([0, 5], 6, 2) == [0, 5]
    with pytest.raises(ValueError, match="teacher layer 6 does not exist"):
        check_layer_map([1, 6], 6, 2)
    with pytest.raises(ValueError, match="3 teacher layers for a 2-layer student"):
        check_layer_map([1, 3, 5], 6, 2)
    with pytest.raises(ValueError, match="must increase"):
        check_layer_map([3, 1], 6, 2)


def test_attention_kl_by_hand_and_masked_keys_weigh_nothing():
    t = torch.tensor([0.8, 0.2, 0.0])[None, None, None].expand(1, 2, 1, 3)
    s = torch.tensor([0.5, 0.5, 0.0])[None, None, None].expand(1, 2, 1, 3)
    expected = 0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5)
    assert attention_kl(s, t).item() == pytest.approx(expected, rel=1e-5)
    assert torch.isfinite(attention_kl(s, t)) and attention_kl(t, t).item() == 0.0
    with pytest.raises(ValueError, match="as many student heads as teacher heads"):
        attention_kl(s[:, :1], t)


def test_value_relation_is_width_free_and_ignores_padding():
    torch.manual_seed(0)
    v_t, v_s = torch.randn(2, 5, 32), torch.randn(2, 5, 16)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    kl = value_relation_kl(v_s, v_t, 4, mask)  # 32 vs 16 wide: both give 4 relation heads of 5x5
    assert kl.item() > 0 and value_relation_kl(v_t, v_t, 4, mask).item() == 0.0
    changed = v_t.clone()
    changed[0, 3:] = 100.0  # padded tokens of row 0: neither a key nor a query that counts
    assert value_relation_kl(v_s, changed, 4, mask).item() == pytest.approx(kl.item(), rel=1e-6)


@pytest.mark.parametrize("style", ["tinybert", "minilm", "every term"])
def test_each_term_is_zero_when_the_student_is_the_teacher(style):
    """A 4-layer 'student' identical to its teacher with the identity map: every term is exactly 0 and the
    soft targets too (the TinyBERT map of 4 onto 4 is the identity)."""
    teacher = _teacher()
    student = SequenceClassification(student_config(teacher.config, 4))
    student.load_state_dict(teacher.state_dict())
    cfg = EVERY_TERM if style == "every term" else DistillConfig(**STYLES[style])
    _, parts = Distillation(student, teacher, cfg)(_batch())
    expected = {"ce", "cos", "attn", "hidden", "embed", "value"} if style == "every term" else \
        {"ce", "attn", "hidden", "embed"} if style == "tinybert" else {"ce", "attn", "value"}
    assert set(parts) == expected
    for name, value in parts.items():
        assert abs(value.item()) < 1e-6, (name, value.item())
    # and a different student gives every term above 0
    torch.manual_seed(1)
    other = SequenceClassification(student_config(teacher.config, 4))
    _, parts = Distillation(other, teacher, cfg)(_batch())
    assert all(v.item() > 0 for v in parts.values()), parts  # small at random init: near-uniform rows


def test_narrower_student_trains_through_the_projections_and_the_teacher_gets_no_gradient():
    teacher = _teacher()
    with torch.no_grad():
        teacher.classifier.weight.normal_(0, 2.0)  # soft targets with an opinion
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student = SequenceClassification(student_config(teacher.config, 2, width=16))
    assert (student.config.hidden_size, student.config.num_heads, student.config.intermediate_size) == (16, 4, 32)
    basis, kept = init_narrow_student(student, teacher)
    assert basis.shape == (32, 16) and 0.5 < kept < 1.0
    # the embedding table is the teacher's in the PCA basis
    assert torch.allclose(student.backbone.embeddings.tok.weight, teacher.backbone.embeddings.tok.weight @ basis)
    cfg = DistillConfig(**STYLES["tinybert"], )
    cfg.alpha_value = 1.0  # the MiniLM term too, on the mapped layers
    run = Distillation(student, teacher, cfg, basis)
    assert run.projections is not None and torch.equal(run.projections.hidden.weight, basis)
    names = {n for n, _ in run.named_parameters()}
    assert "projections.hidden.weight" in names and not any(n.startswith("teacher") for n in names)
    loss, parts = run(_batch())
    loss.backward()
    assert set(parts) == {"ce", "attn", "hidden", "embed", "value"}
    assert all(p.grad is None for p in teacher.parameters())
    assert run.projections.hidden.weight.grad.abs().sum() > 0 and run.projections.embed.weight.grad.abs().sum() > 0
    assert all(p.grad is not None for n, p in student.named_parameters() if "layers." in n)
    opt = torch.optim.AdamW(run.parameters(), lr=3e-3)
    losses = []
    for step in range(20):
        opt.zero_grad()
        loss, _ = run(_batch(seed=step % 3))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in before.items())


def test_a_narrower_student_needs_the_projection_and_matching_heads():
    teacher = _teacher()
    h_t, h_s = torch.randn(2, 3, 32), torch.randn(2, 3, 16)
    with pytest.raises(ValueError, match="needs a projection"):
        projected_mse(h_s, h_t, None)
    proj = Projections(16, 32)
    assert projected_mse(h_s, h_t, proj.hidden).item() > 0
    assert projected_mse(h_t, h_t, Projections(32, 32).hidden).item() == 0.0  # equal widths start at the identity
    with pytest.raises(ValueError, match="hidden-state cosine needs equal widths"):
        Distillation(SequenceClassification(student_config(teacher.config, 2, width=16)), teacher, DistillConfig())
    narrow_two_heads = SequenceClassification(student_config(teacher.config, 2, width=16, heads=2))
    with pytest.raises(ValueError, match="as many student heads as teacher heads"):
        Distillation(narrow_two_heads, teacher, DistillConfig(**STYLES["minilm"]))(_batch())
    with pytest.raises(ValueError, match="does not split into 3 heads"):
        student_config(teacher.config, 2, width=16, heads=3)
    _, kept = pca_basis(torch.randn(50, 8), 8)
    assert kept == pytest.approx(1.0)


def test_distill_loss_without_the_wrapper_keeps_distilbert_parts():
    teacher = _teacher()
    student = SequenceClassification(student_config(teacher.config, 2))
    _, parts = distill_loss(student, teacher, _batch())
    assert set(parts) == {"ce", "task", "cos"}


def test_cli_distils_a_narrow_student_and_refuses_a_bad_layer_map(data_dir, tmp_path, capsys):
    """`attnlab distill --task sst2 --student-width --style tinybert` on a tiny teacher: a narrower student
    saved like finetune saves; a layer map naming a layer the teacher lacks: one line, status 2."""
    import attnlab
    from attnlab.cli import main
    torch.manual_seed(0)
    teacher_dir = tmp_path / "teacher"
    attnlab.save(SequenceClassification(_tiny(vocab_size=30522, extra={"id2label": {0: "negative", 1: "positive"},
                                                                        "label2id": {"negative": 0, "positive": 1}})),
                 teacher_dir)
    attnlab.load_tokenizer("minilm").save(teacher_dir)
    lines = (data_dir / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines()
    train, valid = tmp_path / "train.tsv", tmp_path / "valid.tsv"
    train.write_text("\n".join(lines[:121]) + "\n", encoding="utf-8")
    valid.write_text("\n".join(lines[:1] + lines[-40:]) + "\n", encoding="utf-8")
    common = ["distill", "--task", "sst2", "--teacher", str(teacher_dir), "--student-layers", "2", "--train",
              str(train), "--valid", str(valid), "--epochs", "1", "--batch-size", "16", "--max-length", "24",
              "--no-progress"]
    out = tmp_path / "student"
    assert main([*common, "--output", str(out), "--student-width", "16", "--style", "tinybert"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["student_width"] == 16 and summary["distill"]["alpha_hidden"] == 1.0
    student = attnlab.load(out)
    assert student.config.hidden_size == 16 and student.config.num_layers == 2
    assert not any("projection" in k for k in student.state_dict())
    capsys.readouterr()
    assert main([*common, "--output", str(tmp_path / "bad"), "--layer-map", "1,4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["attnlab distill: error: --layer-map layer map 1,4: teacher layer 4 does not exist "
                   "(the teacher has 4 layers, 0-3)"]
    assert not (tmp_path / "bad").exists()
