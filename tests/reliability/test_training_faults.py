"""Training under faults: SIGKILL at random moments (one inside a checkpoint write), a full disk while
saving, and a non-finite loss. Runs a 2-layer 32-wide character GPT through the real `attnlab pretrain`
command, so a kill is a real SIGKILL of a real process."""
from __future__ import annotations

import errno
import importlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from attnlab.cli import main as cli_main
from attnlab.heads import MaskedLM
from attnlab.training import Trainer, TrainArgs
from attnlab.training import checkpoint as ckpt
from attnlab.training.pretrain import DataConfig, ensure_corpus

from _pretrain_utils import tiny_bert
from test_trainer import _single_thread  # noqa: F401  (autouse: one intra-op thread, the machine is shared)

REPO = Path(__file__).resolve().parents[2]
MAX_STEPS = 24
TIMING = ("tokens_per_s", "elapsed_s")


@pytest.fixture(scope="module")
def corpus(data_dir: Path, tmp_path_factory) -> Path:
    """The first 30,000 characters of tiny_shakespeare, character-level, last 10% held out."""
    root = tmp_path_factory.mktemp("faults")
    text = root / "text.txt"
    text.write_text((data_dir / "tiny_shakespeare" / "input.txt").read_text()[:30_000])
    cfg = DataConfig(path=str(root / "corpus"), files=[str(text)], tokenizer="char", documents="file", raw=True,
                     heldout=0.1, heldout_mode="tail")
    return ensure_corpus(cfg, progress=False)


def write_recipe(corpus: Path, path: Path, **train) -> Path:
    """A tiny GPT recipe (dropout on, so an exact resume also needs the RNG state back)."""
    values = dict(max_steps=MAX_STEPS, lr=3e-3, warmup_steps=4, schedule="cosine", log_every=1, eval_every=10,
                  save_every=1, keep_last=2, seed=3, progress=False)
    values.update(train)
    path.write_text(yaml.safe_dump({
        "model": dict(model_type="gpt2", causal=True, hidden_size=32, num_layers=2, num_heads=2,
                      intermediate_size=64, max_position_embeddings=32, norm_placement="pre",
                      activation="gelu_tanh", embedding_norm=False, final_norm=True, pooler=False,
                      type_vocab_size=0, norm_eps=1e-5, dropout=0.1, attention_dropout=0.1),
        "data": dict(path=str(corpus), seq_len=32, batch_size=4, eval_batches=2),
        "objective": dict(kind="clm", random_windows=True),
        "train": values}))
    return path


def launch(recipe: Path, out: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "attnlab", "pretrain", "--config", str(recipe), f"train.output_dir={out}", *extra]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]


def metrics(out: Path) -> list[dict]:
    """metrics.jsonl without the timing fields (a line torn by a kill is skipped)."""
    rows = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        try:
            rows.append({k: v for k, v in json.loads(line).items() if k not in TIMING})
        except json.JSONDecodeError:
            pass
    return rows


def last_logged_step(out: Path) -> int:
    return max((r["step"] for r in metrics(out)), default=0) if (out / "metrics.jsonl").exists() else 0


def assert_same_tensors(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def optimizer_tensors(checkpoint: Path) -> dict:
    state = torch.load(checkpoint / "trainer.pt", weights_only=True)["optimizer"]["state"]
    return {f"{i}.{k}": v for i, s in state.items() for k, v in s.items()}


def kill_when(proc: subprocess.Popen, ready, settle: float, what: str, timeout: float = 120) -> None:
    """SIGKILL `proc` `settle` seconds after `ready()` first holds; fails when the run ends before that."""
    deadline = time.time() + timeout
    try:
        while time.time() < deadline and proc.poll() is None:
            if ready():
                time.sleep(settle)
                break
            time.sleep(0.01)
        assert proc.poll() is None, f"{what}: the run ended first: {proc.stderr.read()[-2000:]}"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_sigkill_at_random_moments_then_resume_equals_an_uninterrupted_run(corpus, tmp_path):
    recipe = write_recipe(corpus, tmp_path / "recipe.yaml")
    straight = launch(recipe, tmp_path / "straight")  # alongside the interrupted one
    try:
        out = tmp_path / "killed"
        rng = random.Random(20240610)
        # kill k happens just after step ~targets[k]: a fresh run, a resumed one, a resumed resumed one
        targets = [6 * k + rng.randint(2, 5) for k in range(3)]
        for k, target in enumerate(targets):
            in_save = k == 1  # this kill lands inside a checkpoint write: temporary complete, not yet renamed
            proc = launch(recipe, out, *(["--resume"] if k else []),
                          env={"ATTNLAB_TEST_CHECKPOINT_PAUSE": f"{target}:60"} if in_save else None)
            if in_save:
                pattern = f".tmp-step-{target:06d}-*/trainer.pt"  # the temporary is complete
                ready, settle = lambda: bool(list((out / "checkpoints").glob(pattern))), 0.2
            else:  # somewhere in the forward, backward, eval or save
                ready, settle = lambda: last_logged_step(out) >= target, rng.uniform(0, 0.06)
            kill_when(proc, ready, settle, f"kill {k}")
            found = ckpt.list_checkpoints(out)
            if in_save:  # the half-done checkpoint is there but invisible; the previous one is the newest
                assert list((out / "checkpoints").glob(f".tmp-step-{target:06d}-*"))
                assert found[-1].name == f"step-{target - 1:06d}"
            assert found and int(found[-1].name.split("-")[1]) >= target - 1  # progress was kept
        finish(launch(recipe, out, "--resume"))
        finish(straight)
    finally:
        straight.kill()
        straight.wait()

    a, b = tmp_path / "straight", out
    assert_same_tensors(load_file(str(a / "model" / "model.safetensors")),
                        load_file(str(b / "model" / "model.safetensors")))
    last = f"checkpoints/step-{MAX_STEPS:06d}"
    assert_same_tensors(optimizer_tensors(a / last), optimizer_tensors(b / last))
    assert metrics(a) == metrics(b)  # every step logged once, with the same loss, lr and evaluations
    assert [r["step"] for r in metrics(b) if "loss" in r] == list(range(1, MAX_STEPS + 1))
    assert not [p for p in (b / "checkpoints").iterdir() if p.name.startswith(".tmp")]


def test_pruning_never_leaves_a_half_deleted_checkpoint(tmp_path, monkeypatch):
    """keep_last=1: the checkpoint just written survives even when its step is not the highest, and a
    kill in the middle of deleting an old one leaves only complete checkpoints in sight."""
    model = MaskedLM(tiny_bert(40))
    state = {"step": 0}
    ckpt.save_checkpoint(tmp_path, 5, model, state, keep_last=1)
    ckpt.save_checkpoint(tmp_path, 3, model, state, keep_last=1)  # e.g. a new run in an old directory
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-000003"]

    def dying_rmtree(path, *a, **k):  # deletes one file, then the process "dies"
        next(Path(path).rglob("*.safetensors")).unlink()
        raise KeyboardInterrupt("killed while pruning")

    monkeypatch.setattr(ckpt.shutil, "rmtree", dying_rmtree)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(tmp_path, 4, model, state, keep_last=1)
    monkeypatch.undo()
    found = ckpt.list_checkpoints(tmp_path)
    assert [p.name for p in found] == ["step-000004"]
    ckpt.load_checkpoint(found[-1], MaskedLM(tiny_bert(40)))


@pytest.mark.parametrize("failing", ["weights", "trainer state"])
def test_a_full_disk_keeps_the_previous_checkpoint_and_stops_with_one_line(corpus, tmp_path, monkeypatch, capsys,
                                                                           failing):
    recipe = write_recipe(corpus, tmp_path / "recipe.yaml", max_steps=4, eval_every=0)
    module, name = (ckpt.torch, "save") if failing == "trainer state" else \
        (importlib.import_module("safetensors.torch"), "save_file")
    real, calls = getattr(module, name), []

    def full_disk(*a, **k):
        calls.append(1)
        if len(calls) == 2:  # the second checkpoint
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **k)

    monkeypatch.setattr(module, name, full_disk)
    out = tmp_path / "run"
    code = cli_main(["pretrain", "--config", str(recipe), f"train.output_dir={out}"])
    monkeypatch.undo()
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert code == 1
    first, second = out / "checkpoints" / "step-000001", out / "checkpoints" / "step-000002"
    assert errors == [f"attnlab pretrain: error: could not write checkpoint {second}: No space left on device; "
                      f"the last good checkpoint, {first}, is intact"]
    assert ckpt.list_checkpoints(out) == [first]
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000001"]  # the temporary was removed
    code = cli_main(["pretrain", "--config", str(recipe), f"train.output_dir={out}", "--resume"])
    assert code == 0 and "resumed from step 1" in capsys.readouterr().err  # the kept checkpoint loads
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step-000003", "step-000004"]


# ---------------------------------------------------------------------------------- non-finite loss
POISON = 2  # the third batch of every pass gives a NaN loss (step 3, and step 11 on the next pass)


def poisoned_trainer(out: Path, **args) -> Trainer:
    torch.manual_seed(0)
    model = MaskedLM(tiny_bert(50, dropout=0.0, attention_dropout=0.0))
    gen = torch.Generator().manual_seed(0)
    batches = []
    for i in range(8):
        ids = torch.randint(5, 50, (2, 8), generator=gen)
        batches.append({"input_ids": ids, "labels": ids, "poison": i == POISON})

    def loss_fn(model, batch):
        batch = dict(batch)
        poison = batch.pop("poison")
        loss = model(**batch).loss
        return loss * float("nan") if poison else loss

    values = dict(output_dir=str(out), max_steps=6, lr=1e-2, log_every=1, save_every=1, progress=False)
    values.update(args)
    return Trainer(model, TrainArgs(**values), batches, loss_fn=loss_fn)


def snapshot(trainer: Trainer) -> dict:
    out = {f"param.{n}": p.detach().clone() for n, p in trainer.model.named_parameters()}
    for i, s in trainer.optimizer.state_dict()["state"].items():
        out.update({f"opt.{i}.{k}": torch.as_tensor(v).clone() for k, v in s.items()})
    return out


def test_nan_loss_stops_naming_the_step_and_the_last_good_checkpoint(tmp_path):
    trainer = poisoned_trainer(tmp_path)
    trainer.train(until=2)
    before = snapshot(trainer)
    good = tmp_path / "checkpoints" / "step-000002"
    with pytest.raises(FloatingPointError) as err:
        trainer.train()
    assert "loss became nan at step 3" in str(err.value)
    assert f"last good checkpoint: {good}" in str(err.value)
    assert_same_tensors(snapshot(trainer), before)  # the NaN never reached the weights
    assert ckpt.list_checkpoints(tmp_path)[-1] == good


def test_nan_loss_with_skip_policy_skips_the_step_and_counts_it(tmp_path, capsys):
    trainer = poisoned_trainer(tmp_path, nan_policy="skip", max_skips=1, max_steps=12)
    trainer.train(until=2)
    before = snapshot(trainer)
    trainer.train(until=3)  # step 3 is poisoned
    assert trainer.step == 3 and trainer.skips == 1
    assert_same_tensors(snapshot(trainer), before)  # weights and AdamW moments (and its step count) untouched
    trainer.train(until=10)
    after = snapshot(trainer)
    assert not torch.equal(after["param.mlm.bias"], before["param.mlm.bias"])  # later steps do train
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in rows if "skipped" in r] == [{"step": 3, "skipped": "loss became nan", "skipped_steps": 1}]
    assert sorted(r["step"] for r in rows if "loss" in r) == [s for s in range(1, 11) if s != 3]
    assert "step 3: loss became nan; step skipped (1 of train.max_skips=1)" in capsys.readouterr().err  # progress messages go to stderr, keeping stdout for results
    resumed = poisoned_trainer(tmp_path, nan_policy="skip", max_skips=1, max_steps=12, resume=True)
    with pytest.raises(FloatingPointError, match=r"loss became nan at step 11 after 1 skipped step "
                                                 r"\(train.max_skips=1\).*step-000010"):
        resumed.train()  # the skip count survives the resume: the second NaN is one too many
