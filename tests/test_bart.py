"""BART (issue 23): parity with transformers' BartForConditionalGeneration (the test-only oracle) in both
directions, cached decoding, the byte-level BPE tokenizer's special tokens, the five noising functions of
the paper with their statistics on WikiText-2, and the pretraining path. Tiny shapes throughout."""
from __future__ import annotations

import pytest
import torch

import attnlab
from _families import (check_loads_in_transformers, check_seq2seq_attentions, check_seq2seq_parity, hf_seq2seq,
                       load_clean, seq2seq_batch)
from attnlab.config import ConfigError, preset
from attnlab.inference.seq2seq import generate
from attnlab.models.seq2seq import Seq2SeqLM

transformers = pytest.importorskip("transformers")

V = 99


def _hf_bart(tmp_path, name, emb_std=0.3, **kw):
    cfg = dict(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=40)
    cfg.update(kw)
    model, path = hf_seq2seq(transformers.BartForConditionalGeneration, transformers.BartConfig(**cfg), tmp_path,
                             name, emb_std)
    with torch.no_grad():
        model.final_logits_bias.normal_(0, 0.2)  # a zero bias would not test that it is applied
    model.save_pretrained(path)
    return model, path


def _batch():
    return seq2seq_batch(V, pad=1)  # a padded source row (BART's positions do not depend on the padding)


@pytest.mark.parametrize("scale,act,dec_layers", [(False, "gelu", 3), (True, "relu", 2)])
def test_bart_logits_load_and_save(tmp_path, scale, act, dec_layers):
    hf, path = _hf_bart(tmp_path, f"{scale}-{act}", scale_embedding=scale, activation_function=act,
                        decoder_layers=dec_layers)
    ours = load_clean(path)
    assert type(ours).__name__ == "Seq2SeqLM" and len(ours.decoder.layers) == dec_layers
    assert ours.config.scale_embeddings is scale and ours.config.max_position_embeddings == 42  # 40 + offset 2
    ids, mask, dec = _batch()
    labels = dec.clone()
    labels[2, 5:] = -100
    # labels -> decoder inputs shifted right from decoder_start_token_id = </s> = 2, as HF's shift_tokens_right
    mine, back = check_seq2seq_parity(hf, ours, tmp_path, ids, mask, dec, labels)
    assert mine.logits.std() > 1.0  # not a degenerate comparison
    assert back.config.max_position_embeddings == 40 and back.config.decoder_layers == dec_layers
    assert torch.equal(back.final_logits_bias, hf.final_logits_bias)


def test_bart_from_scratch_saves_for_transformers(tmp_path):
    """A model attnlab built (random init, preset shape shrunk) loads in transformers with equal logits."""
    cfg = preset("bart-base", vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48,
                 max_position_embeddings=34, extra={**preset("bart-base").extra, "num_decoder_layers": 1})
    torch.manual_seed(0)
    ours = Seq2SeqLM(cfg).eval()
    with torch.no_grad():
        ours.final_logits_bias.normal_()
    back = check_loads_in_transformers(ours, transformers.BartForConditionalGeneration, tmp_path, *_batch())
    assert back.config.decoder_start_token_id == 2 and back.config.pad_token_id == 1


def test_bart_generation_matches(tmp_path):
    hf, path = _hf_bart(tmp_path, "gen", emb_std=0.05)
    ours = attnlab.load(path)
    ids, mask, dec = _batch()
    for beams in (1, 3):
        theirs = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, num_beams=beams,
                             min_length=0, forced_bos_token_id=None, forced_eos_token_id=None, no_repeat_ngram_size=0)
        mine = generate(ours, ids, mask, max_new_tokens=10, num_beams=beams)
        assert mine.tolist() == theirs.tolist(), f"num_beams={beams}"
    # not degenerate: several tokens, and rows that differ with their source
    assert len(set(mine[:, 1:].flatten().tolist())) >= 3 and len({tuple(r) for r in mine.tolist()}) > 1
    # cached decoding equals one full pass: tests/test_seq2seq.py::test_cache_equals_recompute[bart-base]


def test_bart_base_parameters_and_info(capsys):
    from attnlab.cli import main
    with torch.device("meta"):
        hf = transformers.BartForConditionalGeneration(transformers.BartConfig(
            d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12, decoder_attention_heads=12,
            encoder_ffn_dim=3072, decoder_ffn_dim=3072))
        large = transformers.BartForConditionalGeneration(transformers.BartConfig())  # the defaults: bart-large
        ours_large = Seq2SeqLM(preset("bart-large"))
    assert main(["info", "bart-base"]) in (0, None)
    out = capsys.readouterr().out
    assert f"parameters: {hf.num_parameters():,}" in out and "model_type=bart" in out  # 139,420,416
    assert ours_large.num_parameters() == large.num_parameters()


def test_bart_attentions_match(tmp_path):
    _, path = _hf_bart(tmp_path, "attn")
    hf = transformers.BartForConditionalGeneration.from_pretrained(path, attn_implementation="eager").eval()
    ours = attnlab.load(path)
    check_seq2seq_attentions(hf, ours, *_batch(), layers=2, heads=4)


# ----------------------------------------------------------------------------------- tokenizer
def _bart_vocab_dir(tmp_path):
    """A small BART-format vocab.json + merges.txt: <s> <pad> </s> <unk> = 0-3, BPE pieces, <mask> last."""
    import json

    import tokenizers as tk
    text = ["The cat sat on the mat.", "It was warm, and the game's release was near.", "naïve café — 2 000"] * 20
    bt = tk.Tokenizer(tk.models.BPE())
    bt.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bt.train_from_iterator(text, tk.trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                                        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet()))
    d = tmp_path / "bart-tok"
    d.mkdir()
    bt.model.save(str(d))
    vocab = json.loads((d / "vocab.json").read_text())
    vocab["<mask>"] = len(vocab)
    (d / "vocab.json").write_text(json.dumps(vocab))
    return d, vocab


def test_bart_vocab_files_load_with_fairseq_specials(tmp_path):
    from attnlab.tokenizers import load_tokenizer
    d, vocab = _bart_vocab_dir(tmp_path)
    ours = load_tokenizer(d)
    assert (ours.bos_token_id, ours.pad_token_id, ours.eos_token_id, ours.unk_token_id) == (0, 1, 2, 3)
    assert ours.mask_token_id == len(vocab) - 1 and ours.cls_token_id == 0 and ours.sep_token_id == 2
    # the oracle: transformers' BART tokenizer over the same files, with BART's <mask> (lstrip)
    theirs = transformers.BartTokenizer.from_pretrained(
        d, mask_token=transformers.AddedToken("<mask>", lstrip=True, rstrip=False))
    for text in ["The cat sat on the mat.", " It was warm", "naïve café — 2 000", "The <mask> sat on the <mask>."]:
        assert ours.encode(text) == theirs(text)["input_ids"], text
    assert ours.encode("a cat", "the mat") == theirs("a cat", "the mat")["input_ids"]  # <s> A </s></s> B </s>
    assert ours.encode("The cat")[0] == 0 and ours.encode("The cat")[-1] == 2
    assert ours.decode(ours.encode("The <mask> sat.")) == "The sat."  # specials skipped, the mask took " cat"'s space
    ours.save(tmp_path / "saved")  # tokenizer.json (+ vocab.json, merges.txt); a bare tokenizer.json loads too
    (tmp_path / "saved" / "tokenizer_config.json").unlink()
    again = load_tokenizer(tmp_path / "saved")
    assert again.mask_token_id == ours.mask_token_id and again.encode("a <mask>.") == ours.encode("a <mask>.")


# ----------------------------------------------------------------------------------- the noising functions
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from attnlab.data.root import data_root  # noqa: E402
from attnlab.objectives import denoise as dn  # noqa: E402

WIKITEXT = (data_root() or Path("ATTNLAB_DATA unset")) / "wikitext-2" / "valid.txt"
GPT2 = (data_root() or Path("ATTNLAB_DATA unset")) / "vocab" / "gpt2"


@pytest.fixture(scope="module")
def wikitext():
    """WikiText-2 validation paragraphs (headings left out) in GPT-2 byte-level BPE ids (BART's pieces)."""
    if not WIKITEXT.is_file() or not GPT2.is_dir():
        pytest.skip(f"needs {WIKITEXT} and {GPT2} (set ATTNLAB_DATA)")
    from attnlab.tokenizers import load_tokenizer
    tok = load_tokenizer(GPT2)
    lines = [ln for ln in WIKITEXT.read_text(encoding="utf-8").splitlines() if ln.strip() and not ln.strip().startswith("=")]
    docs = [np.asarray(ids, dtype=np.int64) for ids in tok(lines, truncation=False)["input_ids"]]
    assert sum(map(len, docs)) > 200_000
    return docs, tok.vocab_size, dn.sentence_end_ids(tok)  # <mask>: an id beyond GPT-2's vocabulary


def test_token_masking_and_infilling_noise_30_percent(wikitext):
    docs, mask, _ = wikitext
    rng = np.random.default_rng(0)
    total = masked = infilled = spans = 0
    for d in docs:
        out, chosen = dn.token_masking(d, rng, 0.3, mask)
        assert len(out) == len(d) and np.array_equal(np.flatnonzero(out == mask), chosen)
        assert np.array_equal(out[out != mask], d[out != mask])  # nothing else changed
        masked += len(chosen)
        out, record = dn.text_infilling(d, rng, 0.3, mask)
        # read the statistics off the output itself: one <mask> per span, the rest of the text kept in order
        m = int((out == mask).sum())
        removed = len(d) - (len(out) - m)
        assert m == len(record) and removed == sum(length for _, length in record)
        keep = np.ones(len(d), dtype=bool)
        for start, length in record:
            keep[start:start + length] = False
        assert np.array_equal(out[out != mask], d[keep])
        infilled, spans, total = infilled + removed, spans + m, total + len(d)
    assert abs(masked / total - 0.3) <= 0.01
    assert abs(infilled / total - 0.3) <= 0.01, infilled / total
    assert abs(infilled / spans - 3.0) <= 0.1, infilled / spans  # Poisson(3) spans, zero-length ones included
    assert spans > 20_000


def test_infilling_zero_length_span_inserts_a_mask():
    rng = np.random.default_rng(3)
    ids = np.arange(10, 40)
    seen_zero = False
    for _ in range(200):
        out, record = dn.text_infilling(ids, rng, 0.3, mask_id=0)
        for start, length in record:
            if length == 0:  # an insertion: the text around it is all there
                seen_zero = True
        assert len(out) == len(ids) - sum(n for _, n in record) + len(record)
    assert seen_zero  # P(0) = e^-3 = 5% per span


def test_token_deletion_removes_exactly_the_chosen_tokens(wikitext):
    docs, _, _ = wikitext
    rng = np.random.default_rng(1)
    total = deleted = 0
    for d in docs[:400]:
        out, chosen = dn.token_deletion(d, rng, 0.3)
        assert np.array_equal(out, np.delete(d, chosen)) and len(set(chosen.tolist())) == len(chosen)
        total, deleted = total + len(d), deleted + len(chosen)
    assert abs(deleted / total - 0.3) <= 0.01


def test_sentence_permutation_keeps_every_sentence_once(wikitext):
    from collections import Counter
    docs, _, ends = wikitext
    rng = np.random.default_rng(2)
    shuffled = 0
    for d in docs[:400]:
        starts = dn.sentence_starts(d, ends)
        bounds = [*starts, len(d)]
        before = [tuple(d[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        out, order = dn.sentence_permutation(d, rng, starts)
        after, pos = [], 0
        for k in order:
            after.append(tuple(out[pos:pos + len(before[k])]))
            pos += len(before[k])
        assert after == [before[k] for k in order] and pos == len(d)
        assert Counter(after) == Counter(before) and sorted(order.tolist()) == list(range(len(before)))
        shuffled += len(before) > 1 and not np.array_equal(out, d)
    assert shuffled > 200  # real multi-sentence paragraphs were permuted


def test_document_rotation_is_a_rotation(wikitext):
    docs, _, _ = wikitext
    rng = np.random.default_rng(4)
    starts = []
    for d in docs[:300]:
        out, start = dn.document_rotation(d, rng)
        assert np.array_equal(out, np.roll(d, -start)) and 0 <= start < len(d)
        starts.append(start / len(d))
    assert 0.4 < np.mean(starts) < 0.6  # uniform over the document


def test_noise_composes_and_is_seeded():
    ids = np.arange(100, 160)
    ids[[9, 19, 39, 59]] = 5  # four full stops: five sentences
    cfg = dn.NoiseConfig(mask=0.1, delete=0.1, infill=0.2, permute=1.0, rotate=1.0)
    a = dn.noise(ids, np.random.default_rng(7), cfg, mask_id=1, end_ids=[5])
    b = dn.noise(ids, np.random.default_rng(7), cfg, mask_id=1, end_ids=[5])
    c = dn.noise(ids, np.random.default_rng(8), cfg, mask_id=1, end_ids=[5])
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    kept = a[a != 1]
    assert len(set(kept.tolist()) - set(ids.tolist())) == 0 and len(kept) < len(ids) * 0.75
    assert np.array_equal(dn.noise(ids, np.random.default_rng(0), dn.NoiseConfig(infill=0.0, permute=0.0),
                                   mask_id=1), ids)  # every function off: the identity
    with pytest.raises(ValueError, match="noise_mask"):
        dn.NoiseConfig(mask=1.5).validate()


# ----------------------------------------------------------------------------------- pretraining
REPO = Path(__file__).resolve().parents[1]


def test_shipped_bart_recipe_builds():
    from attnlab.objectives import build_objective
    from attnlab.tokenizers import train_tokenizer
    from attnlab.training.pretrain import build_model_config, load_config
    cfg = load_config(REPO / "configs" / "pretrain-bart-mini.yaml")
    assert cfg.data.tokenizer == "bart-bpe:8192" and cfg.objective.kind == "denoise"
    tok = train_tokenizer("bart", [REPO / "README.md"], 600)
    model_cfg = build_model_config(cfg.model, tok, cfg.data.seq_len)
    obj = build_objective(cfg.objective, tok, cfg.data.seq_len)
    assert obj.model_class is Seq2SeqLM and model_cfg.model_type == "bart"
    assert (model_cfg.num_layers, model_cfg.extra["num_decoder_layers"], model_cfg.hidden_size) == (4, 4, 256)
    assert model_cfg.extra["position_offset"] == 2 and model_cfg.extra["final_logits_bias"]  # kept from the preset
    assert (cfg.objective.noise_infill, cfg.objective.poisson_lambda, cfg.objective.noise_permute) == (0.3, 3.0, 1.0)


def test_pretrain_bart_denoising_smoke(tmp_path, data_dir):
    """`attnlab pretrain` on the BART recipe, shrunk: a BART BPE learned on a few book openings, a tiny
    model, 30 steps; the loss falls, the result is a BART checkpoint transformers loads with equal logits."""
    import json

    from _pretrain_utils import sample_text

    from attnlab.training.pretrain import load_config, pretrain
    files = sample_text(data_dir, tmp_path / "text", chars_per_book=20_000, books=3)
    cfg = load_config(REPO / "configs" / "pretrain-bart-mini.yaml", [
        f"data.path={tmp_path / 'corpus'}", f"data.files=['{files}/*.txt']", "data.tokenizer=bart-bpe:500",
        "data.seq_len=48", "data.batch_size=8", "data.eval_batches=2", "data.heldout=0.1",
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "model.max_position_embeddings=50", "model.extra={num_decoder_layers: 1}", "model.dropout=0.0",
        "objective.noise_mask=0.1", "objective.noise_rotate=0.5",
        f"train.output_dir={tmp_path / 'run'}", "train.max_steps=30", "train.lr=3e-3", "train.warmup_steps=2",
        "train.log_every=5", "train.eval_every=30", "train.save_every=30", "train.progress=false"])
    metrics = pretrain(cfg)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses[0] > 5.9 and losses[-1] < losses[0] - 0.4, losses  # from ln(500) = 6.2, uniform guessing
    assert 0 < metrics["eval_accuracy"] <= 1 and 0 < metrics["eval_loss"] < 6.0  # held-out reconstruction beats uniform
    model = attnlab.load(tmp_path / "run" / "model")
    assert type(model) is Seq2SeqLM and model.config.model_type == "bart"
    tok = attnlab.load_tokenizer(tmp_path / "run" / "model")
    assert tok.mask_token_id == tok.vocab_size - 1 and (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id) == (0, 1, 2)
    hf = transformers.BartForConditionalGeneration.from_pretrained(tmp_path / "run" / "model").eval()
    ids = torch.tensor([tok.encode("The <mask> of the house.")])
    with torch.no_grad():
        a = model(input_ids=ids, decoder_input_ids=ids).logits
        b = hf(input_ids=ids, decoder_input_ids=ids).logits
    assert (a - b).abs().max() <= 1e-5


def test_denoise_objective_errors_name_the_problem(tmp_path):
    from attnlab.objectives import ObjectiveConfig, build_objective
    from attnlab.tokenizers import train_tokenizer
    from attnlab.training.pretrain import DataConfig, ensure_corpus, load_config
    wordpiece = train_tokenizer("wordpiece", [REPO / "README.md"], 300)
    with pytest.raises(ValueError, match="denoise needs bos, eos tokens"):
        build_objective(ObjectiveConfig(kind="denoise"), wordpiece, 64)
    with pytest.raises(ConfigError, match="noise_infill"):
        load_config(None, ["objective.kind=denoise", "objective.noise_infill=0.8", "objective.noise_mask=0.3"])
    with pytest.raises(ConfigError, match="bart-bpe:N"):
        ensure_corpus(DataConfig(path=str(tmp_path / "c"), files=[str(REPO / "README.md")], tokenizer="bart-bpe:x"))
