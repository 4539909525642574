import subprocess
import sys

import numpy as np
import pytest

import attnlab
from attnlab.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "attnlab", *args], capture_output=True, text=True, timeout=300)


def test_help_lists_subcommands():
    out = run_cli("--help")
    assert out.returncode == 0
    assert "info" in out.stdout and "embed" in out.stdout and "walkthrough" in out.stdout
    assert "inspect:" in out.stdout and "train:" in out.stdout  # grouped by what they are for


@pytest.mark.parametrize("name,line", [("bert-base", "parameters: 109,482,240"),
                                       ("bert-large", "parameters: 335,141,888")])
def test_info_prints_paper_counts(capsys, name, line):
    assert main(["info", name]) == 0
    assert line in capsys.readouterr().out.splitlines()


def test_info_walkthrough_in_the_notes_terms(capsys):
    assert main(["info", "bert-base", "--seq-len", "512"]) == 0
    out = capsys.readouterr().out
    for phrase in ("project to Q, K, V: three (512×768)@(768×768) matmuls", "split into 12 heads of (512×64)",
                   "scores softmax(QKᵀ/√64): (12×512×512)", "FFN 768→3072→768", "embeddings", "pooler"):
        assert phrase in out, phrase


def test_info_on_a_real_model_directory(capsys, minilm):
    assert main(["info", str(minilm)]) == 0
    out = capsys.readouterr().out
    assert "parameters: 22,713,216" in out and "(128×384)@(384×384)" in out


def test_info_unknown_model_is_one_line():
    out = run_cli("info", "no-such-model")
    assert out.returncode != 0
    assert "no-such-model" in out.stderr and "Traceback" not in out.stderr


def test_embed_writes_normalised_vectors_matching_the_library(tmp_path, minilm):
    texts = ["The cat sat on the mat.", "A dog barked.", "", "Transformers use attention."]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert main(["embed", str(minilm), "--input", str(src), "--output", str(tmp_path / "v.npy"),
                 "--batch-size", "2"]) == 0
    vectors = np.load(tmp_path / "v.npy")
    assert vectors.shape == (4, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    from attnlab.inference.embed import embed
    direct = embed(attnlab.load(minilm), attnlab.load_tokenizer(minilm), texts, batch_size=4)
    assert np.abs(vectors - direct).max() < 1e-5  # bucketing and batch size do not change results
    cls = tmp_path / "c.npy"
    assert main(["embed", str(minilm), "--input", str(src), "--output", str(cls), "--pooling", "cls",
                 "--no-normalize"]) == 0
    assert not np.allclose(np.load(cls), vectors)


def test_embed_names_the_undecodable_line(tmp_path, minilm):
    src = tmp_path / "bad.txt"
    src.write_bytes(b"fine\nalso fine\nbroken \xff\xfe here\n")
    out = run_cli("embed", str(minilm), "--input", str(src), "--output", str(tmp_path / "v.npy"))
    assert out.returncode != 0
    assert "line 3 is not valid UTF-8" in out.stderr and "Traceback" not in out.stderr
    out = run_cli("embed", str(minilm), "--input", str(tmp_path), "--output", str(tmp_path / "v.npy"))
    assert out.returncode != 0 and "is a directory" in out.stderr


def test_info_on_an_encoder_decoder(capsys):
    # t5-small: 60,506,624 parameters, as the T5 paper's "Small" (one shared token embedding, tied head)
    assert main(["info", "t5-small", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "parameters: 60,506,624" in out.splitlines()
    assert "decoder layers: 6 ×" in out and "cross-attention" in out


@pytest.mark.parametrize("command,env,want", [("serve", None, "PASSIVE"), ("finetune", None, "None"),
                                              ("serve", "ACTIVE", "ACTIVE")])
def test_cli_settles_imports_before_the_command(command, env, want):
    """Before a command runs, the CLI imports torch and freezes the imports' objects out of the garbage
    collector; for the server alone OpenMP threads sleep between regions, unless the user chose otherwise."""
    import os
    import subprocess
    import sys
    code = ("import gc, os, sys; from attnlab.cli import settle_imports; "
            f"settle_imports({command!r}); print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules, "
            "gc.get_freeze_count() > 100000)")
    environ = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env:
        environ["OMP_WAIT_POLICY"] = env
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=120)
    assert out.returncode == 0, out.stderr[-1000:]
    assert out.stdout.split() == [want, "True", "True"]
