"""MLM / NSP / SOP / CLM example construction and the sparse MLM head."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.data.shards import Shard
from attnlab.heads import MaskedLM, PreTraining
from attnlab.objectives import ObjectiveConfig, build_objective
from attnlab.objectives.clm import clm_collate, clm_windows
from attnlab.objectives.mlm import IGNORE, Vocab, mask_tokens, mlm_collate, mlm_loss, packed_blocks
from attnlab.objectives.nsp import document_pairs, pair_examples
from attnlab.tokenizers import Tokenizer, build_char_tokenizer, load_tokenizer

from _pretrain_utils import tiny_bert


@pytest.fixture(scope="module")
def bert_tok(data_dir: Path) -> Tokenizer:
    return load_tokenizer(data_dir / "vocab" / "bert-base-uncased" / "vocab.txt")


@pytest.fixture(scope="module")
def real_ids(data_dir: Path, bert_tok) -> np.ndarray:
    """~100k tokens of Moby Dick as 800 rows of [CLS] ... [SEP] (128 tokens each)."""
    text = (data_dir / "gutenberg" / "2701-0.txt").read_text(encoding="utf-8-sig")[30_000:700_000]
    ids = np.array(bert_tok.encode(text, add_special_tokens=False)[:800 * 126]).reshape(800, 126)
    return np.concatenate([np.full((800, 1), bert_tok.cls_token_id), ids, np.full((800, 1), bert_tok.sep_token_id)], 1)


@pytest.mark.parametrize("prob", [0.15, 0.3])
@pytest.mark.parametrize("whole_word", [False, True])
def test_mlm_80_10_10_split_within_one_percent(bert_tok, real_ids, prob, whole_word):
    vocab = Vocab.from_tokenizer(bert_tok)
    inputs, labels = mask_tokens(real_ids, vocab, np.random.default_rng(0), prob, whole_word=whole_word)
    chosen = labels != IGNORE
    candidates = real_ids.size - 2 * len(real_ids)
    assert abs(chosen.sum() / candidates - prob) <= 0.01
    assert np.all(labels[chosen] == real_ids[chosen]) and np.all(inputs[~chosen] == real_ids[~chosen])
    masked = inputs[chosen] == bert_tok.mask_token_id
    unchanged = inputs[chosen] == real_ids[chosen]
    randomized = ~masked & ~unchanged
    assert abs(masked.mean() - 0.8) <= 0.01
    assert abs(randomized.mean() - 0.1) <= 0.01
    assert abs(unchanged.mean() - 0.1) <= 0.01
    # never a special token chosen, never one used as the random replacement
    assert not chosen[:, 0].any() and not chosen[:, -1].any()
    assert not np.isin(inputs[chosen][randomized], vocab.special_ids).any()


def test_whole_word_masking_takes_every_piece(bert_tok, real_ids):
    vocab = Vocab.from_tokenizer(bert_tok)
    _, labels = mask_tokens(real_ids, vocab, np.random.default_rng(1), 0.15, whole_word=True)
    chosen = labels != IGNORE
    cont = vocab.continuation[real_ids]  # "##" pieces (a row cut mid-word starts with one after [CLS])
    cont[:, 1] = False
    assert cont.sum() > 500  # the text has plenty of multi-piece words
    # a continuation piece is chosen exactly when the piece before it is
    assert np.array_equal(chosen[:, 1:][cont[:, 1:]], chosen[:, :-1][cont[:, 1:]])
    _, plain = mask_tokens(real_ids, vocab, np.random.default_rng(1), 0.15, whole_word=False)
    p = plain != IGNORE
    assert not np.array_equal(p[:, 1:][cont[:, 1:]], p[:, :-1][cont[:, 1:]])  # token-level masking splits words


def test_masking_is_dynamic_and_reproducible(bert_tok, real_ids):
    vocab = Vocab.from_tokenizer(bert_tok)
    a = mask_tokens(real_ids[:8], vocab, np.random.default_rng([0, 0, 1, 0]))
    b = mask_tokens(real_ids[:8], vocab, np.random.default_rng([0, 0, 1, 0]))
    c = mask_tokens(real_ids[:8], vocab, np.random.default_rng([0, 0, 1, 1]))  # next epoch / batch
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[1], c[1])


def test_vocab_without_mask_is_a_clear_error(data_dir):
    tok = build_char_tokenizer([data_dir / "tiny_shakespeare" / "input.txt"])
    with pytest.raises(ValueError, match="no mask token"):
        build_objective(ObjectiveConfig(kind="mlm"), tok, 64)
    with pytest.raises(ValueError, match="objective.kind"):
        build_objective(ObjectiveConfig(kind="unknown"), tok, 64)
    with pytest.raises(ValueError, match=r"tokenizer char: objective.kind=plm packs blocks with \[CLS\]"):
        build_objective(ObjectiveConfig(kind="plm"), tok, 64)  # XLNet's PLM needs no [MASK], but blocks need [CLS]


# ---------------------------------------------------------------------------------------------- pairs

def _synthetic_shard(docs: list[list[int]], sentence_len: int = 7) -> Shard:
    """Documents whose token ids encode (document, position): id = 10000 * (doc + 1) + position."""
    tokens, sentences, documents = [], [0], [0]
    for d, n in enumerate(docs):
        ids = [10000 * (d + 1) + i for i in range(n)]
        for k in range(0, n, sentence_len):
            tokens += ids[k:k + sentence_len]
            sentences.append(len(tokens))
        documents.append(len(sentences) - 1)
    return Shard(Path("synthetic"), np.array(tokens, dtype=np.int64), np.array(sentences), np.array(documents))


@pytest.mark.parametrize("task", ["nsp", "sop"])
def test_sentence_pairs_follow_bert_construction(task):
    shard = _synthetic_shard([300 + 37 * d for d in range(30)])
    cls_id, sep_id, max_len = 1, 2, 64
    examples = list(pair_examples([shard], max_len, cls_id, sep_id, np.random.default_rng(0), task=task))
    assert len(examples) > 150
    labels = np.array([e["next_sentence_label"] for e in examples])
    assert 0.4 < labels.mean() < 0.6
    short = 0
    for e in examples:
        ids, types = e["input_ids"], e["token_type_ids"]
        assert len(ids) <= max_len and len(ids) == len(types)
        first_sep = ids.index(sep_id)
        assert ids[0] == cls_id and ids[-1] == sep_id and ids.count(sep_id) == 2
        a, b = ids[1:first_sep], ids[first_sep + 1:-1]
        assert types == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        assert a and b
        doc_a, doc_b = {t // 10000 for t in a}, {t // 10000 for t in b}
        assert len(doc_a) == 1 and len(doc_b) == 1  # each segment is a span of one document
        short += len(ids) < max_len // 2
        if task == "nsp":
            if e["next_sentence_label"] == 0:  # IsNext: B continues A in the same document
                assert doc_a == doc_b and max(a) < min(b)
            else:
                assert doc_a != doc_b
        else:  # SOP: always the same document; label 1 = swapped
            assert doc_a == doc_b
            assert (max(a) < min(b)) == (e["next_sentence_label"] == 0)
    assert short > 0  # short_seq_prob=0.1 yields some short pairs


def test_pair_truncation_keeps_max_length():
    shard = _synthetic_shard([500, 500, 500], sentence_len=100)  # sentences longer than the budget
    docs = [shard.document(d) for d in range(3)]
    for d in range(3):
        for e in document_pairs(docs, d, 32, np.random.default_rng(d), cls_id=1, sep_id=2, short_seq_prob=0):
            assert len(e["input_ids"]) <= 32


# ---------------------------------------------------------------------------------------------- packing

def test_mlm_packing_has_no_padding(bert_tok):
    shard = _synthetic_shard([50, 130, 20, 400])
    blocks = list(packed_blocks([shard], 64, bert_tok.cls_token_id, bert_tok.sep_token_id, np.random.default_rng(0)))
    assert len(blocks) == (600 + 4) // 63
    stream = np.concatenate([b[1:] for b in blocks])
    assert all(len(b) == 64 and b[0] == bert_tok.cls_token_id for b in blocks)
    assert (stream == bert_tok.sep_token_id).sum() >= 3  # documents separated by [SEP]
    batch = mlm_collate(blocks[:4], Vocab.from_tokenizer(bert_tok), np.random.default_rng(0))
    assert "attention_mask" not in batch and batch["input_ids"].shape == (4, 64)
    assert torch.equal(batch["masked_positions"], batch["labels"] != IGNORE)


def test_clm_targets_are_shifted_inputs():
    shard = _synthetic_shard([100, 100])
    for random_windows in (False, True):
        windows = list(clm_windows([shard], 16, np.random.default_rng(0), eot_id=7, random_windows=random_windows))
        assert len(windows) == 202 // 17 and all(len(w) == 17 for w in windows)
        batch = clm_collate(windows)
        assert torch.equal(batch["labels"][:, :-1], batch["input_ids"][:, 1:])
    tiles = np.concatenate(list(clm_windows([shard], 16, np.random.default_rng(0), eot_id=7)))
    assert 7 in tiles  # the document boundary is marked


# ---------------------------------------------------------------------------------------------- sparse head

@pytest.mark.parametrize("cls", [MaskedLM, PreTraining])
def test_sparse_prediction_equals_dense(cls):
    torch.manual_seed(0)
    model = cls(tiny_bert(300)).eval()
    ids = torch.randint(5, 300, (3, 20))
    labels = torch.full_like(ids, IGNORE)
    labels[:, ::4] = ids[:, ::4]
    sel = labels != IGNORE
    dense = model(input_ids=ids, labels=labels)
    sparse = model(input_ids=ids, labels=labels, masked_positions=sel)
    assert sparse.logits.shape == (int(sel.sum()), 300)
    torch.testing.assert_close(sparse.logits, dense.logits[sel])
    torch.testing.assert_close(sparse.loss, dense.loss)
    assert dense.logits.shape == (3, 20, 300)  # without masked_positions: the full (HF-compatible) output


def test_mlm_loss_reports_accuracy_sums(bert_tok):
    torch.manual_seed(0)
    model = PreTraining(tiny_bert(bert_tok.vocab_size))
    examples = list(pair_examples([_synthetic_shard([200] * 2)], 32, bert_tok.cls_token_id, bert_tok.sep_token_id,
                                  np.random.default_rng(0)))[:4]
    batch = mlm_collate(examples, Vocab.from_tokenizer(bert_tok), np.random.default_rng(0))
    loss, sums = mlm_loss(model, batch)
    assert loss.requires_grad and torch.isfinite(loss)
    assert sums["mlm_n"] == (batch["labels"] != IGNORE).sum()
    assert sums["nsp_n"] == 4 and 0 <= sums["nsp_correct"] <= 4
