"""Self-distillation (finetune --self-distill A; born-again networks, Furlanello et al. 2018): after the plain
fine-tune (the teacher, kept in OUTPUT/teacher), the kept model is a fresh copy of the checkpoint trained on
(1 - A) x the labels' loss + A x the teacher's soft targets at T = 2; the Trainer gets exactly that; refused
where it cannot run; off without the flag."""
from __future__ import annotations

import json

import pytest
import torch

import attnlab
import attnlab.training as training
from attnlab.cli import main
from attnlab.objectives.distill import Distillation, distill_loss
from attnlab.tasks import defaults
from attnlab.tasks.finetune import SELF_DISTILL_T
from test_selftrain import st_tiny  # noqa: F401  (the same tiny sentence-transformers checkpoint)


def test_self_distillation_trains_a_fresh_copy_on_labels_and_the_teachers_soft_targets(
        st_tiny, data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(defaults, "MIN_STEPS", 10)  # the schedule rule's path, not its length
    seen = {}

    class Recording(training.Trainer):  # what the student's run hands the Trainer, as it starts
        def __init__(self, model, args, data, loss_fn=None, **k):
            if isinstance(model, Distillation):
                seen.update(model=model, loss_fn=loss_fn, batch=next(iter(data)),
                            start={n: p.detach().clone() for n, p in model.student.named_parameters()})
            super().__init__(model, args, data, loss_fn=loss_fn, **k)
    monkeypatch.setattr(training, "Trainer", Recording)
    lines = (data_dir / "glue/SST-2/train.tsv").read_text().splitlines()
    train = tmp_path / "train.tsv"
    train.write_text("\n".join(lines[:201]) + "\n")
    out = tmp_path / "out"
    assert main(["finetune", "sst2", "--model", str(st_tiny), "--train", str(train), "--output", str(out),
                 "--max-length", "32", "--no-progress", "--self-distill", "0.7", "--lr", "3e-4", "--seed", "5"]) == 0
    printed = capsys.readouterr()
    summary = json.loads(printed.out.strip().splitlines()[-1])
    teacher = json.loads((out / "teacher" / "metrics.json").read_text())
    info = summary["self_distillation"]
    assert info["weight"] == 0.7 and info["temperature"] == SELF_DISTILL_T == 2.0
    assert info["teacher_eval_accuracy"] == teacher["eval_accuracy"] and "self_distillation" not in teacher
    assert teacher["train_examples"] == summary["train_examples"] and teacher["lr"] == summary["lr"] == 3e-4
    assert teacher["seed"] == 5
    assert "--self-distill 0.7: first the teacher, a plain fine-tune" in printed.err
    assert "trained on 0.3 x the labels' loss + 0.7 x the teacher's soft targets (T = 2)" in printed.err
    # the Trainer optimised a Distillation: teacher = the kept teacher, student = a fresh copy of the checkpoint
    model = seen["model"]
    assert (model.cfg.alpha_ce, model.cfg.alpha_cos, model.cfg.temperature) == (0.7, 0.0, 2.0)
    assert model.cfg.alpha_task == pytest.approx(0.3)
    kept_teacher = attnlab.load(out / "teacher").state_dict()
    assert sorted(model.teacher.state_dict()) == sorted(kept_teacher)
    assert all(torch.equal(v, kept_teacher[k]) for k, v in model.teacher.state_dict().items())
    source = attnlab.load(st_tiny).state_dict()  # the checkpoint's encoder
    start = {k.removeprefix("backbone."): v for k, v in seen["start"].items() if k.startswith("backbone.")}
    shared = [k for k in start if k in source]
    assert len(shared) == len(start) > 10 and all(torch.equal(source[k], start[k]) for k in shared)  # a fresh copy
    assert any(not torch.equal(start[k], kept_teacher["backbone." + k]) for k in start)  # ... not the teacher
    # and its loss is (1 - A) x the labels' cross-entropy + A x T^2 x KL(teacher || student)
    batch = seen["batch"]
    with torch.no_grad():
        loss = seen["loss_fn"](model, batch)
        expected, parts = distill_loss(model.student, model.teacher, batch, model.cfg)
        student = model.student(**{k: v for k, v in batch.items() if k != "labels"}).logits
        t_logits = model.teacher(**{k: v for k, v in batch.items() if k != "labels"}).logits
        ce = torch.nn.functional.cross_entropy(student, batch["labels"])
        kl = torch.nn.functional.kl_div((student / 2).log_softmax(-1), (t_logits / 2).log_softmax(-1),
                                        log_target=True, reduction="batchmean") * 4
    assert abs(float(loss) - float(expected)) < 1e-6
    assert abs(float(loss) - float(0.3 * ce + 0.7 * kl)) < 1e-5 and float(kl) > 0
    kept = attnlab.load(out).state_dict()
    assert any(not torch.equal(kept[k], kept_teacher[k]) for k in kept)  # the student is kept, not the teacher
    # no flag: none of it
    plain = tmp_path / "plain"
    assert main(["finetune", "sst2", "--model", str(st_tiny), "--train", str(train), "--output", str(plain),
                 "--max-length", "32", "--no-progress"]) == 0
    assert "self_distillation" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert not (plain / "teacher").exists()


def test_self_distillation_is_refused_where_it_cannot_run(st_tiny, tmp_path, capsys):
    for argv, message in [
        (["conll2003", "--self-distill", "0.5"], "single-sentence classification"),
        (["sst2", "--self-distill", "0.5", "--save-every", "5"], "it is two runs"),
    ]:
        assert main(["finetune", *argv, "--model", str(st_tiny), "--output", str(tmp_path / "o"),
                     "--max-train-samples", "20", "--no-progress"]) == 1
        assert message in capsys.readouterr().err
    for bad in ("1", "-0.1", "nan"):
        with pytest.raises(SystemExit) as usage:
            main(["finetune", "sst2", "--model", str(st_tiny), "--output", str(tmp_path / "o"), "--self-distill", bad])
        assert usage.value.code == 2 and "--self-distill" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"self_distill=1.5 must be in \[0, 1\)"):
        attnlab.tasks.finetune("sst2", st_tiny, tmp_path / "o", self_distill=1.5)


def test_help_says_it_is_off_by_default_and_what_it_measured(capsys):
    """--help names the option, off by default; the defaults guide says what it measured."""
    from pathlib import Path
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--self-distill A" in text and "(default 0: off)" in text
    guide = Path(__file__).resolve().parents[1] / "docs" / "guides" / "fine-tuning-defaults.md"
    text = " ".join(guide.read_text(encoding="utf-8").split())
    assert "**Self-distillation** - `--self-distill A`" in text and "Off by default" in text
    assert "+0.31" in text and "83.12%" in text  # what it measured on the full file and at 1,000 sentences
