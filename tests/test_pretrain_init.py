"""Continued pretraining (model.init_from), the unigram baseline next to MLM accuracy, the run summary."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import attnlab
from attnlab.config import ConfigError
from attnlab.data import open_shards, prepare_corpus
from attnlab.data.shards import token_counts
from attnlab.data.stream import BatchStream
from attnlab.heads import MaskedLM, PreTraining
from attnlab.models import Encoder
from attnlab.objectives import ObjectiveConfig, build_objective
from attnlab.objectives.mlm import IGNORE, unigram_baseline
from attnlab.tokenizers import load_tokenizer, train_tokenizer
from attnlab.interop.native import save_model
from attnlab.training.pretrain import load_config, pretrain

from _pretrain_utils import one_thread, sample_text

TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
        "model.max_position_embeddings=64", "model.dropout=0.0", "model.attention_dropout=0.0"]


@pytest.fixture(autouse=True)
def _single_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def corpus(data_dir: Path, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("init_from")
    text = sample_text(data_dir, root / "text", chars_per_book=6000, books=4)
    files = sorted(text.iterdir())
    tok = train_tokenizer("wordpiece", files, 600)
    prepare_corpus(tok, files, root / "corpus", heldout=0.2, shard_tokens=3000, progress=False)
    return root / "corpus"


def _run(corpus: Path, out: Path, *overrides: str, kind: str = "mlm"):
    cfg = load_config(None, [f"data.path={corpus}", "data.seq_len=32", "data.batch_size=4", "data.eval_batches=2",
                             f"objective.kind={kind}", f"train.output_dir={out}", "train.max_steps=6",
                             "train.lr=2e-3", "train.warmup_steps=2", "train.log_every=1", "train.eval_every=3",
                             "train.progress=false", *overrides])
    return cfg, pretrain(cfg)


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def _first_batch_loss(model, corpus: Path, cfg) -> float:
    """The loss the source model gives the very first training batch of a run with `cfg`."""
    tok = load_tokenizer(corpus / "tokenizer")
    obj = build_objective(cfg.objective, tok, cfg.data.seq_len)
    stream = BatchStream(open_shards(corpus, "train"), obj.examples, obj.collate, cfg.data.batch_size,
                         seed=cfg.train.seed, num_slices=1, owned=[0])
    model.train()  # dropout is 0: train mode gives the same numbers as the Trainer's first forward
    with torch.no_grad():
        loss, _ = obj.loss(model, next(iter(stream)))
    return float(loss)


def test_unigram_baseline_on_a_hand_made_example():
    counts = np.array([0, 0, 6, 3, 1])
    batches = [{"labels": torch.tensor([[IGNORE, 2, IGNORE], [3, IGNORE, IGNORE]])},
               {"labels": torch.tensor([[IGNORE, IGNORE, 2]])}]
    got = unigram_baseline(counts, batches)
    assert got["unigram_accuracy"] == pytest.approx(2 / 3)
    assert got["unigram_loss"] == pytest.approx(-(2 * math.log(7 / 15) + math.log(4 / 15)) / 3)
    assert unigram_baseline(counts, [{"labels": torch.full((1, 3), IGNORE)}]) == {}
    with pytest.raises(ValueError, match="label id 7"):
        unigram_baseline(counts, [{"labels": torch.tensor([[7]])}])


def test_token_counts_are_the_shards_ids(corpus):
    tok = load_tokenizer(corpus / "tokenizer")
    shards = open_shards(corpus, "train")
    counts = token_counts(shards, tok.vocab_size)
    ids = np.concatenate([np.asarray(s.tokens[:s.num_tokens]) for s in shards])
    assert counts.sum() == len(ids)
    assert counts[ids[0]] == int((ids == ids[0]).sum())
    assert counts[tok.mask_token_id] == 0  # specials are inserted at batching time, never counted


def test_pretrain_logs_the_unigram_baseline_and_a_summary(corpus, tmp_path):
    _, metrics = _run(corpus, tmp_path / "a", *TINY)
    assert 0 < metrics["eval_unigram_accuracy"] < 0.5 and metrics["eval_unigram_loss"] > 2
    evals = [json.loads(r) for r in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines() if "eval_" in r]
    assert len(evals) == 2 and all(e["eval_unigram_accuracy"] == metrics["eval_unigram_accuracy"] for e in evals)
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["tokens_seen"] == 6 * 4 * 32
    assert summary["tokens_per_s"] > 0 and summary["matmul_ceiling_gflops"] > 0 and 0 < summary["mfu"] < 1


def test_a_checkpoint_is_a_model_with_its_tokenizer(corpus, tmp_path):
    """checkpoints/step-N/model holds the run's tokenizer beside the weights: explore, viz and generate take
    it as MODEL directly."""
    from attnlab.training.checkpoint import list_checkpoints
    _run(corpus, tmp_path / "a", *TINY, "train.save_every=3")
    model_dir = list_checkpoints(tmp_path / "a")[-1] / "model"
    text = "the old house stood by the river"
    assert load_tokenizer(model_dir).encode(text) == load_tokenizer(corpus / "tokenizer").encode(text)
    assert attnlab.load(model_dir).config.vocab_size == len(load_tokenizer(model_dir))


@pytest.mark.parametrize("layout", ["MaskedLM", "Encoder"])
def test_init_from_loads_the_weights_and_continues(corpus, tmp_path, layout):
    _run(corpus, tmp_path / "src", *TINY, "train.max_steps=30")
    source = tmp_path / "src" / "model"
    if layout == "Encoder":  # a bare encoder (BertModel layout, no MLM head): the head starts fresh
        bare, trained = tmp_path / "bare", attnlab.load(source)
        encoder = Encoder(trained.config)  # BertModel has a pooler; the MLM model's backbone has none
        encoder.load_state_dict(trained.backbone.state_dict(), strict=False)
        save_model(encoder, bare)
        source = bare
    src = attnlab.load(source)
    cfg, _ = _run(corpus, tmp_path / "cont", f"model.init_from={source}", "train.seed=3")
    step1 = _losses(tmp_path / "cont")[1]
    if layout == "MaskedLM":  # loss at step 0 is the source model's own on that batch
        assert step1 == pytest.approx(_first_batch_loss(src, corpus, cfg), abs=1e-5)
        _run(corpus, tmp_path / "scratch", *TINY, "train.seed=3")
        # trained weights, not a random start: 30 source steps put step 1 0.20-0.36 below a random start's
        # (4 runs; the tiny runs are not bit-reproducible across machine load), so ask for half the smallest
        assert _losses(tmp_path / "scratch")[1] > step1 + 0.1
    else:
        # the backbone is the source's: only the fresh head separates it from a model built by hand
        torch.manual_seed(3)  # the seed init_from builds the fresh head with
        hand = MaskedLM(src.config)
        assert not hand.backbone.load_state_dict(src.state_dict(), strict=False).missing_keys
        hand.tie_weights()
        assert step1 == pytest.approx(_first_batch_loss(hand, corpus, cfg), abs=1e-5)


def test_init_from_resume_is_exact_and_nsp_head_starts_fresh(corpus, tmp_path):
    _run(corpus, tmp_path / "src", *TINY)
    src = tmp_path / "src" / "model"
    _run(corpus, tmp_path / "a", f"model.init_from={src}", kind="mlm+nsp")
    straight = _losses(tmp_path / "a")
    # the same run stopped after step 3 (a checkpoint) and resumed equals it: weights and every logged loss
    cfg = load_config(None, [f"data.path={corpus}", "data.seq_len=32", "data.batch_size=4", "data.eval_batches=2",
                             "objective.kind=mlm+nsp", f"train.output_dir={tmp_path / 'd'}", "train.max_steps=6",
                             "train.lr=2e-3", "train.warmup_steps=2", "train.log_every=1", "train.eval_every=3",
                             "train.progress=false", f"model.init_from={src}"])
    from attnlab.training.pretrain import init_from
    from attnlab.training import Trainer
    tok = load_tokenizer(corpus / "tokenizer")
    obj = build_objective(cfg.objective, tok, 32)
    model = init_from(str(src), obj, tok, cfg.model, 32, seed=cfg.train.seed, verbose=False)
    assert isinstance(model, PreTraining)
    stream = BatchStream(open_shards(corpus, "train"), obj.examples, obj.collate, 4, seed=0, num_slices=1, owned=[0])
    Trainer(model, cfg.train, stream, loss_fn=obj.loss).train(until=3)
    cfg.train.resume = True
    pretrain(cfg)  # resumes step 3 of the init_from run and finishes it
    assert _losses(tmp_path / "d") == straight
    a, d = attnlab.load(tmp_path / "a" / "model"), attnlab.load(tmp_path / "d" / "model")
    for (name, p), q in zip(a.named_parameters(), d.parameters()):
        assert torch.equal(p, q), name


def test_init_from_errors_name_the_field(corpus, tmp_path):
    _run(corpus, tmp_path / "src", *TINY)
    src = tmp_path / "src" / "model"
    with pytest.raises(ConfigError, match="remove model.hidden_size"):
        _run(corpus, tmp_path / "x", f"model.init_from={src}", "model.hidden_size=64")
    with pytest.raises(FileNotFoundError, match="model.init_from=.*no such directory"):
        _run(corpus, tmp_path / "x", f"model.init_from={tmp_path / 'nothing'}")


def test_embedding_init_ppmi_starts_from_the_corpus_vectors(corpus: Path, tmp_path):
    from attnlab.data.cooccur import ppmi_embeddings
    out = tmp_path / "ppmi"
    _run(corpus, out, *TINY, "model.embedding_init=ppmi", "train.max_steps=1", "train.lr=1e-9",
         "train.weight_decay=0", "train.eval_every=0")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["embedding_init"] == "ppmi" and summary["embedding_init_s"] >= 0
    shards = open_shards(corpus, "train")
    expected = ppmi_embeddings((s.tokens[:s.num_tokens] for s in shards), attnlab.load(out / "model").config.vocab_size, 32, seed=0)
    got = attnlab.load(out / "model").backbone.embeddings.tok.weight.detach().numpy()
    assert np.abs(got - expected).max() < 1e-4     # one step at lr 1e-9 moves nothing visible
    with pytest.raises(ConfigError, match="embedding_init"):
        _run(corpus, tmp_path / "bad", *TINY, "model.embedding_init=glove")


def test_init_from_a_sentence_transformers_checkpoint_keeps_its_pooling(corpus, tmp_path):
    """A task-adaptive MLM run from all-MiniLM-L6-v2 used to save a plain BERT checkpoint, so finetune read
    it with [CLS] pooling while MiniLM itself is read with the mean: the two could not be compared."""
    from attnlab.interop.local import sentence_pooling
    _run(corpus, tmp_path / "src", *TINY)
    source = tmp_path / "src" / "model"
    assert sentence_pooling(source) is None
    _run(corpus, tmp_path / "plain", f"model.init_from={source}")
    assert not (tmp_path / "plain" / "model" / "modules.json").exists()  # nothing to carry
    (source / "1_Pooling").mkdir()
    (source / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}))
    (source / "modules.json").write_text(json.dumps(
        [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
         {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    assert sentence_pooling(source) == "mean"
    _run(corpus, tmp_path / "st", f"model.init_from={source}")
    assert sentence_pooling(tmp_path / "st" / "model") == "mean"
    assert attnlab.load(tmp_path / "st" / "model") is not None  # still a checkpoint every command reads
