"""`finetune`'s options record and its stages (tasks/finetune_options.py, tasks/finetune.py): bad values are refused
naming the field, keyword overrides and a FinetuneOptions give the same run, the stages run one by one, the CLI
maps its flags onto the record, and `--teacher` on a full training file runs the full-file recipe (the teacher's
logits on every example, cached in output/teacher) with a stand-in for the teacher's own training."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import build_parser, main
from attnlab.config import ModelConfig
from attnlab.tasks import defaults
from attnlab.tasks.finetune import FinetuneRun, finetune
from attnlab.tasks.finetune_options import FinetuneOptions


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    attnlab.from_config(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                    dropout=0.0, attention_dropout=0.0)).save(out)
    attnlab.load_tokenizer("minilm").save(out)
    return out


def _sst2(data_dir: Path, dst: Path, start: int, n: int) -> Path:
    lines = (data_dir / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines()
    dst.write_text("\n".join([lines[0], *lines[1 + start:1 + start + n]]) + "\n", encoding="utf-8")
    return dst


@pytest.fixture(scope="module")
def files(data_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    return _sst2(data_dir, root / "train.tsv", 0, 40), _sst2(data_dir, root / "valid.tsv", 5000, 12)


@pytest.mark.parametrize("field, value, message", [
    ("pooling", "max", "pooling='max' is not one of cls, mean"),
    ("head_init", "zeros", "head_init='zeros' is not one of probe, random"),
    ("setfit_steps", -1, "setfit_steps=-1 must be 0"),
    ("self_train", -2, "self_train=-2 must be 0"),
    ("self_distill", 1.0, r"self_distill=1.0 must be in \[0, 1\)"),
    ("ema", 1.0, r"ema=1.0 must be in \[0, 1\)"),
    ("layer_decay", 0.0, r"layer_decay=0.0 must be in \(0, 1\]"),
    ("precision", "fp8", "precision='fp8' is not one of fp32, bf16, auto"),
    ("parallel", "zero3", "parallel='zero3' is not one of ddp, fsdp"),
    ("setfit_pairs", "some", "setfit_pairs='some' is not one of sampled, all"),
    ("epochs", float("nan"), "epochs=nan must be 0 or more"),
    ("lr", 0.0, "lr=0.0 must be more than 0"),
    ("batch_size", 0, "batch_size=0 must be 1 or more"),
    ("save_every", -1, "save_every=-1 must be 0 or more"),
])
def test_a_bad_value_is_refused_naming_its_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        FinetuneOptions(**{field: value})
    with pytest.raises(ValueError, match=message):          # a copy is checked again
        FinetuneOptions().replace(**{field: value})
    with pytest.raises(dataclasses.FrozenInstanceError):    # a checked record stays checked
        setattr(FinetuneOptions(), field, value)


def test_an_unknown_option_is_a_type_error_naming_it(tiny, tmp_path):
    with pytest.raises(TypeError, match="unknown option epoch ") as err:
        finetune("sst2", tiny, tmp_path / "o", epoch=1)
    assert "epochs" in str(err.value)                        # the fields are listed
    assert not (tmp_path / "o").exists()                     # refused before any work
    with pytest.raises(TypeError, match="options must be a FinetuneOptions, not dict"):
        finetune("sst2", tiny, tmp_path / "o", {"epochs": 1})
    with pytest.raises(TypeError, match="unknown options lr_rate, seeds"):
        FinetuneOptions().replace(seeds=1, lr_rate=2)


def test_overrides_and_an_options_record_give_the_same_run(tiny, files, tmp_path):
    train, valid = files
    given = dict(train_file=str(train), valid_file=str(valid), epochs=2, batch_size=8, max_length=32, lr=1e-3,
                 progress=False, seed=3)
    a = finetune("sst2", tiny, tmp_path / "a", **given)
    b = finetune("sst2", tiny, tmp_path / "b", FinetuneOptions(**given))
    c = finetune("sst2", tiny, tmp_path / "c", FinetuneOptions(**{**given, "seed": 4}), seed=3)  # override wins
    on_disk = [json.loads((tmp_path / d / "metrics.json").read_text()) for d in "abc"]
    for s in (a, b, c, *on_disk):
        s.pop("wall_time_s")
    assert a == b == c == on_disk[0] == on_disk[1] == on_disk[2]
    assert a["steps"] == 10 and a["epochs"] == 2 and a["freeze_embeddings"] is True and "ema" not in a
    # what the run was told is saved beside it, and reads back into the same record
    told = json.loads((tmp_path / "a" / "options.json").read_text())
    assert FinetuneOptions(**told) == FinetuneOptions(**given) and told["epochs"] == 2
    # the weights too: both runs kept the same model
    wa = attnlab.load(tmp_path / "a").state_dict()
    wb = attnlab.load(tmp_path / "b").state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_each_stage_runs_on_its_own(tiny, files, tmp_path, capsys):
    train, valid = files
    run = FinetuneRun("sst2", tiny, tmp_path / "r", FinetuneOptions(
        train_file=str(train), valid_file=str(valid), epochs=1, batch_size=8, max_length=32, progress=False))
    run.split()
    assert (len(run.train_ex), len(run.valid_ex)) == (40, 12) and not run.setfit_rule
    run.teacher()
    assert run.lm_teacher == "" and run.soft is None and run.train_ex and run.n_labeled == 40
    run.schedule()
    # a pretrained sentence classifier: precision auto (the Trainer resolves it for the machine)
    assert (run.epochs, run.batch_size, run.precision, run.freeze_embeddings, run.ema) == (1, 8, "auto", True, 0.0)
    assert "finetune sst2: train 40 examples, validate 12" in capsys.readouterr().err
    run.build_model()
    assert run.trained is run.net and run.loss_fn is None
    run.features()
    assert len(run.feats) == 40 and not run.net.backbone.embeddings.tok.weight.requires_grad
    assert not (tmp_path / "r" / "model.safetensors").exists()        # nothing trained or kept yet
    run.train()
    assert run.step == 5 and "eval_accuracy" in run.best
    run.evaluate()
    assert run.tested == {}                                              # no test file
    summary = run.save()
    assert json.loads((tmp_path / "r" / "metrics.json").read_text()) == summary
    assert summary["steps"] == 5 and summary["train_examples"] == 40


def test_the_cli_maps_its_flags_onto_the_options():
    from attnlab.cli.finetune import options_of
    args = build_parser().parse_args(["finetune", "sst2", "--output", "o", "--train", "t.tsv", "--valid", "v.tsv",
                                      "--test", "x.tsv", "--epochs", "1.5", "--ema", "0.99", "--teacher", "smollm2",
                                      "--train-embeddings", "--lora", "r=4", "--seed", "7", "--no-progress"])
    o = options_of(args)
    assert (o.train_file, o.valid_file, o.test_file) == ("t.tsv", "v.tsv", "x.tsv")
    assert (o.epochs, o.ema, o.teacher, o.seed, o.progress) == (1.5, 0.99, "smollm2", 7, False)
    assert o.freeze_embeddings is False and o.lora["r"] == 4
    plain = options_of(build_parser().parse_args(["finetune", "sst2", "--output", "o"]))
    assert plain == FinetuneOptions(progress=True)      # every flag left out is the record's default
    assert plain.freeze_embeddings is None and plain.ema is None


class FakeTeacher:
    """teacher_logits' contract (tasks/prompt_teacher.py) without the LM: logits that favour each example's label
    by a margin, written to cache_dir once and read back after."""

    def __init__(self):
        self.calls, self.computed = [], 0

    def __call__(self, task, train_ex, labels, *, teacher, cache_dir, seed, epochs, lr, keep_layers, progress,
                 smoothing=0.0, batch_size=16):
        self.calls.append(dict(teacher=teacher, cache_dir=Path(cache_dir), seed=seed, epochs=epochs, lr=lr,
                               keep_layers=keep_layers, batch_size=batch_size, smoothing=smoothing,
                               n=len(train_ex), labels=list(labels)))
        path = Path(cache_dir) / "teacher_logits.pt"
        cached = path.is_file()
        if not cached:
            self.computed += 1
            logits = torch.tensor([[1.5 if ex["label"] == label else -1.5 for label in labels] for ex in train_ex])
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(logits, path)
        return torch.load(path), {"cached": cached, "path": str(path), "seconds": 0.0}


def test_the_full_file_recipe_runs_the_teacher_once_and_trains_on_its_logits(tiny, data_dir, tmp_path, monkeypatch,
                                                                              capsys):
    import attnlab.tasks.prompt_teacher as prompt_teacher
    fake = FakeTeacher()
    monkeypatch.setattr(prompt_teacher, "teacher_logits", fake, raising=False)
    n = defaults.TEACHER_BELOW                                   # a file just at the threshold
    train = _sst2(data_dir, tmp_path / "train.tsv", 0, n)
    valid = _sst2(data_dir, tmp_path / "valid.tsv", 5000, 16)

    # the stages: the student's schedule is the recipe's, its features carry the teacher's logits
    run = FinetuneRun("sst2", tiny, tmp_path / "s", FinetuneOptions(
        train_file=str(train), valid_file=str(valid), teacher="smollm2", max_length=32, progress=False))
    run.split()
    run.teacher()
    run.schedule()
    assert run.full_file and len(run.train_ex) == n and run.soft.shape == (n, 2)   # no augmented copies
    assert (run.epochs, run.ema, run.freeze_embeddings, run.kd, run.temperature, run.precision) == (
        defaults.FULL_TEACHER_STUDENT_EPOCHS, defaults.FULL_TEACHER_EMA, False, defaults.FULL_TEACHER_KD,
        defaults.FULL_TEACHER_T, "auto")
    assert fake.calls[0] == dict(teacher="smollm2", cache_dir=tmp_path / "s" / "teacher", seed=42,
                                 epochs=defaults.FULL_TEACHER_EPOCHS, lr=defaults.FULL_TEACHER_LR,
                                 keep_layers=defaults.FULL_TEACHER_LAYERS, batch_size=defaults.FULL_TEACHER_BATCH,
                                 smoothing=defaults.FULL_TEACHER_SMOOTH, n=n, labels=["0", "1"])
    run.build_model()
    run.features()
    from attnlab.tasks.base import labels_of
    columns = [run.labels.index(label) for label in labels_of(run.net)[0]]
    assert all(f["soft_labels"] == run.soft[f["example"], columns].tolist() for f in run.feats)
    assert run.feats[0]["soft_labels"] == ([1.5, -1.5] if run.train_ex[0]["label"] == "0" else [-1.5, 1.5])
    assert run.net.backbone.embeddings.tok.weight.requires_grad                      # embeddings train
    err = capsys.readouterr().err
    assert "the full-file recipe" in err and "each with the teacher's logits" in err
    assert f"the student learns from 0.1 x the labels' loss + {defaults.FULL_TEACHER_KD:g} x" in err

    # one command, twice into the same output: the second run reuses the cached logits
    argv = ["finetune", "sst2", "--model", str(tiny), "--train", str(train), "--valid", str(valid), "--output",
            str(tmp_path / "cli"), "--teacher", "smollm2", "--epochs", "0.02", "--max-length", "32", "--no-progress"]
    summaries = []
    for _ in range(2):
        assert main(argv) == 0
        out, err = capsys.readouterr()
        summaries.append(json.loads(out))
    assert fake.computed == 2 and len(fake.calls) == 3          # the stage run above, then the two runs: one computes
    assert {c["cache_dir"] for c in fake.calls[1:]} == {tmp_path / "cli" / "teacher"}
    first, second = (s["teacher"] for s in summaries)
    assert (first["cached"], second["cached"]) == (False, True) and "reused the teacher's cached logits" in err
    assert first["kd"] == defaults.FULL_TEACHER_KD and first["recipe"] == "full file" and first["labeled_examples"] == n
    assert summaries[1]["train_examples"] == n and summaries[1]["ema"] == defaults.FULL_TEACHER_EMA
    assert summaries[1]["freeze_embeddings"] is False and summaries[1]["epochs"] == 0.02   # given by hand: kept


def test_below_the_threshold_a_teacher_keeps_the_few_label_path(tiny, files, tmp_path, monkeypatch):
    """--teacher on fewer than TEACHER_BELOW examples is today's recipe (augmented copies); the full-file stage
    is never asked."""
    import attnlab.tasks.prompt_teacher as prompt_teacher
    train, valid = files
    fake, seen = FakeTeacher(), {}
    monkeypatch.setattr(prompt_teacher, "teacher_logits", fake, raising=False)

    def copies(task, train_ex, labels, **kw):
        seen.update(kw, n=len(train_ex))
        raise RuntimeError("stop here")   # the path is what is checked, not the teacher
    monkeypatch.setattr(prompt_teacher, "teacher_examples", copies)
    run = FinetuneRun("sst2", tiny, tmp_path / "few", FinetuneOptions(
        train_file=str(train), valid_file=str(valid), teacher="smollm2", progress=False))
    run.split()
    with pytest.raises(RuntimeError, match="stop here"):
        run.teacher()
    assert fake.calls == [] and seen["n"] == 40 and seen["output"] == tmp_path / "few" / "teacher"


def test_the_full_file_recipe_with_a_real_tiny_teacher_caches_its_logits(tiny, data_dir, tmp_path, capsys):
    """The same command with prompt_teacher.teacher_logits itself and a tiny decoder as the teacher: the first run
    trains it and writes its logits under output/teacher, the second reads them back and trains no teacher."""
    from _adapt import smol_tokenizer, tiny_llama_config
    tok = smol_tokenizer()
    torch.manual_seed(0)
    teacher = tmp_path / "lm"
    attnlab.from_config(tiny_llama_config(len(tok), num_layers=2)).save(teacher)
    tok.save(teacher)
    train = _sst2(data_dir, tmp_path / "train.tsv", 0, defaults.TEACHER_BELOW)
    valid = _sst2(data_dir, tmp_path / "valid.tsv", 5000, 16)
    argv = ["finetune", "sst2", "--model", str(tiny), "--train", str(train), "--valid", str(valid), "--output",
            str(tmp_path / "o"), "--teacher", str(teacher), "--epochs", "0.02", "--max-length", "32", "--no-progress"]
    runs = []
    for _ in range(2):
        assert main(argv) == 0
        out, err = capsys.readouterr()
        runs.append((json.loads(out), err))
    (first, _), (second, err) = runs
    assert (first["teacher"]["cached"], second["teacher"]["cached"]) == (False, True)
    assert first["teacher"]["path"] == second["teacher"]["path"]
    assert Path(first["teacher"]["path"]).parent == tmp_path / "o" / "teacher" and Path(first["teacher"]["path"]).is_file()
    assert "reused the teacher's cached logits" in err and second["train_examples"] == defaults.TEACHER_BELOW


def test_a_task_run_without_files_keeps_its_dev_file_as_the_report_set(tiny, data_dir, tmp_path, capsys):
    """`finetune rte` with no file chooses its checkpoint on a part held out of train.tsv and scores RTE's
    dev.tsv once at the end: the dev file, a report set, never picks anything."""
    summary = finetune("rte", tiny, tmp_path / "rte", max_train_samples=40, max_eval_samples=16, epochs=1,
                       batch_size=16, progress=False)
    dev = data_dir / "glue/RTE/dev.tsv"
    assert summary["valid"] != str(dev) and "held out" in capsys.readouterr().err
    assert summary["test"] == str(dev) and summary["test_examples"] == 277 and "test_accuracy" in summary
    # a file given by hand is the user's choice: no report set is added
    given = finetune("rte", tiny, tmp_path / "given", valid_file=dev, max_train_samples=40, max_eval_samples=16,
                     epochs=1, batch_size=16, progress=False)
    assert given["valid"] == str(dev) and "test" not in given
