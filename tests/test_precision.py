"""bf16 only where the CPU has it: on an AVX2-only CPU (flags faked here) asking for bf16 prints one
warning line; on a CPU with AVX512-BF16 or AMX-BF16 it does not; no command defaults to bf16 itself, and
precision auto picks it only where it trains faster (AMX-BF16)."""
from __future__ import annotations

import pytest

from attnlab.cli import build_parser, main
from attnlab.nn import precision

AVX2_ONLY = {"fpu", "sse2", "avx", "avx2", "fma", "avx512f"}


@pytest.mark.parametrize("flags, native", [(AVX2_ONLY, False), (AVX2_ONLY | {"avx512_bf16"}, True),
                                           (AVX2_ONLY | {"amx_bf16"}, True)])
def test_native_bf16_follows_the_cpu_flags(monkeypatch, flags, native):
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    assert precision.bf16_is_native() is native
    assert (precision.bf16_warning() is None) is native
    assert precision.bf16_is_native("cuda")


@pytest.fixture
def tiny_model(tmp_path):
    import torch

    from attnlab.config import ModelConfig
    from attnlab.interop.hf import save_pretrained
    from attnlab.models.encoder import Encoder
    torch.manual_seed(0)
    return save_pretrained(Encoder(ModelConfig(vocab_size=30, hidden_size=8, num_layers=1, num_heads=2,
                                               intermediate_size=16, max_position_embeddings=16)), tmp_path / "m")


@pytest.mark.parametrize("flags, warned", [(AVX2_ONLY, True), (AVX2_ONLY | {"avx512_bf16"}, False)])
def test_cli_says_once_that_bf16_is_emulated(monkeypatch, capsys, tmp_path, tiny_model, flags, warned):
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    text = tmp_path / "t.txt"
    text.write_text("hello\n")
    main(["embed", str(tiny_model), "--input", str(text), "--output", str(tmp_path / "v.npy"), "--dtype", "bf16"])
    err = capsys.readouterr().err
    assert err.count("bf16 is emulated") == (1 if warned else 0)
    main(["embed", str(tiny_model), "--input", str(text), "--output", str(tmp_path / "v.npy")])  # fp32: silent
    assert "emulated" not in capsys.readouterr().err


def test_no_command_defaults_to_bf16():
    parser = build_parser()
    for action in parser._subparsers._group_actions[0].choices.values():
        for a in action._actions:
            if a.dest in ("dtype", "precision"):
                assert a.default != "bf16", f"{action.prog} {a.option_strings} defaults to bf16"


@pytest.mark.parametrize("flags, speedup, picked", [
    (AVX2_ONLY, None, "fp32"), (AVX2_ONLY | {"avx512_bf16"}, 1.0, "fp32"), (AVX2_ONLY | {"avx512_bf16"}, 2.4, "bf16"),
    (AVX2_ONLY | {"avx512_bf16", "amx_bf16"}, None, "bf16"), (set(), None, "fp32")])
def test_train_precision_auto_picks_bf16_only_where_it_trains_faster(monkeypatch, tmp_path, flags, speedup, picked):
    # AVX512-BF16 alone is native but may run bf16 matmuls no faster than fp32 (then bf16 trains slower): the
    # probe's figure decides there; AMX and the CPUs without native bf16 need no probe (None: never asked)
    import torch

    from attnlab.training.trainer import TrainArgs, Trainer

    def probe():
        assert speedup is not None, "the probe ran where the flags decide"
        return speedup
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    monkeypatch.setattr(precision, "bf16_matmul_speedup", probe)
    assert precision.resolve_precision("auto") == picked
    assert precision.resolve_precision("fp32") == "fp32" and precision.resolve_precision("bf16") == "bf16"
    model = torch.nn.Linear(4, 4)
    trainer = Trainer(model, TrainArgs(output_dir=str(tmp_path), precision="auto", device="cpu"), [],
                      loss_fn=lambda m, b: m(b["x"]).sum())
    assert trainer.precision == picked
    with trainer._autocast():
        assert torch.is_autocast_enabled("cpu") is (picked == "bf16")
    with pytest.raises(ValueError, match="fp32, bf16 or auto"):
        TrainArgs(precision="fp16").validate()


def test_a_cpu_trainer_keeps_malloc_from_mapping_fresh_pages_each_step(monkeypatch, tmp_path):
    """glibc only (this CI): the setting is applied once, by the first CPU Trainer; the user can opt out."""
    import sys

    import torch

    from attnlab.training.trainer import TrainArgs, Trainer
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's mallopt is Linux-only")
    monkeypatch.setattr(precision, "_MALLOC_TUNED", None)
    monkeypatch.setenv("ATTNLAB_MALLOC", "0")
    assert precision.tune_malloc() is False
    monkeypatch.setattr(precision, "_MALLOC_TUNED", None)
    monkeypatch.delenv("ATTNLAB_MALLOC")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    Trainer(torch.nn.Linear(2, 2), TrainArgs(output_dir=str(tmp_path), device="cpu"), [],
            loss_fn=lambda m, b: m(b["x"]).sum())
    assert precision._MALLOC_TUNED is True


def test_the_bf16_probe_measures_once_per_cpu_and_keeps_its_figure(monkeypatch, tmp_path):
    import json
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    measure = precision.bf16_matmul_speedup.__wrapped__  # past the in-process cache
    first = measure()
    assert first > 0
    kept = json.loads((tmp_path / "bf16-speed.json").read_text())
    assert list(kept.values()) == [first]
    (tmp_path / "bf16-speed.json").write_text(json.dumps({k: 9.5 for k in kept}))
    assert measure() == 9.5  # read back, not measured again
    monkeypatch.setattr(precision, "cpu_key", lambda: "another CPU")
    again = measure()  # a cache copied to another CPU: measured anew, the first CPU's figure kept
    assert again != 9.5 and sorted(json.loads((tmp_path / "bf16-speed.json").read_text()).values()) == \
        sorted([9.5, again])
