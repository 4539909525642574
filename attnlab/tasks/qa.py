"""Extractive question answering in the SQuAD v1.1 format (Rajpurkar et al. 2016), BERT §4.2.

Input is `[CLS] question [SEP] context window [SEP]` (segments 0 / 1). A context longer than the window
is cut into overlapping windows whose starts are `doc_stride` tokens apart, so every answer lies whole
inside at least one window. The model scores each token as the answer's start and as its end; the answer
is the span (i <= j, at most `max_answer_length` tokens, inside the context) maximising start[i] + end[j]
over the `n_best` top starts and ends of all windows of a question. Token offsets into the context
string turn the span back into text. During training a window that does not contain the whole answer
points both positions at [CLS].

Scores are the official SQuAD v1.1 ones: exact match and token F1 after normalisation (lower-case,
punctuation and the articles a/an/the removed, whitespace collapsed), the best over the gold answers.
"""
from __future__ import annotations

import collections
import json
import re
import string
import warnings
from pathlib import Path

import torch

from .base import Task
from .common import DataError, run_model

MAX_QUERY_LENGTH = 64
DOC_STRIDE = 128
N_BEST = 20
MAX_ANSWER_LENGTH = 30


def read_squad(path: str | Path, with_answers: bool = True) -> tuple[list[dict], list[str]]:
    """Questions as {"id", "question", "context", "answers": [{"text", "answer_start"}]}; and the ids of
    questions skipped because an answer_start does not point at its answer text in the context."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not valid SQuAD JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise DataError(f"{path}: expected SQuAD format {{\"data\": [{{\"paragraphs\": [...]}}]}}")

    def get(node, key: str, kind: type, where: str, default=None):
        """node[key] checked to be a `kind`; the error names the file and where in it (data[0].paragraphs[1]...)."""
        if not isinstance(node, dict):
            raise DataError(f"{path}: {where} must be an object, got {type(node).__name__}")
        value = node.get(key, default)
        if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
            want = {str: "a string", int: "an integer", list: "a list"}.get(kind, "a string or an integer")
            raise DataError(f"{path}: {where}.{key} must be {want}, got {type(value).__name__}")
        return value

    examples, skipped = [], []
    for i, article in enumerate(data["data"]):
        for j, paragraph in enumerate(get(article, "paragraphs", list, f"data[{i}]", [])):
            where = f"data[{i}].paragraphs[{j}]"
            context = get(paragraph, "context", str, where)
            for k, qa in enumerate(get(paragraph, "qas", list, where, [])):
                at = f"{where}.qas[{k}]"
                qid = str(get(qa, "id", (str, int), at))
                question = get(qa, "question", str, at)
                answers = get(qa, "answers", list, at, [])
                for n, a in enumerate(answers):
                    get(a, "text", str, f"{at}.answers[{n}]")
                    get(a, "answer_start", int, f"{at}.answers[{n}]")
                if with_answers:
                    if not answers:
                        raise DataError(f"{path}: question {qid!r} has no answers (SQuAD v1.1 needs one)")
                    if any(not 0 <= a["answer_start"] <= len(context)
                           or context[a["answer_start"]:a["answer_start"] + len(a["text"])] != a["text"]
                           for a in answers):
                        skipped.append(qid)
                        continue
                examples.append({"id": qid, "question": question, "context": context,
                                 "answers": answers, "source": str(path)})
    return examples, skipped


class QATask(Task):
    def read(self, path, with_answers: bool = True) -> list[dict]:
        examples, skipped = read_squad(path, with_answers)
        if skipped:
            warnings.warn(f"{path}: skipped {len(skipped)} question(s) whose answer_start does not match the "
                          f"answer text in the context (first: {', '.join(skipped[:3])})", stacklevel=2)
        if not examples:
            raise DataError(f"{path}: no usable questions")
        return examples

    def read_inputs(self, path) -> list[dict]:
        return self.read(path, with_answers=False)

    def features(self, examples, tokenizer, max_length, label2id, training) -> list[dict]:
        questions = tokenizer([ex["question"] for ex in examples], add_special_tokens=False,
                              max_length=MAX_QUERY_LENGTH, truncation=True)["input_ids"]
        contexts = sorted({ex["context"] for ex in examples})  # many questions share a paragraph
        enc = tokenizer(contexts, add_special_tokens=False, truncation=False, return_offsets=True)
        tokenized = {c: (ids, offs) for c, ids, offs in zip(contexts, enc["input_ids"], enc["offset_mapping"])}
        cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        feats = []
        for i, ex in enumerate(examples):
            q = questions[i]
            ctx_ids, offsets = tokenized[ex["context"]]
            budget = max_length - len(q) - 3
            if budget < 1:
                raise ValueError(f"max_length={max_length} leaves no room for the context after a "
                                 f"{len(q)}-token question")
            answer = None
            if training and ex.get("answers"):
                a = ex["answers"][0]
                a_start, a_end = a["answer_start"], a["answer_start"] + len(a["text"])
                inside = [t for t, (s, e) in enumerate(offsets) if e > a_start and s < a_end]
                answer = (inside[0], inside[-1]) if inside else None
            start = 0
            while True:
                window = range(start, min(start + budget, len(ctx_ids)))
                head = len(q) + 2  # [CLS] question [SEP]
                f = {"input_ids": [cls] + q + [sep] + ctx_ids[window.start:window.stop] + [sep],
                     "token_type_ids": [0] * head + [1] * (len(window) + 1), "example": i,
                     "context_start": head, "offsets": offsets[window.start:window.stop]}
                if training:
                    if answer and answer[0] >= window.start and answer[1] < window.stop:
                        f["start_positions"] = head + answer[0] - window.start
                        f["end_positions"] = head + answer[1] - window.start
                    else:
                        f["start_positions"] = f["end_positions"] = 0  # no answer here: point at [CLS]
                feats.append(f)
                if window.stop >= len(ctx_ids):
                    break
                start += min(DOC_STRIDE, budget)
        return feats

    def predict(self, model, tokenizer, examples, max_length, batch_size=64, progress=False) -> list:
        feats = self.features(examples, tokenizer, max_length, None, training=False)
        logits = run_model(model, feats, tokenizer.pad_token_id, batch_size, progress)
        best: dict[int, tuple[float, str]] = {}
        for f, lg in zip(feats, logits):
            context = examples[f["example"]]["context"]
            lo = f["context_start"]
            start, end = lg[lo:lo + len(f["offsets"]), 0], lg[lo:lo + len(f["offsets"]), 1]
            k = min(N_BEST, len(start))
            top_s, top_e = torch.topk(start, k).indices.tolist(), torch.topk(end, k).indices.tolist()
            for i in top_s:
                for j in top_e:
                    if j < i or j - i + 1 > MAX_ANSWER_LENGTH:
                        continue
                    score = float(start[i] + end[j])
                    if f["example"] not in best or score > best[f["example"]][0]:
                        best[f["example"]] = (score, context[f["offsets"][i][0]:f["offsets"][j][1]])
        return [best.get(i, (0.0, ""))[1] for i in range(len(examples))]

    def score(self, examples, predictions) -> dict[str, float]:
        return squad_scores([[a["text"] for a in ex["answers"]] for ex in examples], predictions)

    def write_predictions(self, examples, predictions, path: Path) -> None:
        """{question id: answer text}, the official SQuAD prediction file layout."""
        path.write_text(json.dumps({ex["id"]: p for ex, p in zip(examples, predictions)}, indent=1,
                                   ensure_ascii=False) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------------- official scores
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1: lower-case, drop punctuation, drop a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = collections.Counter(pred) & collections.Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def squad_scores(golds: list[list[str]], predictions: list[str]) -> dict[str, float]:
    """Mean exact match and F1 in percent, each the best over a question's gold answers."""
    n = max(len(predictions), 1)
    em = sum(max(exact_match(p, g) for g in gs) for p, gs in zip(predictions, golds))
    f1 = sum(max(token_f1(p, g) for g in gs) for p, gs in zip(predictions, golds))
    return {"exact_match": 100 * em / n, "f1": 100 * f1 / n}


# All 85,646 training questions (the data set's eight shards); one epoch is ~2.3 hours for MiniLM on 2 cores in
# bf16, so the preset takes one (the BERT paper takes 2-3 on accelerators).
SQUAD_SHARDS = ",".join(["squad/train.json"] + [f"squad/train_{i:02d}.json" for i in range(2, 9)])
SQUAD = QATask("squad", "BertForQuestionAnswering", "f1", SQUAD_SHARDS, "squad/dev.json",
               hyper=dict(epochs=1, lr=1e-4, batch_size=32, max_length=256))
