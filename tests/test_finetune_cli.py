"""End to end through the CLI: a tiny real fine-tune (a small random BERT with MiniLM's vocabulary, on a
few hundred real examples), metrics.json written, the saved model reloads with the same predictions,
and `evaluate` / `predict` on it; bad input exits with one clear line."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.config import ModelConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A 2-layer, 64-wide BERT with MiniLM's tokenizer: trains in seconds."""
    out = tmp_path_factory.mktemp("tiny")
    model = attnlab.from_config(ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                                            dropout=0.0, attention_dropout=0.0))
    model.save(out)
    attnlab.load_tokenizer("minilm").save(out)
    return out


def _head(path: Path, n: int, dst: Path, keep_header: bool = True) -> Path:
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    dst.write_text("\n".join(lines[:n + 1] if keep_header else lines[:n]) + "\n", encoding="utf-8")
    return dst


def test_finetune_mrpc_then_evaluate_and_predict(tiny, data_dir, tmp_path, capsys):
    valid = _head(data_dir / "glue/MRPC/dev.tsv", 60, tmp_path / "dev.tsv")
    out = tmp_path / "mrpc"
    rc = main(["finetune", "mrpc", "--model", str(tiny), "--output", str(out), "--valid", str(valid),
               "--epochs", "2", "--lr", "1e-3", "--batch-size", "16", "--max-length", "64",
               "--max-train-samples", "300", "--no-progress"])
    assert rc == 0
    summary = json.loads((out / "metrics.json").read_text())
    assert summary["train_examples"] == 300 and summary["valid_examples"] == 60
    assert {"eval_accuracy", "eval_f1", "wall_time_s"} <= set(summary)
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("step" in l for l in lines) and any("eval_f1" in l for l in lines)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and config["id2label"] == {"0": "0", "1": "1"}
    printed = capsys.readouterr()
    assert json.loads(printed.out) == summary  # stdout is the summary alone (pipeable); progress goes to stderr
    assert "step " in printed.err

    # the kept checkpoint is the best one: evaluating it reproduces the best validation scores
    assert main(["evaluate", "mrpc", "--model", str(out), "--data", str(valid)]) == 0  # max-length from metrics.json
    scores = json.loads(capsys.readouterr().out)
    assert scores["accuracy"] == pytest.approx(summary["eval_accuracy"], abs=1e-3)
    assert scores["f1"] == pytest.approx(summary["eval_f1"], abs=1e-3)

    pairs = tmp_path / "pairs.txt"
    pairs.write_text("A man is eating.\tSomeone eats.\nThe sky is blue.\tStocks fell sharply on Monday.\n")
    assert main(["predict", "mrpc", "--model", str(out), "--input", str(pairs), "--output",
                 str(tmp_path / "labels.txt")]) == 0
    assert all(l in ("0", "1") for l in (tmp_path / "labels.txt").read_text().splitlines())
    assert len((tmp_path / "labels.txt").read_text().splitlines()) == 2


def test_finetune_stsb_regression(tiny, data_dir, tmp_path):
    valid = _head(data_dir / "glue/STS-B/dev.tsv", 40, tmp_path / "dev.tsv")
    out = tmp_path / "stsb"
    assert main(["finetune", "stsb", "--model", str(tiny), "--output", str(out), "--valid", str(valid),
                 "--epochs", "1", "--batch-size", "32", "--max-train-samples", "128", "--no-progress"]) == 0
    summary = json.loads((out / "metrics.json").read_text())
    assert {"eval_pearson", "eval_spearman"} <= set(summary)
    assert json.loads((out / "config.json").read_text())["problem_type"] == "regression"


def test_finetune_conll_and_predict_conll_format(tiny, data_dir, tmp_path):
    valid = tmp_path / "valid.txt"
    valid.write_text("\n".join((data_dir / "conll2003/valid.txt").read_text().splitlines()[:300]) + "\n")
    out = tmp_path / "ner"
    assert main(["finetune", "conll2003", "--model", str(tiny), "--output", str(out), "--valid", str(valid),
                 "--epochs", "1", "--lr", "1e-3", "--max-train-samples", "200", "--no-progress"]) == 0
    summary = json.loads((out / "metrics.json").read_text())
    assert {"eval_f1", "eval_precision", "eval_recall"} <= set(summary)
    words = tmp_path / "words.txt"
    words.write_text("Peter\nBlackburn\n\nBRUSSELS\n")
    assert main(["predict", "conll2003", "--model", str(out), "--input", str(words),
                 "--output", str(tmp_path / "tags.conll")]) == 0
    blocks = (tmp_path / "tags.conll").read_text().strip().split("\n\n")
    assert [len(b.splitlines()) for b in blocks] == [2, 1]
    assert blocks[0].splitlines()[0].split()[0] == "Peter"


def test_finetune_squad_subset(tiny, data_dir, tmp_path):
    out = tmp_path / "qa"
    assert main(["finetune", "squad", "--model", str(tiny), "--output", str(out), "--epochs", "1",
                 "--max-train-samples", "64", "--max-eval-samples", "32", "--max-length", "128",
                 "--no-progress"]) == 0
    summary = json.loads((out / "metrics.json").read_text())
    assert {"eval_exact_match", "eval_f1"} <= set(summary) and summary["valid_examples"] == 32


def test_bad_input_is_one_line_and_exit_1(tiny, tmp_path, capsys):
    bad = tmp_path / "train.tsv"
    bad.write_text("sentence\tlabel\ngood movie\t1\nno label here\n")
    rc = main(["finetune", "sst2", "--model", str(tiny), "--output", str(tmp_path / "o"), "--train", str(bad),
               "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and "train.tsv:3: missing column label (column 2)" in err


def test_finetune_from_a_pretraining_checkpoint_in_attnlabs_own_layout(data_dir, tmp_path, capsys):
    """What `attnlab pretrain` writes for a switch BERT's HF layout cannot express (here pre-LN) is a
    BertForPreTraining in attnlab's own layout; fine-tuning takes its backbone and pooler and puts the
    task's head on top (it used to load the pretraining class itself and fail on the label shape)."""
    from attnlab.heads import PreTraining, SequenceClassification
    from attnlab.interop.native import save_model
    src = tmp_path / "pretrained"
    pre = PreTraining(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                  norm_placement="pre", max_position_embeddings=64))
    save_model(pre, src)
    attnlab.load_tokenizer("minilm").save(src)
    assert (src / "attnlab_config.json").exists() and not (src / "config.json").exists()
    train = _head(data_dir / "glue/SST-2/train.tsv", 200, tmp_path / "train.tsv")
    out = tmp_path / "sst2"
    assert main(["finetune", "sst2", "--model", str(src), "--output", str(out), "--train", str(train),
                 "--valid", str(train), "--epochs", "1", "--batch-size", "32", "--max-length", "32",
                 "--no-progress"]) == 0
    tuned = attnlab.load(out)
    assert isinstance(tuned, SequenceClassification) and tuned.config.norm_placement == "pre"
    # the word embeddings are frozen by default: they came over from the pretraining checkpoint unchanged
    assert torch.equal(tuned.backbone.embeddings.tok.weight, pre.backbone.embeddings.tok.weight)
    capsys.readouterr()
    assert main(["evaluate", "sst2", "--model", str(out), "--data", str(train)]) == 0
    assert 0 <= json.loads(capsys.readouterr().out)["accuracy"] <= 100


def test_a_small_training_file_gives_at_most_10_percent_to_validation_and_says_so(tiny, tmp_path, capsys):
    """SST-2's 872-sentence hold-out took 44% of a 2,000-line file, silently."""
    lines = [f"review {i} of the film says it is {'great' if i % 2 else 'dull'}\t{i % 2}" for i in range(200)]
    train = tmp_path / "mine.tsv"
    train.write_text("sentence\tlabel\n" + "\n".join(lines) + "\n")
    out = tmp_path / "o"
    rc = main(["finetune", "sst2", "--model", str(tiny), "--output", str(out), "--train", str(train),
               "--epochs", "1", "--no-progress"])
    printed = capsys.readouterr()
    assert rc == 0
    summary = json.loads(printed.out)
    assert summary["valid_examples"] == 20 and summary["train_examples"] == 180
    assert f"finetune sst2: train 180 examples, validate 20 (10% held out of {train}" in printed.err
    assert summary["batch_size"] == 16 and summary["epochs"] == 1   # small data: batches of 16; --epochs kept
    assert summary["lr"] == 1e-4 and "finetune sst2: 12 steps = 1 epochs of 12 batches of 16, lr 0.0001" in printed.err


def test_the_issue_sized_file_keeps_90_percent_for_training():
    from attnlab.tasks.defaults import holdout_size
    assert holdout_size(2000, 872) == 200         # was 872: 44% of the user's data
    assert holdout_size(8000, 872) == 800
    assert holdout_size(8720, 872) == 872         # SST-2's own size once it is at most 10%
    assert holdout_size(67349, 872) == 872
    assert holdout_size(5, 872) == 1              # always something to validate on


def test_the_default_schedule_gives_small_data_more_steps():
    from attnlab.tasks.defaults import MIN_STEPS, default_schedule

    def steps(n, epochs=1, batch=32, lr=5e-5, **given):
        e, b, l = default_schedule(n, epochs, batch, lr, **given)
        return math.ceil(n / b) * e, e, b, l

    small, mid, full = steps(225), steps(900), steps(66000)
    assert small[0] >= MIN_STEPS and mid[0] >= MIN_STEPS      # was 8 and 29 steps at batch 32, one epoch
    assert small[1] > mid[1] > full[1] == 1                    # more epochs the fewer the examples
    assert small[2] == mid[2] == 16 and full[2] == 32          # smaller batches for small data
    assert steps(20)[1] == 30                                  # epochs are capped for tiny files
    assert steps(225, epochs=2, epochs_given=True)[1] == 2     # what the user set is kept
    assert steps(225, batch=64, batch_given=True)[2] == 64
    assert small[3] == 1e-4 and mid[3] == full[3] == 5e-5     # a higher peak rate for tiny data ...
    assert steps(225, lr=3e-5, lr_given=True)[3] == 3e-5       # ... unless the user chose one


def test_max_minutes_stops_the_encoder_finetune_evaluates_and_keeps_the_model(tiny, data_dir, tmp_path, capsys):
    # --max-minutes used to be read only by translation: an encoder task accepted it and ignored it
    out = tmp_path / "budget"
    assert main(["finetune", "sst2", "--model", str(tiny), "--output", str(out), "--epochs", "3",
                 "--max-train-samples", "200", "--max-eval-samples", "40", "--max-length", "32",
                 "--max-minutes", "1e-9", "--no-progress"]) == 0
    summary = json.loads((out / "metrics.json").read_text())
    assert summary["stopped_by_time"] is True and summary["max_minutes"] == 1e-9
    assert summary["steps"] == 1 and summary["best_step"] == 1 and "eval_accuracy" in summary
    assert "stopped at step 1: train.max_minutes=1e-09 reached" in capsys.readouterr().err
    assert (out / "model.safetensors").exists()
    with pytest.raises(SystemExit) as e:
        main(["finetune", "sst2", "--model", str(tiny), "--output", str(out), "--max-minutes", "0"])
    assert e.value.code == 2 and "must be more than 0 minutes" in capsys.readouterr().err


def test_layer_decay_and_ema_reach_the_trainer_and_the_summary(tiny, data_dir, tmp_path, capsys):
    out = tmp_path / "llrd"
    assert main(["finetune", "sst2", "--model", str(tiny), "--output", str(out), "--epochs", "1",
                 "--max-train-samples", "64", "--max-eval-samples", "16", "--max-length", "32",
                 "--layer-decay", "0.8", "--ema", "0.99", "--no-progress"]) == 0
    summary = json.loads((out / "metrics.json").read_text())
    assert summary["layer_decay"] == 0.8 and summary["ema"] == 0.99
    assert "(x0.8 a layer down), weights averaged (EMA 0.99)" in capsys.readouterr().err
    for flag, bad in [("--layer-decay", "0"), ("--layer-decay", "1.5"), ("--layer-decay", "x"), ("--ema", "1"),
                      ("--ema", "-0.1")]:
        with pytest.raises(SystemExit) as e:
            main(["finetune", "sst2", "--model", str(tiny), "--output", str(out), flag, bad])
        assert e.value.code == 2 and flag in capsys.readouterr().err


def test_test_file_scores_the_kept_model_on_data_that_chose_nothing(tiny, data_dir, tmp_path, capsys):
    lines = (data_dir / "glue/SST-2/train.tsv").read_text().splitlines()
    train, valid, test = tmp_path / "train.tsv", tmp_path / "valid.tsv", tmp_path / "test.tsv"
    train.write_text("\n".join(lines[:81]) + "\n")
    valid.write_text("\n".join(lines[:1] + lines[81:101]) + "\n")
    test.write_text("\n".join(lines[:1] + lines[101:131]) + "\n")
    out = tmp_path / "out"
    assert main(["finetune", "sst2", "--model", str(tiny), "--train", str(train), "--valid", str(valid),
                 "--test", str(test), "--output", str(out), "--epochs", "1", "--no-progress"]) == 0
    summary = json.loads((out / "metrics.json").read_text())
    assert summary["test"] == str(test) and summary["test_examples"] == 30 and "eval_accuracy" in summary
    assert "the kept model (step" in capsys.readouterr().err
    main(["evaluate", "sst2", "--model", str(out), "--data", str(test)])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["accuracy"] == summary["test_accuracy"]
    # a --test part that cannot be read: the one-line input check every command makes, before any work
    for bad, why in [(tmp_path / "nope.tsv", "no such file"), (tmp_path, "is a directory, expected a file")]:
        assert main(["finetune", "sst2", "--model", str(tiny), "--train", str(train), "--test", f"{test},{bad}",
                     "--output", str(tmp_path / "o2")]) != 0
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"attnlab finetune: error: --test {bad}: {why}"
        assert not (tmp_path / "o2").exists()  # refused before anything was written
    with pytest.raises(FileNotFoundError, match="test file .*nope.tsv does not exist"):  # the API checks too
        attnlab.tasks.finetune("sst2", str(tiny), tmp_path / "o3", train_file=str(train), test_file=str(tmp_path / "nope.tsv"))


@pytest.mark.parametrize("argv, message", [
    (["sst2", "--model", "minilm", "--warmup", "100", "--eval-beams", "4"],
     "finetune sst2 does not read --warmup, --eval-beams; remove them"),
    (["sst2", "--model", "t5-small", "--text-to-text", "--pooling", "mean"],
     "finetune sst2 --text-to-text does not read --pooling; remove it"),
    (["translation", "--lr", "1e-3", "--precision", "bf16"],
     "finetune translation does not read --precision, --lr; remove them"),
    (["translation", "--layer-decay", "0.8"], "finetune translation does not read --layer-decay; remove it"),
    (["translation", "--test", "t.tsv"], "finetune translation does not read --test; remove it"),
])
def test_an_option_the_run_would_not_read_is_refused_before_any_work(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.tsv").write_text("sentence\tlabel\n")  # an input that exists: the refusal is of the option
    # argparse takes every option for every task, so without this e.g. --warmup on SST-2 was silently ignored
    assert main(["finetune", *argv, "--output", str(tmp_path / "o")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # (a CPU without bf16 warns first of --precision bf16)
    assert last == f"attnlab finetune: error: {message} (see finetune --help for what it takes)"
    assert not (tmp_path / "o").exists()


def test_saying_what_the_run_does_anyway_is_no_error():
    # translation trains in fp32, so `--precision fp32` is true of it: refused only for a value it would not honour
    from attnlab.cli.finetune import _refuse_unread
    from attnlab.cli import build_parser
    args = build_parser().parse_args(["finetune", "translation", "--precision", "fp32", "--output", "o"])
    _refuse_unread(args, "translation")
    args = build_parser().parse_args(["finetune", "sst2", "--model", "t5-small", "--text-to-text",
                                      "--precision", "fp32", "--output", "o"])
    _refuse_unread(args, "text-to-text")
    args = build_parser().parse_args(["finetune", "sst2", "--model", "t5-small", "--text-to-text",
                                      "--precision", "auto", "--output", "o"])
    with pytest.raises(ValueError, match="does not read --precision"):
        _refuse_unread(args, "text-to-text")


def test_notes_are_said_once_under_torchrun(monkeypatch, capsys):
    """torchrun starts one process per rank, each running the same stages: only rank 0 prints the notes."""
    from attnlab.tasks.finetune_stages import _say
    monkeypatch.setenv("RANK", "1")
    _say("finetune sst2: a note")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    _say("finetune sst2: a note")
    assert capsys.readouterr().err == "finetune sst2: a note\n"


def test_the_summary_is_printed_once_under_torchrun(monkeypatch, capsys):
    """Every torchrun process runs the recipe; only rank 0 (which alone scores the report set) prints the JSON."""
    from attnlab.cli.finetune import _print_summary
    monkeypatch.setenv("RANK", "1")
    _print_summary({"task": "squad"})
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("RANK", "0")
    _print_summary({"task": "squad"})
    assert json.loads(capsys.readouterr().out) == {"task": "squad"}


def test_only_rank_0_writes_the_summary_files(tmp_path, monkeypatch):
    """metrics.json and options.json come from the first process, whose summary has the report-set scores; a
    second rank finishing later must not overwrite them with its own."""
    from attnlab.tasks.finetune import FinetuneRun
    from attnlab.tasks.finetune_options import FinetuneOptions
    for rank in (1, 0):
        run = object.__new__(FinetuneRun)
        run.rank, run.output, run.options = rank, tmp_path, FinetuneOptions()
        monkeypatch.setattr(run, "summary", lambda r=rank: {"rank": r})
        assert run.save() == {"rank": rank}
        assert (tmp_path / "metrics.json").exists() == (rank == 0)
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"rank": 0}
