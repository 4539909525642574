"""The Trainer: exact resume, crash-safe checkpoints, DDP == accumulation, schedules, configs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.config import ConfigError
from attnlab.data import open_shards, prepare_corpus
from attnlab.data.stream import BatchStream, fixed_batches
from attnlab.heads import MaskedLM
from attnlab.objectives import ObjectiveConfig, build_objective
from attnlab.tokenizers import load_tokenizer, train_tokenizer
from attnlab.training import Trainer, TrainArgs, build_optimizer, lr_factor, param_groups
from attnlab.training import checkpoint as ckpt
from attnlab.training.pretrain import build_model_config, load_config

from _pretrain_utils import one_thread, sample_text, tiny_bert, tiny_gpt

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _single_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def corpus(data_dir: Path, tmp_path_factory) -> Path:
    """~12k tokens of six books with an 800-piece WordPiece vocab, in 4+ shards (2 data slices)."""
    root = tmp_path_factory.mktemp("trainer")
    text = sample_text(data_dir, root / "text", chars_per_book=8000)
    files = sorted(text.iterdir())
    tok = train_tokenizer("wordpiece", files, 800)
    prepare_corpus(tok, files, root / "corpus", heldout=0.2, shard_tokens=3000, progress=False)
    return root / "corpus"


def _setup(corpus: Path, out: Path, kind: str = "mlm", slices: int = 1, **train):
    tok = load_tokenizer(corpus / "tokenizer")
    obj = build_objective(ObjectiveConfig(kind=kind), tok, 32)
    torch.manual_seed(0)
    make = tiny_gpt if kind == "clm" else tiny_bert
    model = obj.model_class(make(tok.vocab_size, dropout=0.1, attention_dropout=0.1))
    stream = BatchStream(open_shards(corpus), obj.examples, obj.collate, 4, seed=1, num_slices=slices)
    evals = fixed_batches(open_shards(corpus, "heldout"), obj.examples, obj.collate, 4, max_batches=2)
    args = TrainArgs(output_dir=str(out), max_steps=20, lr=2e-3, warmup_steps=5, schedule="cosine",
                     grad_accum=2, log_every=1, eval_every=10, progress=False, **train)
    return Trainer(model, args, stream, loss_fn=obj.loss, eval_data=evals, metrics_fn=obj.metrics)


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.mark.parametrize("kind", ["mlm", "clm"])
def test_resume_is_exact(corpus, tmp_path, kind):
    straight = _setup(corpus, tmp_path / "a", kind)
    straight.train()
    first = _setup(corpus, tmp_path / "b", kind)
    first.train(until=10)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "b")] == ["step-000010"]
    second = _setup(corpus, tmp_path / "b", kind, resume=True)  # fresh objects, as a new process would have
    second.train()
    assert second.step == 20
    for (name, p), q in zip(straight.model.named_parameters(), second.model.parameters()):
        assert torch.equal(p, q), name  # identical, not merely close: dropout RNG and data position restored
    assert _losses(tmp_path / "a") == _losses(tmp_path / "b")
    assert sorted(_losses(tmp_path / "b")) == list(range(1, 21))  # no step logged twice
    # the checkpoint is a normal model directory
    if kind == "mlm":
        loaded = attnlab.load(tmp_path / "b" / "checkpoints" / "step-000020" / "model")
        assert isinstance(loaded, MaskedLM)
        assert torch.equal(loaded.backbone.embeddings.tok.weight, second.model.backbone.embeddings.tok.weight)


def test_crash_while_saving_keeps_previous_checkpoint(corpus, tmp_path, monkeypatch):
    trainer = _setup(corpus, tmp_path, keep_last=2)
    trainer.train(until=5)
    real_save = torch.save

    def dying_save(obj, path, *a, **k):  # the model is written, the trainer state is not
        real_save(obj, path, *a, **k)
        raise KeyboardInterrupt("killed mid-checkpoint")

    monkeypatch.setattr(ckpt.torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(until=8)
    monkeypatch.setattr(ckpt.torch, "save", real_save)
    root = tmp_path / "checkpoints"
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-000005"]
    assert any(p.name.startswith(".tmp-step-000008") for p in root.iterdir())  # the half-written one
    again = _setup(corpus, tmp_path, resume=True, keep_last=2)
    again.train(until=12)
    assert again.step == 12
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-000005", "step-000012"]
    assert not any(p.name.startswith(".tmp") for p in root.iterdir())  # cleaned by the next save


def test_two_processes_match_one_with_double_accumulation(corpus, tmp_path):
    config = tmp_path / "ddp.yaml"
    common = [f"data.path={corpus}", "data.seq_len=32", "data.batch_size=4", "data.eval_batches=2",
              "model.preset=bert-tiny", "model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
              "model.max_position_embeddings=32", "model.dropout=0.0", "model.attention_dropout=0.0",
              "train.max_steps=6", "train.lr=3e-3", "train.log_every=1", "train.eval_every=3", "train.progress=false"]
    config.write_text("objective: {kind: mlm+nsp}\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "attnlab",
           "pretrain", "--config", str(config), *common, f"train.output_dir={tmp_path / 'ddp'}", "train.grad_accum=1"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # both processes evaluate; the first alone prints each evaluation's line
    assert done.stderr.count("step 3: eval_") == done.stderr.count("step 6: eval_") == 1, done.stderr[-3000:]
    from attnlab.training.pretrain import pretrain
    pretrain(load_config(config, common + [f"train.output_dir={tmp_path / 'one'}", "train.grad_accum=2",
                                           "data.slices=2"]))
    two, one = _losses(tmp_path / "ddp"), _losses(tmp_path / "one")
    assert sorted(two) == sorted(one) == list(range(1, 7))
    for step in one:
        assert abs(two[step] - one[step]) < 1e-4, (step, two[step], one[step])
    assert len(set(one.values())) > 1  # the loss moved: the comparison is not vacuous
    evals = [[json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()
              if "eval_loss" in x] for d in ("ddp", "one")]
    assert len(evals[0]) == len(evals[1]) == 2
    for a, b in zip(*evals):
        assert abs(a["eval_loss"] - b["eval_loss"]) < 1e-4


def test_schedule_and_weight_decay_groups():
    kw = dict(warmup_steps=10, max_steps=110)
    assert lr_factor(0, **kw) == 0 and lr_factor(5, **kw) == 0.5 and lr_factor(10, **kw) == 1.0
    assert abs(lr_factor(60, schedule="cosine", **kw) - 0.5) < 1e-12 and lr_factor(110, schedule="cosine", **kw) == 0
    assert abs(lr_factor(60, schedule="linear", **kw) - 0.5) < 1e-12
    assert abs(lr_factor(110, schedule="cosine", min_lr_ratio=0.1, **kw) - 0.1) < 1e-12
    assert lr_factor(50, schedule="constant", **kw) == 1.0
    model = MaskedLM(tiny_bert(100))
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.dim() >= 2 for p in decay["params"]) and no_decay["weight_decay"] == 0
    assert {names[id(p)] for p in no_decay["params"]} >= {"backbone.embeddings.norm.weight", "mlm.bias",
                                                          "backbone.layers.0.attn.q.bias"}
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))  # tied counted once


def test_layer_decay_gives_each_depth_its_rate_and_adam_moves_it_that_far():
    """Layer-wise learning-rate decay: embeddings at decay^(L+1), layer i at decay^(L-i), the head at the peak;
    one AdamW step (no weight decay) moves each weight by about its group's rate, so the rates are the ones used."""
    torch.manual_seed(0)
    model = MaskedLM(tiny_bert(100))
    L, decay, lr = model.config.num_layers, 0.5, 1e-3
    optimizer, _ = build_optimizer(model, lr=lr, weight_decay=0.0, warmup_steps=0, max_steps=10, layer_decay=decay)
    rate = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    names = dict(model.named_parameters())
    assert rate[id(names["backbone.embeddings.norm.weight"])] == pytest.approx(lr * decay ** (L + 1))
    for i in range(L):
        assert rate[id(names[f"backbone.layers.{i}.attn.q.weight"])] == pytest.approx(lr * decay ** (L - i))
    assert rate[id(names["mlm.bias"])] == pytest.approx(lr) == optimizer.param_groups[0]["lr"]
    assert len(rate) == len(list(model.parameters()))  # every parameter once (the tied decoder too)
    before = {n: p.detach().clone() for n, p in names.items()}
    ids = torch.randint(5, 100, (2, 12))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    for n in ("backbone.embeddings.norm.weight", f"backbone.layers.{L - 1}.ffn.up.weight", "mlm.bias"):
        moved = (names[n].detach() - before[n]).abs().max().item()
        assert moved == pytest.approx(rate[id(names[n])], rel=0.05), n  # Adam's first step: ~lr per weight
    with pytest.raises(ValueError, match="layer_decay=0"):
        param_groups(model, 0.01, layer_decay=0.0)
    with pytest.raises(ValueError, match="layer_decay"):
        TrainArgs(output_dir="x", layer_decay=1.5).validate()
    assert len(param_groups(model, 0.01)) == 2  # no decay: the two groups as before


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step")  # the test wraps step to record weights
def test_ema_is_the_running_average_evaluated_kept_and_resumed_exactly(corpus, tmp_path):
    """train.ema: the weights a run ends with are the average of the weights after each step (computed here
    by hand from the trajectory), evaluation scores the average and leaves the trained weights as they were,
    and a killed run resumes to the same average bit for bit."""
    decay = 0.9
    trainer = _setup(corpus, tmp_path / "a", ema=decay)
    name = "backbone.layers.0.attn.q.weight"
    param = dict(trainer.model.named_parameters())[name]
    trajectory, step = [param.detach().clone()], trainer.optimizer.step

    def recording_step(*a, **kw):
        out = step(*a, **kw)
        trajectory.append(param.detach().clone())
        return out
    trainer.optimizer.step = recording_step
    scored = []
    fn = trainer.evaluate
    trainer.evaluate = lambda: (scored.append(param.detach().clone()), fn())[1]
    trainer.train()
    expected = trajectory[0].double()
    for t, w in enumerate(trajectory[1:]):
        d = min(decay, (1 + t) / (10 + t))
        expected = d * expected + (1 - d) * w.double()
        if t + 1 == 10:
            at_10 = expected.clone()
    assert torch.allclose(param.detach().double(), expected, atol=1e-6), name    # the run ends with the average
    assert not torch.allclose(param.detach(), trajectory[-1], atol=1e-4)        # which is not the last weights
    assert torch.allclose(scored[0].double(), at_10, atol=1e-6)                  # step 10's evaluation saw it
    with trainer.averaged():
        pass
    assert torch.allclose(param.detach().double(), expected, atol=1e-6)
    # exact resume: the average is in the checkpoint
    first = _setup(corpus, tmp_path / "b", ema=decay)
    first.train(until=10)
    assert torch.equal(dict(first.model.named_parameters())[name], trajectory[10])  # mid-run: trained weights
    second = _setup(corpus, tmp_path / "b", ema=decay, resume=True)
    second.train()
    for (n, p), q in zip(trainer.model.named_parameters(), second.model.parameters()):
        assert torch.equal(p, q), n
    with pytest.raises(ValueError, match="ema=0.9, this one has ema=0.0"):
        _setup(corpus, tmp_path / "b", resume=True, ema=0.0).resume()   # another run (TrainArgs.SAME_RUN)
    with pytest.raises(ValueError, match="train.ema"):
        TrainArgs(output_dir="x", ema=1.0).validate()


def test_bf16_autocast_trains(corpus, tmp_path):
    trainer = _setup(corpus, tmp_path, precision="bf16")
    trainer.args.max_steps = 4
    metrics = trainer.train()
    assert torch.isfinite(torch.tensor(metrics["eval_loss"]))
    assert next(trainer.model.parameters()).dtype == torch.float32  # master weights stay fp32


def test_trainer_takes_any_batches_and_default_loss(tmp_path):
    """Fine-tuning style: a model whose forward returns .loss and a plain list of batches."""
    torch.manual_seed(0)
    model = MaskedLM(tiny_bert(50, dropout=0.0, attention_dropout=0.0))
    ids = torch.randint(5, 50, (4, 8))
    batches = [{"input_ids": ids, "labels": ids}] * 3
    args = TrainArgs(output_dir=str(tmp_path), max_steps=30, lr=1e-2, log_every=5, progress=False)
    Trainer(model, args, batches, eval_data=batches[:1]).train()
    losses = _losses(tmp_path)
    assert losses[30] < losses[5] / 2
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {"step", "loss", "lr", "tokens_per_s", "elapsed_s"} <= set(rows[0]) and "eval_loss" in rows[-1]


def test_max_minutes_stops_with_a_checkpoint_and_resume_finishes(tmp_path):
    torch.manual_seed(0)
    ids = torch.randint(5, 50, (4, 8))
    batches = [{"input_ids": ids, "labels": ids}]

    def trainer(**kw):
        model = MaskedLM(tiny_bert(50, dropout=0.0, attention_dropout=0.0))
        return Trainer(model, TrainArgs(output_dir=str(tmp_path), max_steps=5, log_every=1, progress=False, **kw),
                       batches, eval_data=batches)

    first = trainer(max_minutes=1e-9)  # out of time after the first step
    first.train()
    assert first.step == 1 and [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-000001"]
    assert "eval_loss" in (tmp_path / "metrics.jsonl").read_text()  # evaluated before stopping
    second = trainer(resume=True)
    second.train()
    assert second.step == 5


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="'lrr'"):
        load_config(None, ["train.lrr=1"])
    with pytest.raises(ConfigError, match="unknown section 'optim'"):
        load_config(None, ["optim.lr=1"])
    bad = tmp_path / "x.yaml"
    bad.write_text("data: {seq_len: 64, batchsize: 3}\n")
    with pytest.raises(ConfigError, match="x.yaml.*'batchsize'"):
        load_config(bad)
    cfg = load_config(None, ["train.lr=3e-4", "train.max_steps=7"])
    assert cfg.train.lr == 3e-4 and cfg.train.max_steps == 7
    with pytest.raises(ValueError, match="train.precision"):
        TrainArgs(precision="fp8").validate()


@pytest.mark.parametrize("name", ["pretrain-bert-mini", "pretrain-bert-cpu", "pretrain-gpt-mini",
                                  "pretrain-gpt-shakespeare-char"])
def test_shipped_configs_build(name, data_dir):
    cfg = load_config(REPO / "configs" / f"{name}.yaml")
    tok = load_tokenizer(data_dir / "vocab" / ("gpt2" if "gpt-mini" in name else "bert-base-uncased")) \
        if cfg.data.tokenizer != "char" else attnlab.tokenizers.build_char_tokenizer(
            [data_dir / "tiny_shakespeare" / "input.txt"])
    model_cfg = build_model_config(cfg.model, tok, cfg.data.seq_len)
    obj = build_objective(cfg.objective, tok, cfg.data.seq_len)
    assert model_cfg.causal == (obj.kind == "clm") and model_cfg.vocab_size == tok.vocab_size
    if name == "pretrain-bert-mini":
        assert (model_cfg.num_layers, model_cfg.hidden_size, obj.kind) == (4, 256, "mlm+nsp")
    if name == "pretrain-bert-cpu":  # the transfer recipe: PPMI init, then MLM only, 30% masking,
        # 64 tokens, pre-LN, bf16 where it trains faster, 56 minutes (+ the PPMI counts, ~30 s: within the hour)
        assert (model_cfg.num_layers, model_cfg.hidden_size, model_cfg.norm_placement, obj.kind,
                cfg.objective.mask_prob, cfg.data.seq_len, cfg.model["embedding_init"], cfg.train.precision,
                cfg.train.max_minutes) == (4, 256, "pre", "mlm", 0.3, 64, "ppmi", "auto", 56)
    if name == "pretrain-gpt-shakespeare-char":
        assert (model_cfg.num_layers, model_cfg.num_heads, model_cfg.hidden_size, cfg.data.seq_len,
                cfg.data.batch_size, cfg.train.max_steps, model_cfg.dropout) == (4, 4, 128, 64, 12, 2000, 0.0)


def test_a_switch_the_hf_layout_cannot_express_falls_back_to_attnlabs_own(tmp_path):
    """A bias-free GPT-2 has no Hugging Face GPT-2 equivalent: save_pretrained refuses it by name, and
    save_model writes attnlab's own layout, which attnlab.load reads back to the same model."""
    import attnlab
    from attnlab.config import ConfigError
    from attnlab.models.decoder import CausalLM
    from attnlab.interop.native import save_model
    cfg = attnlab.ModelConfig(model_type="gpt2", causal=True, vocab_size=50, hidden_size=16, num_layers=1,
                              num_heads=2, intermediate_size=32, max_position_embeddings=16, type_vocab_size=0,
                              pooler=False, norm_placement="pre", embedding_norm=False, bias=False,
                              activation="gelu_tanh", pad_token_id=None, norm_eps=1e-5)
    model = CausalLM(cfg).eval()
    with pytest.raises(ConfigError, match="cannot express bias=False"):
        model.save(tmp_path / "hf")
    save_model(model, tmp_path / "native")
    again = attnlab.load(tmp_path / "native")
    ids = torch.randint(0, 50, (2, 7))
    assert type(again).__name__ == "CausalLM"
    assert torch.equal(model(input_ids=ids).logits, again(input_ids=ids).logits)


def test_best_metric_keeps_the_best_evaluation_and_patience_stops_early(tmp_path):
    """evaluate_fn scores by decoding (as GLUE/NER/QA do): every evaluation that beats the best so far goes
    to on_best, a worse one does not, and `patience` evaluations without a new best stop the run there."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    data = [{"x": torch.randn(8, 4), "y": torch.randn(8, 1)} for _ in range(3)]
    scores = iter([0.5, 0.7, 0.6, 0.65, 0.9])  # best at the 2nd evaluation; the 3rd and 4th are worse
    kept: list[tuple[int, float]] = []
    args = TrainArgs(output_dir=str(tmp_path), max_steps=10, lr=1e-2, log_every=1, eval_every=2, keep_last=0,
                     progress=False, best_metric="accuracy", patience=2)
    trainer = Trainer(model, args, data, loss_fn=lambda m, b: torch.nn.functional.mse_loss(m(b["x"]), b["y"]),
                      evaluate_fn=lambda m: {"accuracy": next(scores)},
                      on_best=lambda m, record: kept.append((record["step"], record["eval_accuracy"])))
    trainer.train()
    assert kept == [(2, 0.5), (4, 0.7)]
    assert trainer.step == 8  # two evaluations (steps 6 and 8) without a new best
    assert trainer.best == {"step": 4, "eval_accuracy": 0.7}
    assert not (tmp_path / "checkpoints").exists()  # keep_last=0: no training checkpoints
    evals = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
             if "eval_accuracy" in line]
    assert [r["step"] for r in evals] == [2, 4, 6, 8]
    with pytest.raises(ValueError, match="train.patience needs train.best_metric"):
        TrainArgs(output_dir=str(tmp_path), max_steps=1, patience=1).validate()


def test_attnlab_save_picks_the_layout_the_model_fits(tmp_path):
    """attnlab.save: the HF layout when the family can express the model, attnlab's own otherwise;
    layout="hf" refuses what HF cannot express (as model.save does), an unknown layout is named."""
    import attnlab
    from attnlab.config import ConfigError
    from attnlab.models.decoder import CausalLM
    bert = attnlab.from_config(attnlab.ModelConfig(vocab_size=30, hidden_size=8, num_layers=1, num_heads=2,
                                                   intermediate_size=16, max_position_embeddings=16))
    attnlab.save(bert, tmp_path / "bert")
    assert (tmp_path / "bert" / "config.json").exists() and not (tmp_path / "bert" / "attnlab_config.json").exists()
    gpt = CausalLM(attnlab.ModelConfig(model_type="gpt2", causal=True, vocab_size=50, hidden_size=16, num_layers=1,
                                       num_heads=2, intermediate_size=32, max_position_embeddings=16, type_vocab_size=0,
                                       pooler=False, norm_placement="pre", embedding_norm=False, bias=False,
                                       activation="gelu_tanh", pad_token_id=None, norm_eps=1e-5))
    attnlab.save(gpt, tmp_path / "gpt")
    assert (tmp_path / "gpt" / "attnlab_config.json").exists() and not (tmp_path / "gpt" / "config.json").exists()
    with pytest.raises(ConfigError, match="cannot express bias=False"):
        attnlab.save(gpt, tmp_path / "gpt-hf", layout="hf")
    with pytest.raises(ValueError, match="layout='onnx'"):
        attnlab.save(gpt, tmp_path / "x", layout="onnx")


def test_atomic_write_leaves_a_file_readable_as_the_umask_allows(tmp_path):
    """mkstemp creates 0600 temporaries; the renamed file must not stay owner-only (metrics.json, curves)."""
    import os

    from attnlab.interop import files
    target = tmp_path / "metrics.json"
    files.atomic_write(target, lambda tmp: open(tmp, "w").write("{}\n"))
    assert target.read_text() == "{}\n"
    assert target.stat().st_mode & 0o777 == 0o666 & ~files._UMASK
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_tokens_per_s_does_not_count_evaluation_time(tmp_path):
    """An evaluation that takes 0.5 s falls in the logging window of steps 3-4 and not in steps 1-2's: the
    logged rate is of training steps, so the two windows give about the same tokens/s (elapsed_s keeps the
    wall clock, evaluation included)."""
    import time as _time
    torch.manual_seed(0)
    model = MaskedLM(tiny_bert(50, dropout=0.0, attention_dropout=0.0))
    ids = torch.randint(5, 50, (4, 8))
    batches = [{"input_ids": ids, "labels": ids}] * 4
    args = TrainArgs(output_dir=str(tmp_path), max_steps=4, log_every=2, eval_every=2, progress=False)
    Trainer(model, args, batches, evaluate_fn=lambda m: _time.sleep(0.5) or {"score": 1.0}).train()
    rows = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "tokens_per_s" in r]
    first, second = rows[0], rows[1]
    assert second["elapsed_s"] - first["elapsed_s"] >= 0.5  # the evaluation is in the wall clock
    window = 2 * ids.numel() / second["tokens_per_s"]      # the time the rate says the two steps took
    assert window < 0.25
