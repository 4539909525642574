"""ELECTRA replaced-token detection and DistilBERT-style distillation on tiny models."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.config import preset
from attnlab.heads import MaskedLM, SequenceClassification
from attnlab.objectives.distill import (DistillConfig, distill_loss, hidden_cosine_loss, init_student_from_teacher,
                                        soft_target_loss, student_config, student_layers)
from attnlab.objectives.electra import Electra, electra_collate, electra_loss, electra_metrics, generator_config
from attnlab.objectives.mlm import IGNORE, Vocab
from attnlab.training import Trainer, TrainArgs

from _pretrain_utils import one_thread, train_losses

REPO = Path(__file__).resolve().parents[1]
V = 40


@pytest.fixture(autouse=True)
def _single_thread():
    with one_thread():
        yield
SPECIAL = np.array([0, 1, 2, 3])  # pad, cls, sep, mask


def _tiny(**over):
    kw = dict(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
              max_position_embeddings=32, dropout=0.0, attention_dropout=0.0)
    return preset("bert-tiny", **{**kw, **over})


def _batch(rng, n=8, t=12):
    vocab = Vocab(V, 3, SPECIAL, None)
    examples = [np.concatenate([[1], rng.integers(4, 4 + 8, size=int(rng.integers(6, t - 1))), [2]]) for _ in range(n)]
    return electra_collate(examples, vocab, rng)


# ------------------------------------------------------------------------------------------------ ELECTRA
def test_electra_masking_uses_mask_token_or_keeps_original():
    batch = _batch(np.random.default_rng(0), n=64)
    chosen = batch["labels"] != IGNORE
    assert chosen.any() and (batch["input_ids"][chosen] == 3).float().mean() > 0.7
    kept = chosen & (batch["input_ids"] != 3)
    assert (batch["input_ids"][kept] == batch["labels"][kept]).all()  # no random replacements
    assert not chosen[batch["attention_mask"] == 0].any()


def test_generator_is_smaller_and_shares_embeddings():
    cfg = _tiny(model_type="electra", embedding_size=16, pooler=False)
    gen = generator_config(cfg)
    assert gen.hidden_size == 8 and gen.num_heads == 1 and gen.emb_size == 16
    model = Electra(cfg)
    d, g = model.discriminator.backbone.embeddings, model.generator.backbone.embeddings
    assert d.tok is g.tok and d.pos is g.pos and d.norm is g.norm and d.project is not g.project
    assert model.generator.mlm.decoder.weight is d.tok.weight


def test_electra_replaced_labels_and_loss_decreases():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = Electra(_tiny(model_type="electra", embedding_size=16, pooler=False))
    batch = _batch(rng)
    out = model(**batch)
    chosen = batch["labels"] != IGNORE
    original = torch.where(chosen, batch["labels"], batch["input_ids"])
    assert (out["corrupted"][~chosen] == original[~chosen]).all()
    assert torch.equal(out["replaced"], (out["corrupted"] != original).long())  # a sample equal to the original is "original"
    losses, sums = train_losses(model, electra_loss, [_batch(np.random.default_rng(i)) for i in range(4)], 16)
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4]), losses
    metrics = electra_metrics({k: v.item() for k, v in sums.items()})
    assert set(metrics) >= {"loss", "mlm_loss", "rtd_loss", "rtd_accuracy", "replaced_fraction"}


def test_electra_trains_checkpoints_and_exports(tmp_path):
    """Through the Trainer: checkpoints hold both networks (shared tensors once) and reload; the export is
    an ElectraForPreTraining directory plus its generator."""
    import attnlab
    from attnlab.interop.native import load_model_weights
    from attnlab.training.checkpoint import list_checkpoints
    torch.manual_seed(0)
    model = Electra(_tiny(model_type="electra", embedding_size=16, pooler=False))
    batches = [_batch(np.random.default_rng(i)) for i in range(2)]
    args = TrainArgs(output_dir=str(tmp_path / "run"), max_steps=4, lr=1e-3, log_every=2, save_every=4,
                     progress=False)
    Trainer(model, args, batches, loss_fn=electra_loss, eval_data=batches[:1], metrics_fn=electra_metrics).train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert "eval_rtd_accuracy" in rows[-1]
    again = Electra(_tiny(model_type="electra", embedding_size=16, pooler=False))
    load_model_weights(again, list_checkpoints(tmp_path / "run")[-1] / "model")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert again.generator.backbone.embeddings.tok is again.discriminator.backbone.embeddings.tok
    model.save(tmp_path / "export")
    assert attnlab.load(tmp_path / "export").hf_architecture == "ElectraForPreTraining"
    assert attnlab.load(tmp_path / "export" / "generator").hf_architecture == "ElectraForMaskedLM"


def test_shipped_electra_recipe_builds(data_dir):
    from attnlab.objectives import build_objective
    from attnlab.tokenizers import load_tokenizer
    from attnlab.training.pretrain import build_model_config, load_config
    cfg = load_config(REPO / "configs" / "pretrain-electra-mini.yaml")
    tok = load_tokenizer(data_dir / "vocab" / "bert-base-uncased")
    model_cfg = build_model_config(cfg.model, tok, cfg.data.seq_len)
    obj = build_objective(cfg.objective, tok, cfg.data.seq_len)
    model = obj.model_class(model_cfg)
    assert obj.kind == "electra" and isinstance(model, Electra)
    assert (model_cfg.num_layers, model_cfg.hidden_size, model_cfg.emb_size) == (4, 256, 128)
    assert model.generator.config.hidden_size == 64


# ------------------------------------------------------------------------------------------------ distillation
def test_soft_target_loss_matches_hand_computation():
    t, s, temp = torch.tensor([[2.0, 0.0], [0.5, 1.5]]), torch.tensor([[0.0, 0.0], [1.0, -1.0]]), 2.0
    total = 0.0
    for tr, sr in zip(t.tolist(), s.tolist()):
        pt = [math.exp(x / temp) / sum(math.exp(y / temp) for y in tr) for x in tr]
        ps = [math.exp(x / temp) / sum(math.exp(y / temp) for y in sr) for x in sr]
        total += sum(a * math.log(a / b) for a, b in zip(pt, ps))
    assert soft_target_loss(s, t, temp).item() == pytest.approx(total / 2 * temp ** 2, rel=1e-6)
    assert soft_target_loss(t[:1], t[:1], 3.0).item() == pytest.approx(0.0, abs=1e-7)
    assert soft_target_loss(torch.zeros(1, 2), torch.tensor([[2.0, 0.0]]), 2.0).item() == pytest.approx(0.4438, abs=1e-4)


def test_hidden_cosine_ignores_padding():
    a = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    b = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    assert hidden_cosine_loss(a, b, torch.tensor([[1, 0]])).item() == pytest.approx(0.0)
    assert hidden_cosine_loss(a, b).item() == pytest.approx(0.5)


def test_student_initialised_from_every_other_teacher_layer():
    assert student_layers(12, 6) == [0, 2, 4, 6, 8, 10] and student_layers(4, 2) == [0, 2]
    torch.manual_seed(0)
    teacher = MaskedLM(_tiny(num_layers=4))
    # a DistilBERT-layout student: no segment table, no pooler
    student = MaskedLM(student_config(teacher.config, 2, model_type="distilbert", type_vocab_size=0, pooler=False))
    used = init_student_from_teacher(student, teacher)
    assert used == [0, 2]
    t, s = teacher.state_dict(), student.state_dict()
    for i, j in enumerate(used):
        assert torch.equal(s[f"backbone.layers.{i}.attn.q.weight"], t[f"backbone.layers.{j}.attn.q.weight"])
        assert torch.equal(s[f"backbone.layers.{i}.ffn_norm.bias"], t[f"backbone.layers.{j}.ffn_norm.bias"])
    assert torch.equal(s["backbone.embeddings.tok.weight"], t["backbone.embeddings.tok.weight"])
    assert torch.equal(s["mlm.dense.weight"], t["mlm.dense.weight"])
    assert student.backbone.embeddings.seg is None and student.hf_architecture == "DistilBertForMaskedLM"


@pytest.mark.parametrize("task", ["mlm", "classification"])
def test_distillation_loss_decreases(task):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if task == "mlm":
        teacher = MaskedLM(_tiny(num_layers=4))
        student = MaskedLM(student_config(teacher.config, 2))
        batches = [_batch(np.random.default_rng(i)) for i in range(3)]
        for b in batches:
            b["masked_positions"] = b["labels"] != IGNORE
    else:
        teacher = SequenceClassification(_tiny(num_layers=4))
        student = SequenceClassification(student_config(teacher.config, 2))
        batches = [{"input_ids": torch.from_numpy(rng.integers(4, V, (8, 10))), "labels": torch.randint(0, 2, (8,))}
                   for _ in range(3)]
    with torch.no_grad():  # a teacher with opinions: at random init its soft targets are nearly uniform
        head = teacher.mlm.bias if task == "mlm" else teacher.classifier.weight
        head.normal_(0, 2.0)
    init_student_from_teacher(student, teacher)
    with torch.no_grad():
        (student.mlm.bias if task == "mlm" else student.classifier.weight).zero_()  # something left to learn
    opt = torch.optim.AdamW(student.parameters(), lr=3e-3)
    losses, ce = [], []
    for step in range(15):
        loss, parts = distill_loss(student, teacher, batches[step % 3], DistillConfig(temperature=2.0))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        ce.append(parts["ce"].item())
    assert set(parts) == {"ce", "task", "cos"}
    assert np.mean(losses[-3:]) < 0.85 * np.mean(losses[:3]), losses
    assert np.mean(ce[-3:]) < 0.5 * np.mean(ce[:3]), ce


def test_distill_cli_end_to_end(data_dir, tmp_path):
    """`attnlab distill`: a 2-layer BERT teacher into a 1-layer DistilBERT-layout student on a tiny corpus."""
    import attnlab
    from _pretrain_utils import sample_text, tiny_bert
    from attnlab.cli import main
    from attnlab.data import prepare_corpus
    from attnlab.tokenizers import train_tokenizer
    text = sample_text(data_dir, tmp_path / "text", chars_per_book=4000, books=3)
    files = sorted(text.iterdir())
    tok = train_tokenizer("wordpiece", files, 400)
    prepare_corpus(tok, files, tmp_path / "corpus", heldout=0.2, shard_tokens=3000, progress=False)
    torch.manual_seed(0)
    MaskedLM(tiny_bert(tok.vocab_size)).save(tmp_path / "teacher")
    assert main(["distill", "--teacher", str(tmp_path / "teacher"), "--corpus", str(tmp_path / "corpus"),
                 "--student-layers", "1", "--layout", "distilbert", "--output", str(tmp_path / "run"),
                 "--max-steps", "3", "--batch-size", "4", "--seq-len", "32", "--no-progress"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"eval_ce", "eval_task", "eval_cos", "eval_loss"} <= set(rows[-1])
    student = attnlab.load(tmp_path / "run" / "checkpoints" / "step-000003" / "model")
    assert student.hf_architecture == "DistilBertForMaskedLM" and student.config.num_layers == 1


def _sst2_head(data_dir, n, dst):
    lines = (data_dir / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines()
    dst.write_text("\n".join(lines[:n + 1]) + "\n", encoding="utf-8")
    return dst


def test_task_distillation_and_from_scratch_baseline(data_dir, tmp_path, capsys):
    """`finetune --from-scratch` trains the same architecture from random weights; `distill --task` turns a
    fine-tuned 4-layer teacher into a 2-layer student with the teacher's head, saved like finetune saves."""
    import attnlab
    from attnlab.cli import main
    from attnlab.config import ModelConfig
    base = tmp_path / "base"
    attnlab.from_config(ModelConfig(hidden_size=64, num_layers=4, num_heads=4, intermediate_size=128,
                                    dropout=0.0, attention_dropout=0.0)).save(base)
    attnlab.load_tokenizer("minilm").save(base)
    train = _sst2_head(data_dir, 400, tmp_path / "train.tsv")
    valid = tmp_path / "valid.tsv"
    valid.write_text("sentence\tlabel\n" + "".join(
        l + "\n" for l in (data_dir / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines()[-100:]))
    common = ["--train", str(train), "--valid", str(valid), "--epochs", "1", "--lr", "1e-3", "--batch-size", "16", "--max-length", "32",
              "--no-progress"]
    assert main(["finetune", "sst2", "--model", str(base), "--output", str(tmp_path / "teacher"), *common]) == 0
    # from scratch: the weights differ from base's, but the run is otherwise the same
    assert main(["finetune", "sst2", "--model", str(base), "--output", str(tmp_path / "scratch"), "--from-scratch",
                 *common]) == 0
    scratch = json.loads((tmp_path / "scratch/metrics.json").read_text())
    assert scratch["from_scratch"] is True
    a = attnlab.load(tmp_path / "scratch").state_dict()
    b = attnlab.load(base).state_dict()
    layer0 = [k for k in a if "layers.0." in k and k.endswith("weight") and a[k].dim() == 2]
    assert layer0 and all(not torch.equal(a[k], b[k.removeprefix("backbone.")]) for k in layer0)
    capsys.readouterr()

    out = tmp_path / "student"
    assert main(["distill", "--task", "sst2", "--teacher", str(tmp_path / "teacher"), "--student-layers", "2",
                 "--output", str(out), "--train", str(train), "--valid", str(valid), "--epochs", "1", "--lr", "1e-3", "--batch-size", "16",
                 "--max-length", "32", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["student_layers"] == 2 and summary["teacher_layers"] == 4
    assert summary["parameters"] < summary["teacher_parameters"]
    assert 0 <= summary["eval_accuracy"] <= 100
    student = attnlab.load(out)
    teacher = attnlab.load(tmp_path / "teacher")
    assert student.config.num_layers == 2 and student.config.extra["id2label"] == teacher.config.extra["id2label"]
    # `evaluate` reads the student like any fine-tuned model
    assert main(["evaluate", "sst2", "--model", str(out), "--data", str(valid)]) == 0
    assert "accuracy" in json.loads(capsys.readouterr().out)
    # exactly one mode
    assert main(["distill", "--teacher", str(tmp_path / "teacher"), "--student-layers", "2",
                 "--output", str(tmp_path / "x")]) == 1
    assert "exactly one of --corpus" in capsys.readouterr().err


def test_finetune_refuses_a_training_file_too_small_to_hold_out_from(data_dir, tmp_path, capsys):
    from attnlab.cli import main
    # since the 10% validation cap only a one-example file is too small to hold anything out
    train = _sst2_head(data_dir, 1, tmp_path / "train.tsv")
    assert main(["finetune", "sst2", "--model", "minilm", "--output", str(tmp_path / "o"), "--train", str(train),
                 "--epochs", "1", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "1 examples, too few to hold 1 out" in err and str(train) in err
    # with no flags the few-label rule (SetFit, nothing held out) takes it, and says why it cannot
    assert main(["finetune", "sst2", "--model", "minilm", "--output", str(tmp_path / "o"), "--train", str(train),
                 "--no-progress"]) == 1
    assert "SetFit pairs need at least two labels; the training examples have 1" in capsys.readouterr().err


def test_finetune_an_electra_discriminator_on_sst2(data_dir, tmp_path, capsys):
    """ELECTRA has no classification class in our HF table: the task's head goes over its backbone (with a
    new pooler) and the result is saved in attnlab's own layout, which evaluate reads back."""
    import attnlab
    from attnlab.cli import main
    from attnlab.heads import ReplacedTokenDetection, SequenceClassification
    cfg = preset("electra-small", num_layers=2, hidden_size=64, num_heads=4, intermediate_size=128,
                 embedding_size=32, dropout=0.0, attention_dropout=0.0)
    disc = ReplacedTokenDetection(cfg)
    disc.save(tmp_path / "disc")
    attnlab.load_tokenizer("minilm").save(tmp_path / "disc")
    train = _sst2_head(data_dir, 200, tmp_path / "train.tsv")
    valid = tmp_path / "valid.tsv"
    valid.write_text("sentence\tlabel\n" + "".join(
        l + "\n" for l in (data_dir / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines()[-60:]))
    out = tmp_path / "sst2"
    assert main(["finetune", "sst2", "--model", str(tmp_path / "disc"), "--output", str(out), "--train", str(train),
                 "--valid", str(valid), "--epochs", "1", "--batch-size", "16", "--max-length", "32",
                 "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    net = attnlab.load(out)
    assert isinstance(net, SequenceClassification) and net.config.model_type == "electra"
    # the encoder weights came from the discriminator (the first layer's query differs only by training)
    assert torch.allclose(net.backbone.embeddings.tok.weight, disc.backbone.embeddings.tok.weight)  # frozen
    assert main(["evaluate", "sst2", "--model", str(out), "--data", str(valid)]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(summary["eval_accuracy"], abs=1e-3)


def test_finetune_stops_on_a_non_finite_loss_naming_the_step(data_dir, tmp_path, capsys, monkeypatch):
    """A NaN loss stops fine-tuning before the optimizer step, naming the step, and the kept best
    checkpoint stays as it was."""
    import attnlab
    from attnlab.cli import main
    from attnlab.config import ModelConfig
    from attnlab.heads import SequenceClassification
    base = tmp_path / "base"
    attnlab.from_config(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)).save(base)
    attnlab.load_tokenizer("minilm").save(base)
    train = _sst2_head(data_dir, 64, tmp_path / "train.tsv")
    calls = {"n": 0}
    real = SequenceClassification.forward

    def poisoned(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if self.training and out.loss is not None:
            calls["n"] += 1
            if calls["n"] == 3:
                out.loss = out.loss * float("nan")
        return out
    monkeypatch.setattr(SequenceClassification, "forward", poisoned)
    assert main(["finetune", "sst2", "--model", str(base), "--output", str(tmp_path / "o"), "--train", str(train),
                 "--valid", str(train), "--batch-size", "16", "--max-length", "16", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "loss became nan at step 3" in err and "no checkpoint was written yet" in err
