"""CoNLL-2003 reading, first-sub-token labelling, mapping predictions back to words, CoNLL output,
and entity-level F1 checked by hand and against seqeval's conlleval mode."""
from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab.tasks import DataError, get_task
from attnlab.tasks.ner import entity_scores, read_conll


def test_reader_counts_the_official_sizes(data_dir):
    train = read_conll(data_dir / "conll2003/train.txt")
    valid = read_conll(data_dir / "conll2003/valid.txt")
    assert (len(train), sum(len(s["words"]) for s in train)) == (14041, 203621)
    assert (len(valid), sum(len(s["words"]) for s in valid)) == (3250, 51362)
    assert get_task("conll2003").label_list(train) == ["B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC",
                                                       "I-ORG", "I-PER", "O"]
    assert train[0]["words"][:3] == ["EU", "rejects", "German"] and train[0]["tags"][:3] == ["B-ORG", "O", "B-MISC"]


def test_missing_tag_column_names_the_line(tmp_path):
    f = tmp_path / "bad.txt"
    f.write_text("EU NNP B-NP B-ORG\nrejects\n")
    with pytest.raises(DataError, match="bad.txt:2: missing column NER tag"):
        read_conll(f)


def test_unseen_tag_is_an_error(tmp_path):
    f = tmp_path / "valid.txt"
    f.write_text("-DOCSTART- -X- -X- O\n\nParis NNP B-NP B-CITY\n")
    task = get_task("conll2003")
    tok = attnlab.load_tokenizer("minilm")
    with pytest.raises(DataError, match="valid.txt:3: label 'B-CITY' was not seen in training"):
        task.features(task.read(f), tok, 32, {"O": 0, "B-LOC": 1}, training=False)


def test_only_first_subtoken_is_labelled():
    tok = attnlab.load_tokenizer("minilm")
    task = get_task("conll2003")
    ex = [{"words": ["Leicestershire", "beat", "Somerset"], "tags": ["B-ORG", "O", "B-ORG"], "line": 1, "source": "x"}]
    f = task.features(ex, tok, 64, {"O": 0, "B-ORG": 1}, training=True)[0]
    tokens = tok.convert_ids_to_tokens(f["input_ids"])
    for t, label, w in zip(tokens, f["labels"], f["word_ids"]):
        if t.startswith("##") or w is None:
            assert label == -100
    firsts = [label for label in f["labels"] if label != -100]
    assert firsts == [1, 0, 1]


class _Oracle(torch.nn.Module):
    """Predicts, at every token, the label id it is handed: checks the mapping back to words."""
    hf_architecture = "BertForTokenClassification"

    def __init__(self, labels, feats):
        super().__init__()
        from attnlab.config import ModelConfig
        self.config = ModelConfig(extra={"id2label": {str(i): l for i, l in enumerate(labels)}})
        self.table = {tuple(f["input_ids"]): f["labels"] for f in feats}
        self.n = len(labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        out = torch.zeros(*input_ids.shape, self.n)
        for row, ids in enumerate(input_ids.tolist()):
            key = tuple(i for i, m in zip(ids, attention_mask[row].tolist()) if m)
            for pos, lab in enumerate(self.table[key]):
                out[row, pos, max(lab, 0)] = 1.0
        return type("O", (), {"logits": out})()


def test_predictions_map_back_to_words_and_write_conll(data_dir, tmp_path):
    task = get_task("conll2003")
    tok = attnlab.load_tokenizer("minilm")
    sents = task.read(data_dir / "conll2003/valid.txt")[:40]
    labels = task.label_list(task.read(data_dir / "conll2003/train.txt"))
    feats = task.features(sents, tok, 128, {l: i for i, l in enumerate(labels)}, training=True)
    preds = task.predict(_Oracle(labels, feats), tok, sents, 128)
    assert preds == [s["tags"] for s in sents]
    assert task.score(sents, preds)["f1"] == 100.0
    out = tmp_path / "pred.conll"
    task.write_predictions(sents, preds, out)
    first = out.read_text().split("\n\n")[0].splitlines()
    assert first[2] == "LEICESTERSHIRE B-ORG B-ORG"


def test_entity_f1_hand_computed_and_conlleval_mode():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    # entities: gold {PER, LOC, ORG}, pred {PER, ORG(wrong type at 3), ORG}: tp=2, p=2/3, r=2/3
    s = entity_scores(gold, pred)
    assert s["f1"] == pytest.approx(200 / 3) and s["precision"] == pytest.approx(200 / 3)
    assert s["accuracy"] == pytest.approx(100 * 5 / 6)
    # conlleval treats an I- after O as the start of an entity; a boundary error counts as a miss
    gold = [["O", "B-PER", "I-PER", "O"]]
    pred = [["O", "I-PER", "O", "O"]]
    s = entity_scores(gold, pred)
    assert s["precision"] == 0.0 and s["recall"] == 0.0
