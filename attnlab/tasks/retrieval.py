"""Question -> paragraph retrieval on SQuAD: read the pairs, score an index (recall@k and query latency), and
fine-tune the encoder contrastively on train pairs (objectives/contrastive.py) with the eval paragraphs left out.

Recall@k is the share of questions whose own paragraph is among the k best-scored passages of the index (each
SQuAD question has exactly one gold paragraph, so this is also hit rate @ k). Latency is per query, one at a
time as a user would ask: tokenize + encode + score every passage + top-k, wall clock and CPU time.
"""
from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

import torch

from ..inference.retrieval import Index, encode, scores, top_k
from ..objectives.contrastive import SCORERS, info_nce
from .common import DataError
from .qa import read_squad

KS = (1, 5, 20)
TEMPERATURE = {"dense": 0.05, "colbert": 1.0}  # SBERT's scale 20 for cosines; ColBERT trains on raw MaxSim sums


def squad_pairs(paths) -> tuple[list[str], list[str], list[int]]:
    """(paragraphs in file order without repeats, questions, gold paragraph number of each question)."""
    paragraphs, questions, gold, _ = squad_pairs_by_article(paths)
    return paragraphs, questions, gold


def squad_pairs_by_article(paths) -> tuple[list[str], list[str], list[int], list[int]]:
    """squad_pairs plus, per paragraph, the number of its article (counted across the files)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    paragraphs: dict[str, int] = {}
    article_number: dict[tuple[str, int], int] = {}
    articles, questions, gold = [], [], []
    for path in paths:
        examples, _ = read_squad(path, with_answers=False)
        article_of = {p["context"]: (str(path), i) for i, a in enumerate(json.loads(Path(path).read_text("utf-8"))["data"])
                    for p in a.get("paragraphs", [])}
        for ex in examples:
            if ex["context"] not in paragraphs:
                paragraphs[ex["context"]] = len(paragraphs)
                key = article_of[ex["context"]]
                articles.append(article_number.setdefault(key, len(article_number)))
            gold.append(paragraphs[ex["context"]])
            questions.append(ex["question"])
    if not questions:
        raise DataError(f"{', '.join(map(str, paths))}: no questions")
    return list(paragraphs), questions, gold, articles


def gold_in_index(index: Index, paragraphs: list[str], gold: list[int], source: str) -> list[int]:
    """Each question's gold paragraph as a passage number of `index`; every paragraph must be indexed."""
    where = {text: i for i, text in enumerate(index.passages)}
    missing = [p for p in paragraphs if p not in where]
    if missing:
        raise DataError(f"{source}: {len(missing)} of its {len(paragraphs)} paragraphs are not in the index "
                        f"(first: {missing[0][:60]!r}...); build the index from the same file")
    return [where[paragraphs[g]] for g in gold]


def evaluate_retrieval(index: Index, model, tokenizer, questions: list[str], gold: list[int], *,
                       ks=KS, max_length: int | None = None, limit: int | None = None) -> dict:
    """recall@k for each k, and per-query latency (median / mean / p90 ms, wall and CPU; scoring alone)."""
    index = index.float32()
    model.eval()
    encode(model, tokenizer, questions[:1], index.kind, max_length=max_length, progress=False)  # warm-up
    hits = {k: 0 for k in ks}
    wall, cpu, score_ms = [], [], []
    n = len(questions) if limit is None else min(limit, len(questions))
    for question, g in zip(questions[:n], gold[:n]):
        t0, c0 = time.perf_counter(), time.process_time()
        q, _ = encode(model, tokenizer, [question], index.kind, max_length=max_length, progress=False)
        t1 = time.perf_counter()
        s = scores(index, q)
        best = top_k(s, max(ks))
        t2, c2 = time.perf_counter(), time.process_time()
        wall.append((t2 - t0) * 1e3)
        cpu.append((c2 - c0) * 1e3)
        score_ms.append((t2 - t1) * 1e3)
        rank = next((r for r, i in enumerate(best) if i == g), None)
        for k in ks:
            hits[k] += rank is not None and rank < k
    result = {"kind": index.kind, "queries": n, "passages": len(index), "rows": int(index.vectors.shape[0])}
    result.update({f"recall@{k}": round(hits[k] / n, 4) for k in ks})

    def summary(name, values):
        ordered = sorted(values)
        return {f"{name}_median": round(statistics.median(values), 2), f"{name}_mean": round(statistics.fmean(values), 2),
                f"{name}_p90": round(ordered[int(0.9 * (len(values) - 1))], 2)}
    result.update(summary("latency_ms", wall))
    result.update(summary("cpu_ms", cpu))
    result["score_ms_median"] = round(statistics.median(score_ms), 3)
    return result


def _tensors(tokenizer, texts: list[str], max_length: int):
    enc = tokenizer(texts, max_length=max_length, truncation=True, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def contrastive_batches(questions: list[str], gold: list[int], batch_size: int, rng: random.Random,
                        groups: list[int] | None = None):
    """Endless batches of (question, paragraph number), never the same paragraph twice in one batch: each pass
    shuffles the paragraphs and gives each one a random question of its own. With `groups` (a group number per
    paragraph, e.g. its article) a batch is cut from one group, so its in-batch negatives are on the same topic:
    the hard negatives a question meets when it must pick its paragraph out of its own article."""
    by_paragraph: dict[int, list[int]] = {}
    for qi, g in enumerate(gold):
        by_paragraph.setdefault(g, []).append(qi)
    paragraphs = sorted(by_paragraph)
    if len(paragraphs) < 2:
        raise DataError("contrastive training needs at least two paragraphs (in-batch negatives)")
    batch_size = min(batch_size, len(paragraphs))
    while True:
        rng.shuffle(paragraphs)
        if groups is None:
            chunks = [paragraphs[s:s + batch_size] for s in range(0, len(paragraphs) - batch_size + 1, batch_size)]
        else:
            members: dict[int, list[int]] = {}
            for p in paragraphs:
                members.setdefault(groups[p], []).append(p)
            chunks = [m[s:s + batch_size] for m in members.values() for s in range(0, len(m), batch_size)]
            chunks = [c for c in chunks if len(c) >= max(2, batch_size // 2)]  # no near-empty remainders
            rng.shuffle(chunks)
        for chunk in chunks:
            yield [(rng.choice(by_paragraph[p]), p) for p in chunk]


def contrastive_finetune(model, tokenizer, paragraphs: list[str], questions: list[str], gold: list[int],
                         kind: str = "dense", *, exclude: set[str] = frozenset(), batch_size: int = 16,
                         lr: float = 2e-5, steps: int = 1000, max_cpu_minutes: float | None = None,
                         temperature: float | None = None, max_length: int = 192, query_max_length: int = 48,
                         warmup: float = 0.1, seed: int = 0, groups: list[int] | None = None,
                         log=None) -> dict:
    """Train the encoder in place on (question, paragraph) pairs with InfoNCE over in-batch negatives, scoring
    as `kind` does; `groups` (per paragraph) draws each batch from one group (contrastive_batches).
    Paragraphs whose text is in `exclude` (the evaluation set's) and their questions are dropped.
    Stops after `steps` or once the process has used `max_cpu_minutes` of CPU. Returns {"steps": one record per
    step, "pairs", "paragraphs", "excluded_paragraphs"}."""
    if kind not in SCORERS:
        raise ValueError(f"kind={kind!r} is not one of {', '.join(SCORERS)}")
    keep = [i for i, p in enumerate(paragraphs) if p not in exclude]
    renumber = {old: new for new, old in enumerate(keep)}
    pairs = [(q, renumber[g]) for q, g in zip(questions, gold) if g in renumber]
    texts = [paragraphs[i] for i in keep]
    qs, gs = [q for q, _ in pairs], [g for _, g in pairs]
    temperature = TEMPERATURE[kind] if temperature is None else temperature
    torch.manual_seed(seed)
    backbone = getattr(model, "backbone", model)
    backbone.train()
    params = [p for p in backbone.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    warm = max(1, int(warmup * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / (steps - warm + 1e-9))))
    batches = contrastive_batches(qs, gs, batch_size, random.Random(seed),
                                  None if groups is None else [groups[i] for i in keep])
    history, c0, t0 = [], time.process_time(), time.perf_counter()
    for step in range(1, steps + 1):
        batch = next(batches)
        q_ids, q_mask = _tensors(tokenizer, [qs[i] for i, _ in batch], query_max_length)
        p_ids, p_mask = _tensors(tokenizer, [texts[p] for _, p in batch], max_length)
        q_h = backbone(input_ids=q_ids, attention_mask=q_mask).last_hidden_state
        p_h = backbone(input_ids=p_ids, attention_mask=p_mask).last_hidden_state
        s = SCORERS[kind](q_h, q_mask, p_h, p_mask)
        loss = info_nce(s, temperature)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        acc = (s.argmax(1) == torch.arange(len(batch))).float().mean().item()
        record = {"step": step, "loss": round(loss.item(), 4), "in_batch_acc": round(acc, 3),
                  "lr": sched.get_last_lr()[0], "cpu_s": round(time.process_time() - c0, 1),
                  "elapsed_s": round(time.perf_counter() - t0, 1)}
        history.append(record)
        if log:
            log(record)
        if max_cpu_minutes is not None and time.process_time() - c0 >= 60 * max_cpu_minutes:
            break
    backbone.eval()
    return {"steps": history, "pairs": len(pairs), "paragraphs": len(texts),
            "excluded_paragraphs": len(paragraphs) - len(texts)}
