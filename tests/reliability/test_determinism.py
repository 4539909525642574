"""Same seed, same machine, separate processes: the same training metrics, the same weights and the same
sampled text, run after run. (Resume == uninterrupted is tests/test_trainer.py::test_resume_is_exact and
tests/reliability/test_training_faults.py.)"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

from test_training_faults import REPO, assert_same_tensors, corpus, finish, launch, metrics, write_recipe  # noqa: F401


def generate(model: Path, seed: int) -> str:
    cmd = [sys.executable, "-m", "attnlab", "generate", str(model), "--prompt", "ROMEO:", "--temperature", "0.9",
           "--top-k", "20", "--max-new-tokens", "24", "--seed", str(seed)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_same_seed_same_metrics_weights_and_samples(corpus, tmp_path):  # noqa: F811
    recipe = write_recipe(corpus, tmp_path / "recipe.yaml", max_steps=20, save_every=0)
    runs = [tmp_path / "one", tmp_path / "two"]
    for out in runs:  # one after the other, as a user would
        finish(launch(recipe, out))
    assert metrics(runs[0]) == metrics(runs[1])  # every field but tokens_per_s and elapsed_s
    assert len({r["loss"] for r in metrics(runs[0]) if "loss" in r}) > 1  # training moved: not vacuous
    assert_same_tensors(*(load_file(str(out / "model" / "model.safetensors")) for out in runs))

    samples = [generate(runs[0] / "model", 7), generate(runs[1] / "model", 7)]
    assert samples[0] == samples[1] and len(samples[0].strip()) > 10
    assert generate(runs[0] / "model", 8) != samples[0]  # the seed is what fixes it
