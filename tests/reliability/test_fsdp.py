"""Sharded training (train.parallel=fsdp) on CPU with gloo, through the real `attnlab pretrain` under torchrun.
One chain of runs covers both directions at the cost of one torchrun launch: a one-process run's checkpoint at
step 3 resumes in two processes, whose checkpoint at step 6 (written by both) resumes in one again; each leg
equals the uninterrupted one-process run with the same global batch (1e-4 after 10 steps: a different world
size sums in a different order)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.training import checkpoint as ckpt
from _pretrain_utils import one_thread
from test_trainer import _losses, _single_thread, corpus  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parents[2]
STEPS, EVERY = 10, 3   # checkpoints at steps 3, 6, 9 and 10
TOL = 1e-4


def common(corpus: Path) -> list[str]:
    return [f"data.path={corpus}", "data.seq_len=32", "data.batch_size=4", "data.eval_batches=3", "data.slices=2",
            "model.preset=bert-tiny", "model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
            "model.max_position_embeddings=32", "model.dropout=0.0", "model.attention_dropout=0.0",
            f"train.max_steps={STEPS}", "train.lr=3e-3", "train.warmup_steps=2", "train.log_every=1",
            "train.eval_every=5", f"train.save_every={EVERY}", "train.keep_last=4", "train.progress=false",
            "train.parallel=fsdp"]


def run(corpus: Path, config: Path, out: Path, processes: int, *extra: str) -> str:
    """`attnlab pretrain` in `processes` processes, one thread each: torchrun for 2, in this process for 1
    (faster: no second import of torch). The global batch is 8 sequences either way (2 x 4, or 1 x 4 with two
    micro-batches, one per data slice). Returns what the run printed to stderr."""
    accum = f"train.grad_accum={2 // processes}"
    args = [*common(corpus), accum, f"train.output_dir={out}", *extra]
    if processes == 1:
        from attnlab.training.pretrain import load_config, pretrain
        with one_thread():
            pretrain(load_config(config, args))
        return ""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
           "-m", "attnlab", "pretrain", "--config", str(config), *args]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def upto(src: Path, dst: Path, step: int) -> Path:
    """A copy of a finished run as it stood after `step`: the later checkpoints and the final model gone."""
    shutil.copytree(src, dst)
    for later in ckpt.list_checkpoints(dst):
        if int(later.name.removeprefix("step-")) > step:
            shutil.rmtree(later)
    shutil.rmtree(dst / "model")
    return dst


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("fsdp")
    config = root / "recipe.yaml"
    config.write_text("objective: {kind: mlm+nsp}\n")
    out = {"one": root / "one"}
    run(corpus, config, out["one"], 1)
    out["one->two"] = upto(out["one"], root / "one-then-two", 3)
    out["resumed stderr"] = run(corpus, config, out["one->two"], 2, "--resume")
    out["two->one"] = upto(out["one->two"], root / "two-then-one", 6)
    run(corpus, config, out["two->one"], 1, "train.resume=true")
    return out


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(next((out / "model").glob("*.safetensors"))))


def checkpoint_weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    """The model weights in the DCP checkpoint of `step` (every shard), read back without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    flat = out.parent / f"{out.name}-weights-{step}.pt"  # beside the run, which other tests copy
    if not flat.exists():
        dcp_to_torch_save(out / "checkpoints" / f"step-{step:06d}" / "dcp", flat)
    return torch.load(flat, map_location="cpu", weights_only=True)["model"]


def max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def shards(out: Path, step: int) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints" / f"step-{step:06d}" / "dcp").iterdir())


def test_fsdp_two_processes_match_one_with_the_same_global_batch(runs):
    two, one = _losses(runs["one->two"]), _losses(runs["one"])
    assert sorted(two) == sorted(one) == list(range(1, STEPS + 1))
    assert max(abs(two[s] - one[s]) for s in range(4, STEPS + 1)) < TOL, (two, one)  # steps 4-10: two processes
    assert len(set(one.values())) > 1  # the loss moved: the comparison is not vacuous
    assert "train.parallel=fsdp: 3 units sharded over 2 processes" in runs["resumed stderr"]  # 2 blocks + the root
    assert "resumed from step 3" in runs["resumed stderr"]
    # the checkpoints are DCP directories: one shard file per process, plus the shared metadata
    assert shards(runs["one->two"], STEPS) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert shards(runs["one"], STEPS) == [".metadata", "__0_0.distcp"]


@pytest.mark.parametrize("resumed, at, writers", [("one->two", 3, 1), ("two->one", 6, 2)])
def test_dcp_checkpoint_resumes_with_another_world_size(runs, resumed, at, writers):
    a, b = _losses(runs[resumed]), _losses(runs["one"])
    logged = [line for line in (runs[resumed] / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert sorted(a) == list(range(1, STEPS + 1)) and len(logged) == STEPS  # each step logged once: it resumed
    assert max(abs(a[s] - b[s]) for s in range(at + 1, STEPS + 1)) < TOL, (a, b)
    assert max_diff(weights(runs[resumed]), weights(runs["one"])) < TOL
    assert len(shards(runs[resumed], at)) == writers + 1  # the checkpoint it resumed from: the other world size
    # it trained on after the resume point: the weights it checkpointed at the end are not those it resumed from
    # (not a loss comparison: two losses of a barely moving tiny model can lie within any margin)
    moved = max_diff(checkpoint_weights(runs[resumed], at), checkpoint_weights(runs[resumed], STEPS))
    assert moved > 1e-3, moved


def test_a_checkpoint_resumes_only_with_its_own_kind(runs, corpus, tmp_path):  # noqa: F811
    from attnlab.training.pretrain import load_config, pretrain
    out = upto(runs["one"], tmp_path / "copy", 3)
    config = tmp_path / "recipe.yaml"
    config.write_text("objective: {kind: mlm+nsp}\n")
    args = [*common(corpus), "train.grad_accum=2", f"train.output_dir={out}", "train.resume=true",
            "train.parallel=ddp"]
    with one_thread(), pytest.raises(ValueError, match=r"step-000003: written with train.parallel=fsdp \(dcp/\); "
                                                        r"resume it with train.parallel=fsdp"):
        pretrain(load_config(config, args))


def test_finetune_fsdp_two_processes_match_one(data_dir, tmp_path):
    """`attnlab finetune sst2 --parallel fsdp` under torchrun: each process takes half of every batch of 8; after
    10 steps the kept model equals the one process run's within 1e-4, and so does its validation score."""
    import attnlab
    from attnlab.cli import main
    from attnlab.config import ModelConfig
    model = attnlab.from_config(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                                            dropout=0.0, attention_dropout=0.0))
    model.save(tmp_path / "tiny")
    attnlab.load_tokenizer("minilm").save(tmp_path / "tiny")
    lines = (data_dir / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines()
    (tmp_path / "train.tsv").write_text("\n".join(lines[:81]) + "\n")
    (tmp_path / "dev.tsv").write_text("\n".join([lines[0], *lines[200:232]]) + "\n")
    argv = ["finetune", "sst2", "--model", str(tmp_path / "tiny"), "--train", str(tmp_path / "train.tsv"),
            "--valid", str(tmp_path / "dev.tsv"), "--epochs", "1", "--batch-size", "8", "--lr", "1e-3",
            "--max-length", "32", "--no-progress", "--parallel", "fsdp", "--save-every", "5"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "attnlab",
           *argv, "--output", str(tmp_path / "two")]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "train.parallel=fsdp: 3 units sharded over 2 processes" in done.stderr
    with one_thread():
        assert main([*argv, "--output", str(tmp_path / "one")]) == 0
    two, one = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("two", "one"))
    assert two["steps"] == one["steps"] == 10
    assert abs(two["eval_accuracy"] - one["eval_accuracy"]) < 1e-9
    assert max_diff(tensors(tmp_path / "two"), tensors(tmp_path / "one")) < TOL
    start, end = tensors(tmp_path / "tiny"), tensors(tmp_path / "one")
    end = {k.removeprefix("bert."): v for k, v in end.items()}  # BertModel's names inside the classifier's
    shared = [k for k in start if k in end and "layer" in k]
    assert shared and any(not torch.equal(start[k], end[k]) for k in shared)  # it trained
    loss = [[json.loads(x)["loss"] for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
            for d in ("two", "one")]
    assert len(loss[0]) == len(loss[1]) == 1 and abs(loss[0][0] - loss[1][0]) < TOL
    assert sorted(p.name for p in (ckpt.list_checkpoints(tmp_path / "two")[-1] / "dcp").iterdir()) == \
        [".metadata", "__0_0.distcp", "__1_0.distcp"]


def tensors(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(next(directory.glob("*.safetensors"))))


def test_finetune_translation_refuses_fsdp_in_one_line(tmp_path, capsys):
    from attnlab.cli import main
    text = tmp_path / "s.txt"
    text.write_text("a b\n")
    files = [a for o in ("train-src", "train-tgt", "valid-src", "valid-tgt") for a in (f"--{o}", str(text))]
    assert main(["finetune", "translation", *files, "--output", str(tmp_path / "out"), "--parallel", "fsdp"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("attnlab finetune: error: finetune translation: --parallel fsdp is not supported (its batches "
                   "are not split across processes); see docs/guides/distributed.md")
