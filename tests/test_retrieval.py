"""Dense (DPR-style) and late-interaction (ColBERT-style) retrieval: MaxSim by hand, dense search = brute-force
cosine ranking, index round trips, the contrastive loss, SQuAD recall, and the CLI's bad-input lines."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.inference.embed import embed
from attnlab.inference.retrieval import (Index, build_index, encode, load_index, maxsim, save_index, search,
                                         top_k)
from attnlab.interop.hf import save_pretrained
from attnlab.models.encoder import Encoder
from attnlab.objectives.contrastive import dense_scores, info_nce, maxsim_scores
from attnlab.tasks.retrieval import (contrastive_batches, contrastive_finetune, evaluate_retrieval, gold_in_index,
                                    squad_pairs, squad_pairs_by_article)

PASSAGES = ["The cat sat on the mat.", "Paris is the capital of France.", "Python is a programming language.",
            "Rain falls from clouds when drops grow heavy.", "The Normans conquered England in 1066.",
            "Água é vida; café também.", "Bees make honey from nectar.", "A triangle has three sides."]


@pytest.fixture(scope="module")
def tiny(minilm, tmp_path_factory):
    """A random 1-layer encoder with MiniLM's WordPiece tokenizer: (model, tokenizer, directory)."""
    root = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    path = save_pretrained(Encoder(ModelConfig(vocab_size=30522, hidden_size=16, num_layers=1, num_heads=2,
                                               intermediate_size=32, max_position_embeddings=64)), root / "model")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(minilm / name, path / name)
    return attnlab.load(path).eval(), attnlab.load_tokenizer(path), path


def test_maxsim_equals_a_hand_computation():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((3, 4)).astype(np.float32)
    passages = [rng.standard_normal((n, 4)).astype(np.float32) for n in (2, 5, 1)]
    offsets = np.cumsum([0] + [len(p) for p in passages])
    got = maxsim(q, np.concatenate(passages), offsets)
    hand = [sum(max(float(np.dot(qi, pj)) for pj in p) for qi in q) for p in passages]
    np.testing.assert_allclose(got, hand, rtol=1e-6)
    # the differentiable batch form: same numbers once vectors are normalised, padding ignored on both sides
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    pn = [p / np.linalg.norm(p, axis=1, keepdims=True) for p in passages]
    hand_n = [sum(max(float(np.dot(qi, pj)) for pj in p) for qi in qn) for p in pn]
    width = max(len(p) for p in passages)
    p_hidden = torch.zeros(3, width, 4)
    p_mask = torch.zeros(3, width, dtype=torch.long)
    for i, p in enumerate(passages):
        p_hidden[i, :len(p)] = torch.from_numpy(p) * (i + 2)  # scale: cosine must not care
        p_mask[i, :len(p)] = 1
    q_hidden = torch.cat([torch.from_numpy(q), torch.randn(2, 4)])[None]  # 2 padding query tokens
    q_mask = torch.tensor([[1, 1, 1, 0, 0]])
    torch.testing.assert_close(maxsim_scores(q_hidden, q_mask, p_hidden, p_mask)[0],
                               torch.tensor(hand_n, dtype=torch.float32), rtol=1e-5, atol=1e-5)


def test_top_k_orders_best_first_with_ties_by_index():
    values = np.array([0.1, 0.9, 0.5, 0.9, -1.0])
    assert top_k(values, 3).tolist() == [1, 3, 2]
    assert top_k(values, 10).tolist() == [1, 3, 2, 0, 4]


def test_dense_search_equals_brute_force_cosine_ranking(tiny):
    model, tok, _ = tiny
    index = build_index(model, tok, PASSAGES, "dense", batch_size=3)
    vectors = embed(model, tok, PASSAGES, batch_size=5)          # the `attnlab embed` vectors
    np.testing.assert_allclose(index.vectors, vectors, atol=1e-5)
    for query in ("capital of France", "honey bees", "1066"):
        q = embed(model, tok, [query])[0]
        cos = vectors @ q / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(q))
        got = search(index, model, tok, [query], k=len(PASSAGES))[0]
        assert [i for i, _ in got] == np.argsort(-cos, kind="stable").tolist()
        np.testing.assert_allclose([s for _, s in got], np.sort(cos)[::-1], atol=1e-5)


def test_colbert_index_keeps_every_real_token(tiny):
    model, tok, _ = tiny
    index = build_index(model, tok, PASSAGES, "colbert", batch_size=3)
    lengths = [len(ids) for ids in tok(PASSAGES)["input_ids"]]
    assert np.diff(index.offsets).tolist() == lengths
    np.testing.assert_allclose(np.linalg.norm(index.vectors, axis=1), 1.0, atol=1e-5)
    # a passage's rows do not depend on what it was batched with (padding never leaks in)
    alone, _ = encode(model, tok, [PASSAGES[4]], "colbert")
    np.testing.assert_allclose(index.rows(4), alone, atol=1e-5)


@pytest.mark.parametrize("kind,dtype", [("dense", "float32"), ("colbert", "float32"), ("colbert", "float16")])
def test_index_round_trips(tiny, tmp_path, kind, dtype):
    model, tok, path = tiny
    passages = PASSAGES + ["line one\nline two \"quoted\""]
    index = build_index(model, tok, passages, kind, model_name=str(path), dtype=dtype)
    save_index(index, tmp_path / "idx")
    save_index(index, tmp_path / "idx")  # replacing an existing index leaves no temporary behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]
    again = load_index(tmp_path / "idx")
    assert again.kind == kind and again.passages == passages and again.meta == index.meta
    assert again.vectors.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(again.vectors, index.vectors)
    np.testing.assert_array_equal(again.offsets, index.offsets)
    assert search(again, model, tok, ["France"], 3) == search(index, model, tok, ["France"], 3)


def test_contrastive_loss_is_lower_for_matched_pairs():
    torch.manual_seed(0)
    q, mask = torch.randn(6, 5, 8), torch.ones(6, 5, dtype=torch.long)
    p = q + 0.1 * torch.randn(6, 5, 8)  # passage i is close to query i
    for scorer, t in ((dense_scores, 0.05), (maxsim_scores, 1.0)):
        matched = info_nce(scorer(q, mask, p, mask), t)
        shuffled = info_nce(scorer(q, mask, p[torch.tensor([1, 2, 3, 4, 5, 0])], mask), t)
        assert matched < 0.5 < np.log(6) < shuffled  # log(6): the loss of scores that cannot tell
    with pytest.raises(ValueError, match="square"):
        info_nce(torch.zeros(2, 3), 1.0)


def _squad(path, paragraphs_questions):
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": c, "qas": [{"id": f"{i}-{j}", "question": q, "answers": [{"text": c[:3], "answer_start": 0}]}
                               for j, q in enumerate(qs)]} for i, (c, qs) in enumerate(paragraphs_questions)]}]}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_batches_never_repeat_a_paragraph_and_can_keep_to_one_article(tmp_path):
    import random
    squad = tmp_path / "two.json"
    squad.write_text(json.dumps({"data": [
        {"title": t, "paragraphs": [{"context": f"{t} {i}", "qas": [
            {"id": f"{t}{i}{j}", "question": f"q {t} {i} {j}", "answers": [{"text": t, "answer_start": 0}]}
            for j in range(3)]} for i in range(5)]} for t in ("alpha", "beta")]}), encoding="utf-8")
    paragraphs, questions, gold, articles = squad_pairs_by_article([squad])
    assert articles == [0] * 5 + [1] * 5 and len(questions) == 30
    for groups in (None, articles):
        batches = contrastive_batches(questions, gold, 4, random.Random(0), groups)
        for _ in range(12):
            batch = next(batches)
            assert len({p for _, p in batch}) == len(batch) >= 2
            assert all(gold[q] == p for q, p in batch)
            if groups is not None:
                assert len({articles[p] for _, p in batch}) == 1


def test_squad_recall_and_a_short_finetune(tiny, tmp_path):
    model, tok, _ = tiny
    # each passage asked by its own text: that passage scores highest under both kinds (cosine 1, MaxSim = Lq)
    squad = _squad(tmp_path / "s.json", [(p, [p]) for p in PASSAGES])
    paragraphs, questions, gold = squad_pairs(squad)
    assert paragraphs == PASSAGES and gold == list(range(len(PASSAGES)))
    for kind in ("dense", "colbert"):
        index = build_index(model, tok, list(reversed(PASSAGES)), kind)
        result = evaluate_retrieval(index, model, tok, questions, gold_in_index(index, paragraphs, gold, "s.json"))
        assert result["recall@1"] == 1.0 and result["queries"] == len(PASSAGES) and result["latency_ms_median"] > 0
    with pytest.raises(ValueError, match="not in the index"):
        gold_in_index(build_index(model, tok, PASSAGES[:2], "dense"), paragraphs, gold, "s.json")
    # training on pairs: the eval paragraphs are left out, and the loss it reports falls on a repeated batch
    before = [p.detach().clone() for p in model.parameters()]
    run = contrastive_finetune(model, tok, PASSAGES, [p[:12] for p in PASSAGES], list(range(len(PASSAGES))),
                               "dense", exclude={PASSAGES[0], PASSAGES[1]}, batch_size=6, lr=1e-2, steps=8,
                               max_length=32, query_max_length=16)
    assert run["paragraphs"] == 6 and run["excluded_paragraphs"] == 2 and len(run["steps"]) == 8
    assert run["steps"][-1]["loss"] < run["steps"][0]["loss"]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_cli_index_and_search(tiny, tmp_path, capsys):
    _, _, path = tiny
    passages = tmp_path / "p.txt"
    passages.write_text("\n".join(PASSAGES[:4]) + "\n\n", encoding="utf-8")
    assert main(["index", str(passages), "--model", str(path), "--output", str(tmp_path / "idx"),
                 "--kind", "colbert"]) == 0
    out, err = capsys.readouterr()
    assert "indexed 4 passages" in out and "skipped 1 blank" in err
    assert main(["search", str(tmp_path / "idx"), PASSAGES[1], "-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].split("\t")[2:] == ["#1", PASSAGES[1]]
    squad = _squad(tmp_path / "s.json", [(p, [p]) for p in PASSAGES[:4]])
    assert main(["index", str(squad), "--model", str(path), "--output", str(tmp_path / "sq")]) == 0
    capsys.readouterr()
    assert main(["search", str(tmp_path / "sq"), "--squad", str(squad)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["recall@1"] == 1.0 and result["index_bytes"] > 4 * 16 * 4


@pytest.mark.parametrize("case", ["empty-passages", "blank-passages", "not-an-index", "broken-index",
                                  "squad-not-indexed", "no-query"])
def test_bad_input_is_one_line_and_status_2(tiny, tmp_path, capsys, case):
    _, _, path = tiny
    empty = tmp_path / "empty.txt"
    empty.write_text("" if case == "empty-passages" else "\n \n", encoding="utf-8")
    (tmp_path / "notidx").mkdir()
    if case in ("empty-passages", "blank-passages"):
        argv, expect = ["index", str(empty), "--model", str(path), "--output", str(tmp_path / "o")], "no passages"
    elif case == "not-an-index":
        argv, expect = ["search", str(tmp_path / "notidx"), "hello"], "not an attnlab index (no meta.json"
    else:
        model, tok, _ = tiny
        save_index(build_index(model, tok, PASSAGES[:2], "dense", model_name=str(path)), tmp_path / "idx")
        if case == "broken-index":
            (tmp_path / "idx" / "offsets.npy").write_bytes(b"garbage")
            argv, expect = ["search", str(tmp_path / "idx"), "hello"], "unreadable index file"
        elif case == "squad-not-indexed":
            squad = _squad(tmp_path / "s.json", [(p, [p]) for p in PASSAGES[:3]])
            argv, expect = ["search", str(tmp_path / "idx"), "--squad", str(squad)], "1 of its 3 paragraphs"
        else:
            argv, expect = ["search", str(tmp_path / "idx")], "give either QUERY or --squad"
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and expect in err and "Traceback" not in err, err
