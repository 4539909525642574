"""The Trainer's fault guarantees hold for `attnlab finetune` (a GLUE task) and `attnlab finetune translation`:
a run SIGKILLed at a random moment and once inside a checkpoint write, then resumed with --resume, ends
equal to an uninterrupted run (the kept best model, the last checkpoint's weights and every metrics line);
a full disk while writing a checkpoint leaves the last one intact, stops with one line, and --resume goes on
from it. Tiny models and data (a 2-layer 32-wide BERT on 120 SST-2 lines; a 1-layer 16-wide Transformer on
32 sentence pairs), real processes, real SIGKILL."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import attnlab
from attnlab.cli import main as cli_main
from attnlab.config import ModelConfig
from attnlab.training import checkpoint as ckpt
from test_trainer import _single_thread  # noqa: F401  (autouse: one intra-op thread, the machine is shared)
from test_training_faults import assert_same_tensors, kill_when

REPO = Path(__file__).resolve().parents[2]
TIMING = ("tokens_per_s", "elapsed_s")


@pytest.fixture(scope="module")
def jobs(data_dir: Path, tmp_path_factory) -> dict[str, list[str]]:
    """The two commands (without --output), on files written here."""
    root = tmp_path_factory.mktemp("ft-faults")
    model = attnlab.from_config(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                                            dropout=0.1, attention_dropout=0.1))  # dropout: the RNG must resume too
    model.save(root / "tiny")
    attnlab.load_tokenizer("minilm").save(root / "tiny")
    lines = (data_dir / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines()
    (root / "train.tsv").write_text("\n".join(lines[:121]) + "\n")
    (root / "dev.tsv").write_text("\n".join([lines[0], *lines[200:240]]) + "\n")
    src = ["a dog runs", "two men sit", "a cat sleeps", "the sun is hot"] * 8
    tgt = ["ein hund läuft", "zwei männer sitzen", "eine katze schläft", "die sonne ist heiß"] * 8
    (root / "s.txt").write_text("\n".join(src) + "\n")
    (root / "t.txt").write_text("\n".join(tgt) + "\n")
    every = ["--save-every", "1", "--seed", "1", "--no-progress"]
    return {
        "sst2": ["finetune", "sst2", "--model", str(root / "tiny"), "--train", str(root / "train.tsv"),
                 "--valid", str(root / "dev.tsv"), "--epochs", "2", "--batch-size", "8", "--lr", "1e-3",
                 "--max-length", "32", "--eval-every", "5", *every],  # 15 steps an epoch, 30 in all
        "translation": ["finetune", "translation", "--train-src", str(root / "s.txt"), "--train-tgt",
                        str(root / "t.txt"), "--valid-src", str(root / "s.txt"), "--valid-tgt", str(root / "t.txt"),
                        "--set", "hidden_size=16", "--set", "num_layers=1", "--set", "num_heads=2",
                        "--set", "intermediate_size=32", "--set", "dropout=0.1", "--vocab-size", "120",
                        "--max-tokens", "64", "--epochs", "3", "--warmup", "2", "--eval-every", "4", *every],
    }


def launch(argv: list[str], out: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "attnlab", *argv, "--output", str(out), *extra], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(env or {})})


def newest_step(out: Path) -> int:
    found = ckpt.list_checkpoints(out)
    return int(found[-1].name.split("-")[1]) if found else 0


def metrics(out: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def tensors(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(next(path.glob("*.safetensors"))))


@pytest.mark.parametrize("job", ["sst2", "translation"])
def test_sigkill_then_resume_equals_an_uninterrupted_run(jobs, tmp_path, job):
    argv = jobs[job]
    straight = launch(argv, tmp_path / "straight")
    out, rng = tmp_path / "killed", random.Random(7)
    try:
        for k, target in enumerate([rng.randint(3, 6), rng.randint(9, 12)]):
            in_save = k == 1  # the second kill lands inside a checkpoint write (temporary complete, not renamed)
            proc = launch(argv, out, *(["--resume"] if k else []),
                          env={"ATTNLAB_TEST_CHECKPOINT_PAUSE": f"{target}:60"} if in_save else None)
            if in_save:
                pattern = f".tmp-step-{target:06d}-*/trainer.pt"  # the temporary is complete
                ready, settle = lambda: bool(list((out / "checkpoints").glob(pattern))), 0.0
            else:  # somewhere in a step, an evaluation or a save
                ready, settle = lambda: newest_step(out) >= target, rng.uniform(0, 0.1)
            kill_when(proc, ready, settle, f"kill {k}")
            if in_save:  # the half-written checkpoint is invisible: the newest is the step before
                assert newest_step(out) == target - 1
        done = launch(argv, out, "--resume")
        _, err = done.communicate(timeout=300)
        assert done.returncode == 0, err[-3000:]
        _, err = straight.communicate(timeout=300)
        assert straight.returncode == 0, err[-3000:]
    finally:
        straight.kill()
        straight.wait()
    a, b = tmp_path / "straight", out
    assert_same_tensors(tensors(a), tensors(b))  # the kept best model
    last_a, last_b = ckpt.list_checkpoints(a)[-1], ckpt.list_checkpoints(b)[-1]
    assert last_a.name == last_b.name
    assert_same_tensors(tensors(last_a / "model"), tensors(last_b / "model"))  # the weights after the last step
    assert metrics(a) == metrics(b)  # every evaluation logged once, with the same scores
    assert sum("loss" in r for r in metrics(b)) >= 1 and sum(k.startswith("eval_") for r in metrics(b) for k in r) >= 2
    summary = json.loads((b / "metrics.json").read_text())
    assert summary["steps"] == newest_step(b)


@pytest.mark.parametrize("job", ["sst2", "translation"])
def test_a_full_disk_keeps_the_last_checkpoint_and_stops_with_one_line(jobs, tmp_path, monkeypatch, capsys, job):
    real, calls = ckpt.torch.save, []

    def full_disk(*a, **k):
        calls.append(1)
        if len(calls) == 3:  # the third checkpoint's trainer state
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **k)

    monkeypatch.setattr(ckpt.torch, "save", full_disk)
    out = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = cli_main([*jobs[job], "--output", str(out)])
    monkeypatch.undo()
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert code == 1
    second, third = out / "checkpoints" / "step-000002", out / "checkpoints" / "step-000003"
    assert errors == [f"attnlab finetune: error: could not write checkpoint {third}: No space left on device; "
                      f"the last good checkpoint, {second}, is intact"]
    assert ckpt.list_checkpoints(out)[-1] == second
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".tmp")]  # the temporary was removed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = cli_main([*jobs[job], "--output", str(out), "--resume"])
    assert code == 0 and "resumed from step 2" in capsys.readouterr().err  # the kept checkpoint loads
    assert newest_step(out) > 3


def test_a_position_saved_after_the_last_batch_of_an_epoch_resumes_with_the_next_epoch():
    """The checkpoint after an epoch's last batch holds {"epoch": e, "position": len}; iterating the
    restored batches must give epoch e + 1's first batch, as the uninterrupted run does (it once gave
    nothing, and the Trainer stopped with "train_data produced no batches")."""
    from attnlab.tasks.common import EpochBatches

    def plan(epoch):
        order = list(range(6))
        random.Random(epoch).shuffle(order)
        return [order[:3], order[3:]]

    straight = EpochBatches(plan, list)
    taken = [b for _ in range(2) for b in straight]  # two whole epochs
    first = EpochBatches(plan, list)
    it = iter(first)
    taken_then_killed = [next(it), next(it)]
    resumed = EpochBatches(plan, list)
    resumed.load_state_dict(first.state_dict())
    assert first.state_dict() == {"epoch": 0, "position": 2}
    assert taken_then_killed + list(resumed) == taken


def cli(argv: list[str]) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny vocabularies: "exceeds max_length" and the like
        return cli_main(argv)


def without_timing(summary: dict) -> dict:
    return {k: without_timing(v) if isinstance(v, dict) else v for k, v in summary.items()
            if k not in ("elapsed_s", "minutes", "wall_time_s")}


def test_translation_resumed_after_its_best_step_reports_the_best_of_the_whole_run(jobs, tmp_path):
    """BLEU is best at step 4 (of 12); a run killed during step 12 resumes from step 11 and evaluates once more
    without a better BLEU: its summary must still hold step 4's scores (sacreBLEU signature included), as the
    uninterrupted run's does - the Trainer's checkpoint keeps only the numbers, OUTPUT/best.json the rest."""
    straight, out = tmp_path / "straight", tmp_path / "killed"
    assert cli([*jobs["translation"], "--output", str(straight)]) == 0
    shutil.copytree(straight, out)
    shutil.rmtree(out / "checkpoints" / "step-000012")  # as it stood when killed during step 12
    (out / "metrics.json").unlink()
    assert cli([*jobs["translation"], "--output", str(out), "--resume"]) == 0
    a, b = (json.loads((d / "metrics.json").read_text()) for d in (straight, out))
    assert b["steps"] == 12 and b["best"]["step"] == 4 and "signature" in b["best"]
    assert without_timing(a) == without_timing(b)
    assert json.loads((out / "best.json").read_text())["step"] == 4


def kept_files(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()
            if p.is_file() and p.name != "metrics.jsonl"}


@pytest.mark.parametrize("job", ["sst2", "translation"])
def test_a_full_disk_while_keeping_the_best_model_is_one_line_and_the_model_kept_before_stays_whole(
        jobs, tmp_path, monkeypatch, capsys, job):
    """The best model lives in OUTPUT itself. A first run keeps one; a new run into the same OUTPUT (another
    seed) finds its disk full while writing its own first best: one line naming the step, the directory
    and the cause, and every file of the model kept before is byte for byte what it was. In an empty
    OUTPUT the line says no model was kept yet."""
    import safetensors.torch
    out, empty = tmp_path / "run", tmp_path / "empty"
    short = ["--epochs", "0.4"] if job == "sst2" else ["--epochs", "1"]  # 6 (sst2) or 4 steps, evaluated once
    assert cli([*jobs[job], "--output", str(out), *short]) == 0
    before = kept_files(out)
    assert "model.safetensors" in before and "config.json" in before
    capsys.readouterr()
    real, writes = safetensors.torch.save_file, []

    def full_disk(tensors, filename, *a, **k):
        if Path(filename).parent in (out, empty):  # the best model's weights (a temporary beside them)
            writes.append(filename)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(tensors, filename, *a, **k)

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    code = cli([*jobs[job], "--output", str(out), *short, "--seed", "2"])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert code == 1 and len(writes) == 1
    first = 5 if job == "sst2" else 4  # the first evaluation
    assert errors == [f"attnlab finetune: error: could not write the best model (step {first}) to {out}: "
                      "No space left on device; the model kept there before is left whole"]
    assert kept_files(out) == before  # weights, config, tokenizer, best.json, metrics.json: untouched
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]  # the temporary was removed
    assert cli([*jobs[job], "--output", str(empty), *short]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"to {empty}: No space left on device; "
                                                                      "no model was kept there yet")
    assert not (empty / "model.safetensors").exists()


def test_resume_with_other_options_is_one_line_naming_the_field_before_any_training(jobs, tmp_path, capsys):
    """--resume continues the run its checkpoint came from; other options (--epochs, hence the step count;
    --lr; --seed) would make it another run: refused with one line naming the field and both values, and
    nothing in OUTPUT changes. The same options resume (here: nothing left to train)."""
    out = tmp_path / "run"
    argv = [*jobs["sst2"], "--output", str(out), "--epochs", "0.4", "--save-every", "3"]  # 6 steps
    assert cli(argv) == 0
    capsys.readouterr()
    last, before = out / "checkpoints" / "step-000006", kept_files(out)
    log = (out / "metrics.jsonl").read_text()
    for extra, field, old, new in ((["--epochs", "0.8"], "max_steps", 6, 12), (["--lr", "2e-3"], "lr", 0.001, 0.002),
                                   (["--seed", "2"], "seed", 1, 2)):
        assert cli([*argv, "--resume", *extra]) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"attnlab finetune: error: cannot resume from {last}: it was written by a run with {field}={old!r}, "
            f"this one has {field}={new!r}; resume with the options of that run (or start afresh without resume)")
        assert kept_files(out) == before and (out / "metrics.jsonl").read_text() == log
        assert ckpt.list_checkpoints(out)[-1] == last
    assert cli([*argv, "--resume"]) == 0
    assert "resumed from step 6" in capsys.readouterr().err


def test_the_trainer_refuses_to_resume_another_run(tmp_path):
    """The check lives in the Trainer's resume, so `attnlab pretrain --resume` (train.resume=true) has it too;
    what may differ (grad_accum and the process count under FSDP, max_minutes) still resumes."""
    from attnlab.heads import MaskedLM
    from attnlab.training import TrainArgs, Trainer
    from _pretrain_utils import tiny_bert
    torch.manual_seed(0)
    ids = torch.randint(5, 50, (4, 8))

    def trainer(**kw):
        args = {**dict(output_dir=str(tmp_path), max_steps=4, log_every=1, progress=False, save_every=2), **kw}
        return Trainer(MaskedLM(tiny_bert(50, dropout=0.0, attention_dropout=0.0)), TrainArgs(**args),
                       [{"input_ids": ids, "labels": ids}])

    trainer().train(until=2)
    for kw, field in ((dict(max_steps=8), "max_steps"), (dict(warmup_steps=1), "warmup_steps"),
                      (dict(schedule="cosine"), "schedule"), (dict(weight_decay=0.0), "weight_decay"),
                      (dict(eval_every=1), "eval_every"), (dict(best_metric="loss"), "best_metric"),
                      (dict(lr=1e-3), "lr"), (dict(seed=1), "seed")):
        other = trainer(resume=True, **kw)
        with pytest.raises(ValueError, match=rf"^cannot resume from .*step-000002: it was written by a run with "
                                             rf"{field}=.*, this one has {field}="):
            other.train()
        assert other.step == 0
    same = trainer(resume=True, grad_accum=2, max_minutes=5.0)
    same.train()
    assert same.step == 4


def test_a_negative_save_every_is_one_line_before_any_work(jobs, tmp_path, capsys):
    assert cli([*jobs["sst2"], "--output", str(tmp_path / "run"), "--save-every", "-1"]) == 1
    assert capsys.readouterr().err.strip() == ("attnlab finetune: error: --save-every -1: must be 0 "
                                               "(no training checkpoints) or more")
    assert not (tmp_path / "run").exists()
    from attnlab.training import TrainArgs
    with pytest.raises(ValueError, match=r"train.save_every=-1 must not be negative"):
        TrainArgs(save_every=-1).validate()  # pretrain's recipe key too


def test_translation_resumed_with_another_vocab_size_keeps_the_saved_tokenizer(jobs, tmp_path):
    """A resumed translation run reuses the tokenizer in OUTPUT (its checkpoints and the kept best model were
    trained with it) instead of training one from the new options, which overwrote the kept model's tokenizer
    and then failed on the checkpoint's embedding shape."""
    out = tmp_path / "run"
    argv = [*jobs["translation"], "--output", str(out), "--epochs", "2"]  # 8 steps
    assert cli(argv) == 0
    before = kept_files(out)
    shutil.rmtree(out / "checkpoints" / "step-000008")
    assert cli([*argv, "--resume", "--vocab-size", "60"]) == 0
    after = kept_files(out)
    assert after["tokenizer.json"] == before["tokenizer.json"] and after["model.safetensors"] == before["model.safetensors"]
