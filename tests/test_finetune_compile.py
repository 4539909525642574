"""`finetune --compile`: the training step goes through torch.compile (the Trainer's
train.compile, whose compiled step is tested equal to the eager one in tests/test_compiled_training.py), and
batches are padded to multiples of COMPILE_PAD tokens so that only a few shapes ever get compiled."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.tasks.common import collate
from attnlab.tasks.defaults import COMPILE_PAD


def test_collate_rounds_the_width_up_to_the_multiple_and_pads_as_before():
    feats = [{"input_ids": [2, 5, 6, 3], "token_type_ids": [0] * 4, "labels": 1},
             {"input_ids": [2, 7, 3], "token_type_ids": [0] * 3, "labels": 0}]
    plain, padded = collate(feats, pad_id=0), collate(feats, pad_id=0, multiple=32)
    assert plain["input_ids"].shape == (2, 4) and padded["input_ids"].shape == (2, 32)
    assert torch.equal(padded["input_ids"][:, :4], plain["input_ids"]) and not padded["input_ids"][:, 4:].any()
    assert padded["attention_mask"].sum() == plain["attention_mask"].sum() == 7
    assert collate(feats * 16, pad_id=0, multiple=4)["input_ids"].shape == (32, 4)  # already a multiple


@pytest.fixture()
def tiny(tmp_path):
    out = tmp_path / "tiny"
    attnlab.from_config(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                    dropout=0.0, attention_dropout=0.0)).save(out)
    attnlab.load_tokenizer("minilm").save(out)
    return out


def test_finetune_compile_compiles_the_step_once_and_feeds_it_padded_batches(tiny, data_dir, tmp_path, monkeypatch):
    compiled, widths = [], []

    def fake_compile(fn, *args, **kwargs):  # records what would be compiled and the shapes it would see
        compiled.append(fn)

        def run(model, batch):
            widths.append(batch["input_ids"].shape[1])
            return fn(model, batch)
        return run
    monkeypatch.setattr(torch, "compile", fake_compile)
    lines = (data_dir / "glue/SST-2/train.tsv").read_text().splitlines()
    train = tmp_path / "train.tsv"
    train.write_text("\n".join(lines[:41]) + "\n")
    assert main(["finetune", "sst2", "--model", str(tiny), "--train", str(train), "--output", str(tmp_path / "out"),
                 "--epochs", "1", "--no-progress", "--compile"]) == 0
    assert len(compiled) == 1
    assert widths and all(w % COMPILE_PAD == 0 for w in widths), widths
    # without --compile nothing is compiled
    assert main(["finetune", "sst2", "--model", str(tiny), "--train", str(train), "--output", str(tmp_path / "o2"),
                 "--epochs", "1", "--no-progress"]) == 0
    assert len(compiled) == 1


def test_finetune_precision_bf16_runs_the_steps_under_autocast(tiny, data_dir, tmp_path, monkeypatch):
    seen, widths = [], []
    real = torch.autocast
    import attnlab.tasks.finetune  # noqa: F401  (the package exports the function under the module's name)
    finetune_module = sys.modules["attnlab.tasks.finetune"]
    real_collate = finetune_module.collate

    def collate_spy(*args, **kwargs):  # the training batches' widths
        batch = real_collate(*args, **kwargs)
        widths.append(batch["input_ids"].shape[1])
        return batch
    monkeypatch.setattr(finetune_module, "collate", collate_spy)

    def spy(*args, **kwargs):  # the Trainer's autocast context: record what it asked for
        seen.append(kwargs.get("dtype"))
        return real(*args, **kwargs)
    import attnlab.training.trainer as trainer
    monkeypatch.setattr(trainer.torch, "autocast", spy)
    lines = (data_dir / "glue/SST-2/train.tsv").read_text().splitlines()
    train = tmp_path / "train.tsv"
    train.write_text("\n".join(lines[:41]) + "\n")
    assert main(["finetune", "sst2", "--model", str(tiny), "--train", str(train), "--output", str(tmp_path / "out"),
                 "--epochs", "1", "--no-progress", "--precision", "bf16"]) == 0
    import json
    summary = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert summary["precision"] == "bf16" and torch.bfloat16 in seen
    # on a CPU the batches are padded to a few widths, in bf16 and in fp32: oneDNN and the heap otherwise meet
    # a new size for every batch length (on CUDA each batch is as long as its longest input)
    assert widths and all(w % COMPILE_PAD == 0 for w in widths) == (not torch.cuda.is_available()), widths
    widths.clear()
    assert main(["finetune", "sst2", "--model", str(tiny), "--train", str(train), "--output", str(tmp_path / "o32"),
                 "--epochs", "1", "--no-progress"]) == 0
    assert widths and all(w % COMPILE_PAD == 0 for w in widths) == (not torch.cuda.is_available()), widths
    weights = attnlab.load(tmp_path / "out").state_dict()
    assert all(t.dtype == torch.float32 for t in weights.values() if t.is_floating_point())  # saved in fp32
    with pytest.raises(SystemExit):  # argparse names the choices
        main(["finetune", "sst2", "--model", str(tiny), "--train", str(train), "--precision", "fp16"])


@pytest.mark.parametrize("flags, ran", [({"avx2", "fma"}, "fp32"), ({"avx2", "avx512f", "avx512_bf16"}, "fp32"),
                                       ({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}, "bf16")])
def test_finetune_precision_auto_runs_bf16_only_where_it_trains_faster(tiny, data_dir, tmp_path, monkeypatch,
                                                                       flags, ran):
    from attnlab.nn import precision
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    monkeypatch.setattr(precision, "bf16_matmul_speedup", lambda: 1.0)  # bf16 matmuls no faster without AMX
    lines = (data_dir / "glue/SST-2/train.tsv").read_text().splitlines()
    train = tmp_path / "train.tsv"
    train.write_text("\n".join(lines[:41]) + "\n")
    assert main(["finetune", "sst2", "--model", str(tiny), "--train", str(train), "--output", str(tmp_path / "out"),
                 "--epochs", "1", "--no-progress", "--precision", "auto"]) == 0
    import json
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["precision"] == ran


@pytest.mark.parametrize("task, flags, ran", [
    ("sst2", (), "bf16"), ("stsb", (), "bf16"),           # a pretrained sentence (pair) classifier or regressor
    ("sst2", ("--from-scratch",), "fp32"), ("sst2", ("--lora", "r=4"), "fp32"), ("conll2003", (), "fp32")])
def test_the_default_precision_is_bf16_only_where_it_was_measured(tiny, data_dir, tmp_path, monkeypatch,
                                                                     task, flags, ran):
    # with no --precision, on a CPU where bf16 trains faster (AMX): a pretrained sentence task runs bf16 (measured on
    # validation carved from MRPC, STS-B and CoLA); random weights, LoRA and tokens (NER) stay fp32, unmeasured
    from attnlab.nn import precision
    monkeypatch.setattr(precision, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    files = {"sst2": ("glue/SST-2/train.tsv", 41), "stsb": ("glue/STS-B/train.tsv", 41),
             "conll2003": ("conll2003/valid.txt", 300)}
    name, n = files[task]
    train = tmp_path / Path(name).name
    train.write_text("\n".join((data_dir / name).read_text().splitlines()[:n]) + "\n")
    assert main(["finetune", task, "--model", str(tiny), "--train", str(train), "--output", str(tmp_path / "out"),
                 "--epochs", "1", "--max-length", "32", "--no-progress", *flags]) == 0
    import json
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["precision"] == ran
