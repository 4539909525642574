"""SetFit's contrastive stage for few labels (attnlab/tasks/setfit.py): the pair sampler is
balanced and seeded, the stage lowers the pair loss, the default rule turns it on below the threshold and
only for single-sentence classification, `finetune --help` states the rule, and a run prints why."""
from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.heads import SequenceClassification
from attnlab.nn.precision import resolve_precision
from attnlab.tasks.defaults import SETFIT_BELOW, SETFIT_STEPS, default_setfit_steps
from attnlab.tasks.setfit import _all_pair_loss, _pair_cosines, all_pair_batches, contrastive_stage, pair_loss, sample_pairs


def test_pairs_are_balanced_seeded_and_labelled_right():
    labels = [0] * 30 + [1] * 10 + [2] * 5
    pairs = sample_pairs(labels, 101, seed=3)
    assert len(pairs) == 101
    targets = Counter(t for _, _, t in pairs)
    assert targets == {1.0: 51, 0.0: 50}
    assert all(i != j for i, j, _ in pairs)
    assert all((labels[i] == labels[j]) == (t == 1.0) for i, j, t in pairs)
    # every sentence is an anchor once before any is again (the minority classes are not starved)
    assert sorted(i for i, _, _ in pairs[:45]) == list(range(45))
    assert sample_pairs(labels, 101, seed=3) == pairs and sample_pairs(labels, 101, seed=4) != pairs


def test_pairs_need_two_labels_and_a_positive():
    with pytest.raises(ValueError, match="at least two labels"):
        sample_pairs([1, 1, 1], 4)
    with pytest.raises(ValueError, match="at least two training examples"):
        sample_pairs([0, 1], 4)
    # a class of one still gives negatives; its anchor skips a positive turn
    pairs = sample_pairs([0, 0, 1], 6, seed=0)
    assert Counter(t for _, _, t in pairs) == {1.0: 3, 0.0: 3}


def _features(n: int, seed: int = 0) -> list[dict]:
    """Sentences whose words come from one of two disjoint vocabularies by label, plus shared filler."""
    g = torch.Generator().manual_seed(seed)
    feats = []
    for k in range(n):
        y = k % 2
        words = torch.randint(10 + 20 * y, 30 + 20 * y, (4,), generator=g).tolist()
        filler = torch.randint(60, 90, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        feats.append({"input_ids": [2, *words, *filler, 3], "token_type_ids": [0] * (len(words) + len(filler) + 2),
                      "labels": y})
    return feats


def test_the_contrastive_stage_lowers_the_pair_loss_and_leaves_frozen_weights_alone():
    torch.manual_seed(0)
    net = SequenceClassification(ModelConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=4,
                                             intermediate_size=64, max_position_embeddings=32,
                                             classifier_pooling="mean", extra={"num_labels": 2}))
    net.backbone.embeddings.tok.weight.requires_grad_(False)
    frozen = net.backbone.embeddings.tok.weight.clone()
    train, held = _features(40, seed=0), _features(40, seed=1)
    held_pairs = sample_pairs([f["labels"] for f in held], 200, seed=9)
    before = pair_loss(net, held, held_pairs, pad_id=0)
    losses = contrastive_stage(net, train, pad_id=0, steps=40, lr=1e-3, seed=0)
    after = pair_loss(net, held, held_pairs, pad_id=0)
    assert len(losses) == 40
    assert after < 0.7 * before, (before, after)  # on sentences the stage never saw
    assert torch.equal(net.backbone.embeddings.tok.weight, frozen)


def test_all_pairs_batches_cover_each_sentence_once_per_epoch_and_score_every_pair():
    batches = all_pair_batches(50, 7, 16, seed=1)
    assert len(batches) == 7 and all(len(b) == 16 for b in batches)
    for epoch in (batches[0:3], batches[3:6]):  # 50 // 16 = 3 full batches an epoch; the tail of 2 is dropped
        seen = [i for b in epoch for i in b]
        assert len(set(seen)) == 48
    assert all_pair_batches(50, 7, 16, seed=1) == batches and all_pair_batches(50, 7, 16, seed=2) != batches
    # the batch loss is the mean over all i < j pairs of (cos - same label)^2, as the sampled pairs compute it
    torch.manual_seed(0)
    net = SequenceClassification(ModelConfig(vocab_size=100, hidden_size=32, num_layers=1, num_heads=4,
                                             intermediate_size=64, max_position_embeddings=32,
                                             classifier_pooling="mean", extra={"num_labels": 2})).eval()
    feats, batch = _features(6), [4, 0, 5, 2]
    pairs = [(batch[a], batch[b], float(feats[batch[a]]["labels"] == feats[batch[b]]["labels"]))
             for a in range(4) for b in range(a + 1, 4)]
    with torch.no_grad():
        cos = _pair_cosines(net.backbone, feats, pairs, pad_id=0)
        want = ((cos - torch.tensor([t for _, _, t in pairs])) ** 2).mean()
        got = _all_pair_loss(net.backbone, feats, batch, pad_id=0)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="pairing"):
        contrastive_stage(net, feats, pad_id=0, steps=1, pairing="every")


def test_the_all_pairs_stage_lowers_the_pair_loss():
    torch.manual_seed(0)
    net = SequenceClassification(ModelConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=4,
                                             intermediate_size=64, max_position_embeddings=32,
                                             classifier_pooling="mean", extra={"num_labels": 2}))
    train, held = _features(40, seed=0), _features(40, seed=1)
    held_pairs = sample_pairs([f["labels"] for f in held], 200, seed=9)
    before = pair_loss(net, held, held_pairs, pad_id=0)
    contrastive_stage(net, train, pad_id=0, steps=20, lr=1e-3, seed=0, pairing="all")
    assert pair_loss(net, held, held_pairs, pad_id=0) < 0.7 * before


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_contrastive_stage_runs_in_the_precision_asked_and_keeps_fp32_weights(precision):
    """`finetune --precision bf16` reaches the SetFit stage: its forward passes run under bf16 autocast (the
    linear layers' outputs are bf16), the weights stay fp32, and the pair loss still falls."""
    torch.manual_seed(0)
    net = SequenceClassification(ModelConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=4,
                                             intermediate_size=64, max_position_embeddings=32,
                                             classifier_pooling="mean", extra={"num_labels": 2}))
    seen = set()
    linear = next(m for m in net.backbone.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(lambda mod, args, out: seen.add(out.dtype))
    train, held = _features(40, seed=0), _features(40, seed=1)
    held_pairs = sample_pairs([f["labels"] for f in held], 200, seed=9)
    before = pair_loss(net, held, held_pairs, pad_id=0)
    seen.clear()
    contrastive_stage(net, train, pad_id=0, steps=40, lr=1e-3, seed=0, precision=precision)
    assert seen == {torch.bfloat16 if precision == "bf16" else torch.float32}, seen
    assert all(p.dtype == torch.float32 for p in net.parameters())
    assert pair_loss(net, held, held_pairs, pad_id=0) < 0.7 * before


def test_the_rule_turns_on_below_its_threshold_only_where_it_applies():
    assert SETFIT_BELOW == 500 and SETFIT_STEPS == 600
    assert default_setfit_steps(499, True)[0] == SETFIT_STEPS
    steps, why = default_setfit_steps(500, True)
    assert steps == 0 and ">= 500" in why
    assert default_setfit_steps(10, False)[0] == 0
    assert default_setfit_steps(10, True, below=0)[0] == 0


def test_help_states_the_rule(capsys):
    """--help names the rule and points at the guide that states it with the measurement it rests on."""
    from pathlib import Path
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "SetFit below 500 labels" in text and "docs/guides/fine-tuning-defaults.md" in text
    guide = Path(__file__).resolve().parents[1] / "docs" / "guides" / "fine-tuning-defaults.md"
    text = " ".join(guide.read_text(encoding="utf-8").split())
    assert "Fewer than 500 examples of single-sentence classification" in text
    assert "SetFit's own recipe" in text and "no validation is held out" in text
    assert "81.4%" in text and "79.8% / 77.2%" in text  # the measurement the rule rests on
    assert "1_Pooling/config.json" in text


def _sentence_transformer(out, mode: str = "mean_tokens"):
    """Mark a checkpoint directory as a sentence-transformers model whose Pooling module reads `mode`."""
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps(
        {m: m == f"pooling_mode_{mode}" for m in ("pooling_mode_cls_token", "pooling_mode_mean_tokens",
                                                  "pooling_mode_max_tokens")}))
    return out


def test_sentence_pooling_reads_the_pooling_module(tmp_path):
    from attnlab.interop.local import sentence_pooling
    assert sentence_pooling("minilm") == "mean"  # all-MiniLM-L6-v2 ships 1_Pooling with mean tokens
    assert sentence_pooling(tmp_path) is None
    assert sentence_pooling(_sentence_transformer(tmp_path, "cls_token")) == "cls"
    assert sentence_pooling(_sentence_transformer(tmp_path, "max_tokens")) is None  # a mode we do not read
    (tmp_path / "modules.json").write_text("{not json")
    assert sentence_pooling(tmp_path) is None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    attnlab.from_config(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                    dropout=0.0, attention_dropout=0.0)).save(out)
    attnlab.load_tokenizer("minilm").save(out)
    return out


def test_a_run_prints_the_stage_and_why_and_keeps_a_mean_pooling_head(tiny, data_dir, tmp_path, capsys):
    lines = (data_dir / "glue/SST-2/train.tsv").read_text().splitlines()
    train = tmp_path / "train.tsv"
    train.write_text("\n".join(lines[:41]) + "\n")
    out = tmp_path / "out"
    assert main(["finetune", "sst2", "--model", str(tiny), "--train", str(train), "--output", str(out),
                 "--setfit-steps", "3", "--epochs", "0", "--max-length", "32", "--no-progress"]) == 0
    printed = capsys.readouterr()
    summary = json.loads(printed.out)
    assert summary["setfit_steps"] == 3 and summary["steps"] == 0
    assert summary["pooling"] == "mean" and summary["head_init"] == "probe"
    assert "SetFit stage: 3 pair steps" in printed.err and "because --setfit-steps" in printed.err
    assert attnlab.load(out).config.classifier_pooling == "mean"
    # no fine-tuning without a SetFit stage to precede it; SetFit refused where it does not apply
    assert main(["finetune", "sst2", "--model", str(tiny), "--train", str(train), "--output", str(out),
                 "--setfit-steps", "0", "--epochs", "0", "--no-progress"]) == 1
    assert "epochs=0" in capsys.readouterr().err
    assert main(["finetune", "conll2003", "--model", str(tiny), "--output", str(out), "--setfit-steps", "5",
                 "--max-train-samples", "20", "--no-progress"]) == 1
    assert "single-sentence classification" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:  # a negative step count is a usage error
        main(["finetune", "sst2", "--model", str(tiny), "--output", str(out), "--setfit-steps", "-1"])
    assert usage.value.code == 2 and "--setfit-steps" in capsys.readouterr().err


def test_few_labels_on_a_sentence_transformer_get_setfit_with_no_holdout_and_more_get_its_pooling(
        tiny, data_dir, tmp_path, capsys):
    import shutil
    st = tmp_path / "st"
    shutil.copytree(tiny, st)
    _sentence_transformer(st)
    lines = (data_dir / "glue/SST-2/train.tsv").read_text().splitlines()
    small, large = tmp_path / "small.tsv", tmp_path / "large.tsv"
    small.write_text("\n".join(lines[:41]) + "\n")
    large.write_text("\n".join(lines[:601]) + "\n")
    # 40 examples, no flags: SetFit's recipe, every example trains, nothing validated
    assert main(["finetune", "sst2", "--model", str(st), "--train", str(small), "--output", str(tmp_path / "a"),
                 "--max-length", "32", "--no-progress"]) == 0
    printed = capsys.readouterr()
    summary = json.loads(printed.out)
    assert summary["train_examples"] == 40 and summary["valid_examples"] == 0
    assert summary["setfit_steps"] == SETFIT_STEPS and summary["setfit_pairs"] == "all" and summary["steps"] == 0
    assert summary["pooling"] == "mean" and summary["head_init"] == "probe"
    # the SetFit stage runs in bf16 where the CPU has it natively (precision "auto"), with no flag
    assert summary["precision"] == resolve_precision("auto", "cuda" if torch.cuda.is_available() else "cpu")
    assert "train 40 examples, validate 0" in printed.err and "(the default rule)" in printed.err
    assert not any(k.startswith("eval_") for k in summary)
    assert attnlab.load(tmp_path / "a").config.classifier_pooling == "mean"
    # the same file with --valid or --epochs, or on a plain checkpoint: the plain fine-tune, 10% held out
    assert main(["finetune", "sst2", "--model", str(st), "--train", str(small), "--output", str(tmp_path / "b"),
                 "--max-length", "32", "--epochs", "1", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["setfit_steps"] == 0 and summary["valid_examples"] == 4 and summary["pooling"] == "mean"
    # plain fine-tuning of a pretrained sentence classifier: bf16 where native too (precision "auto")
    assert summary["precision"] == resolve_precision("auto", "cuda" if torch.cuda.is_available() else "cpu")
    assert main(["finetune", "sst2", "--model", str(tiny), "--train", str(small), "--output", str(tmp_path / "c"),
                 "--max-length", "32", "--epochs", "1", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["setfit_steps"] == 0 and summary["pooling"] == "cls"
    # 600 examples: past the threshold, the plain fine-tune reading the checkpoint's mean pooling
    assert main(["finetune", "sst2", "--model", str(st), "--train", str(large), "--output", str(tmp_path / "d"),
                 "--max-length", "32", "--epochs", "0.1", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["setfit_steps"] == 0 and summary["valid_examples"] == 60 and summary["pooling"] == "mean"


def test_a_few_labels_drawn_from_a_large_file_keep_its_validation_part(tiny, data_dir, tmp_path, monkeypatch,
                                                                        capsys):
    # `attnlab curve` draws 100 labels from SST-2's whole train.tsv (max_train_samples): the SetFit rule
    # applies by the 100, but holding out costs no labeled example there, so the 872 held-out sentences stay
    # and score the model (an unscored run broke the curve). A file too small to spare them holds nothing out.
    import shutil
    from attnlab.tasks import defaults
    from attnlab.tasks.curve import ModelSpec, learning_curve
    monkeypatch.setattr(defaults, "SETFIT_STEPS", 2)  # the rule's path, not its length
    st = tmp_path / "st"
    shutil.copytree(tiny, st)
    _sentence_transformer(st)
    curve = learning_curve("sst2", [ModelSpec(str(st))], [20], tmp_path / "curve", max_length=32)
    (run,) = curve["runs"]
    assert (run["train_examples"], run["valid_examples"]) == (20, 872) and run["value"] is not None
    (metrics,) = (tmp_path / "curve" / "runs").glob("*/metrics.json")
    summary = json.loads(metrics.read_text())
    assert summary["setfit_steps"] == 2 and summary["steps"] == 0
    lines = (data_dir / "glue/SST-2/train.tsv").read_text().splitlines()
    small = tmp_path / "small.tsv"
    small.write_text("\n".join(lines[:41]) + "\n")
    assert main(["finetune", "sst2", "--model", str(st), "--train", str(small), "--output", str(tmp_path / "s"),
                 "--max-train-samples", "39", "--max-length", "32", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)  # 40 examples cannot spare 4 and still give 39: nothing held out
    assert (summary["train_examples"], summary["valid_examples"], summary["setfit_steps"]) == (39, 0, 2)
