"""M2M-100 (issue 23): parity with transformers' M2M100ForConditionalGeneration and M2M100Model (test-only
oracles) in both directions, fairseq's sinusoids, forced target-language generation, the 418M preset's
parameter count; and multilingual training with `finetune translation --directions` (one model, both
directions, steered by the language token). Tiny shapes throughout."""
from __future__ import annotations

import json

import pytest
import torch

import attnlab
from _families import check_loads_in_transformers, check_seq2seq_parity, hf_seq2seq, load_clean, seq2seq_batch
from attnlab.config import ConfigError, preset
from attnlab.inference.seq2seq import generate
from attnlab.models.seq2seq import Seq2SeqLM
from attnlab.nn.positions import sinusoidal_table

transformers = pytest.importorskip("transformers")

V = 99


def _hf_m2m(tmp_path, name, cls="M2M100ForConditionalGeneration", emb_std=0.3, **kw):
    cfg = dict(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=40,
               encoder_layerdrop=0.0, decoder_layerdrop=0.0)
    return hf_seq2seq(getattr(transformers, cls), transformers.M2M100Config(**{**cfg, **kw}), tmp_path, name, emb_std)


def _batch():
    ids, mask, dec = seq2seq_batch(V, pad=1)  # a padded source row: fairseq's positions skip the padding
    dec[2, 5:] = 1  # padded decoder inputs take the zero position row, in transformers as here
    return ids, mask, dec


def test_fairseq_sinusoids_match_transformers():
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding as Theirs
    for dim in (32, 33):
        ref = Theirs.get_embedding(50, dim, padding_idx=1)
        mine = sinusoidal_table(50, dim, fairseq=True, padding_idx=1)
        assert mine.shape == ref.shape and torch.equal(mine, ref)
    # not the paper's table: same layout as halves=True but other frequencies
    assert not torch.allclose(sinusoidal_table(50, 32, fairseq=True), sinusoidal_table(50, 32, halves=True), atol=1e-3)


@pytest.mark.parametrize("act,dec_layers", [("relu", 2), ("gelu", 3)])
def test_m2m_logits_load_and_save(tmp_path, act, dec_layers):
    hf, path = _hf_m2m(tmp_path, act, activation_function=act, decoder_layers=dec_layers)
    ours = load_clean(path)
    assert type(ours).__name__ == "Seq2SeqLM" and len(ours.decoder.layers) == dec_layers
    assert ours.config.max_position_embeddings == 42 and ours.config.norm_placement == "pre"
    ids, mask, dec = _batch()
    labels = dec.clone()
    labels[2, 5:] = -100
    mine, _ = check_seq2seq_parity(hf, ours, tmp_path, ids, mask, dec, labels)
    assert mine.logits.std() > 1.0  # not a degenerate comparison
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["architectures"] == ["M2M100ForConditionalGeneration"] and saved["max_position_embeddings"] == 40
    assert not any(k in saved for k in ("position_offset", "sinusoid_fairseq"))


def test_m2m_bare_model_both_ways(tmp_path):
    """M2M100Model (no lm_head, no "model." prefix) loads into the same class; what attnlab saves loads as
    M2M100Model in transformers with equal hidden states."""
    hf, path = _hf_m2m(tmp_path, "bare", cls="M2M100Model")
    ours = load_clean(path)
    mine, back = check_seq2seq_parity(hf, ours, tmp_path, *_batch(), field="last_hidden_state")
    assert mine.last_hidden_state.std() > 0.5 and type(back).__name__ == "M2M100Model"


def test_m2m_from_scratch_saves_for_transformers(tmp_path):
    cfg = preset("m2m100_418M", vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48,
                 max_position_embeddings=34, extra={**preset("m2m100_418M").extra, "num_decoder_layers": 1})
    torch.manual_seed(0)
    ours = Seq2SeqLM(cfg).eval()
    back = check_loads_in_transformers(ours, transformers.M2M100ForConditionalGeneration, tmp_path, *_batch())
    assert back.config.decoder_layers == 1 and back.config.scale_embedding is True
    bad = Seq2SeqLM(cfg.replace(extra={**cfg.extra, "sinusoid_fairseq": False}))
    with pytest.raises(ConfigError, match="sinusoid_fairseq"):
        attnlab.interop.hf.save_pretrained(bad, tmp_path / "bad")


def test_m2m_generation_with_forced_language_matches(tmp_path):
    hf, path = _hf_m2m(tmp_path, "gen", emb_std=0.05)
    ours = attnlab.load(path)
    ids, mask, _ = _batch()
    ids[:, 0] = 7  # the source language token
    for forced in (None, 5):
        theirs = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, num_beams=1,
                             min_length=0, forced_bos_token_id=forced, no_repeat_ngram_size=0)
        mine = generate(ours, ids, mask, max_new_tokens=10, forced_bos_token_id=forced)
        assert mine.tolist() == theirs.tolist(), f"forced_bos_token_id={forced}"
    assert (mine[:, 1] == 5).all() and len(set(mine[:, 2:].flatten().tolist())) >= 3


def test_m2m100_418M_preset_has_transformers_parameter_count(capsys):
    from attnlab.cli import main
    with torch.device("meta"):
        hf = transformers.M2M100ForConditionalGeneration(transformers.M2M100Config())  # the 418M defaults
        ours = Seq2SeqLM(preset("m2m100_418M"))
    assert ours.num_parameters() == hf.num_parameters() == 483_905_536  # "418M" counts without the embedding
    assert main(["info", "m2m100_418M"]) in (0, None)
    assert f"parameters: {hf.num_parameters():,}" in capsys.readouterr().out


# ----------------------------------------------------------------------------------- multilingual training
def test_directions_train_one_model_steered_by_the_language_token(tmp_path, capsys):
    """A tiny two-way model on a toy language pair (German = the English words upper-cased): the target
    language token alone decides the case of what the one decoder writes for the same source."""
    from attnlab.tasks.translation import finetune_translation, load_translator, translate
    words = "abcdef"
    en = [" ".join(words[(i * k + i // 6) % 6] for k in range(1, 4)) for i in range(48)]
    for name, lines in (("t.en", en), ("t.de", [x.upper() for x in en])):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    f = {k: tmp_path / f"t.{k}" for k in ("en", "de")}
    summary = finetune_translation(f["en"], f["de"], f["en"], f["de"], tmp_path / "m", src_lang="en", tgt_lang="de",
                                   directions="en-de,de-en", overrides=dict(hidden_size=32, num_layers=1, num_heads=2,
                                                                            intermediate_size=64, dropout=0.0),
                                   vocab_size=40, max_tokens=300, max_steps=60, warmup=10, lr_factor=1.0,
                                   eval_every=60, max_eval_sentences=4, progress=False, threads=1)
    assert summary["directions"] == ["en-de", "de-en"] and set(summary["best"]) >= {"bleu_en-de", "bleu_de-en"}
    model, tok = load_translator(tmp_path / "m")
    assert model.config.extra["languages"] == ["en", "de"] and model.config.extra["directions"] == ["en-de", "de-en"]
    src = ["a b c", "c d e", "f a b"]
    to_de = translate(model, tok, src, src_lang="en", tgt_lang="de")
    to_en = translate(model, tok, [s.upper() for s in src], tgt_lang="en")  # source language: the other one
    # the same English source, forced into English by its token, stays lower-case: the token steers
    same = translate(model, tok, src, src_lang="en", tgt_lang="en")
    assert all(t.strip() and t == t.upper() for t in to_de), to_de
    assert all(t.strip() and t == t.lower() for t in to_en + same), (to_en, same)
    with pytest.raises(ValueError, match="name the target language"):
        translate(model, tok, src)
    with pytest.raises(ValueError, match="'fr' is not one of the model's languages"):
        translate(model, tok, src, tgt_lang="fr")
    # the CLI: translate / evaluate per direction; a missing or unknown language is one line, status 2
    from attnlab.cli import main
    m, hyp = str(tmp_path / "m"), str(tmp_path / "hyp.en")
    assert main(["translate", m, "--input", str(f["de"]), "--output", hyp, "--target-lang", "en",
                 "--num-beams", "2"]) == 0
    assert (tmp_path / "hyp.en").read_text() == (tmp_path / "hyp.en").read_text().lower()
    capsys.readouterr()
    assert main(["evaluate", "translation", "--model", m, "--source", str(f["de"]), "--reference", str(f["en"]),
                 "--target-lang", "en", "--num-beams", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["direction"] == "de-en"
    for argv in ([], ["--target-lang", "fr"]):
        assert main(["translate", m, "--input", str(f["de"]), "--output", hyp, *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and ("name the target language" in err or "'fr'" in err), err


@pytest.mark.parametrize("directions,message", [
    ("en-fr", "'en-fr': expected SRC-TGT"), ("en-en", "'en-en': expected"), ("ende", "'ende': expected"),
    ("en-de,en-de", "'en-de': listed twice"), ("de-de", "'de-de': expected")])
def test_bad_directions_give_one_clear_line(tmp_path, capsys, directions, message):
    from attnlab.cli import main
    from attnlab.tasks.translation import parse_directions
    with pytest.raises(ValueError, match=message):
        parse_directions(directions, "en", "de")
    (tmp_path / "a.en").write_text("a b\n")
    (tmp_path / "a.de").write_text("A B\n")
    a = [str(tmp_path / n) for n in ("a.en", "a.de")]
    code = main(["finetune", "translation", "--src-lang", "en", "--tgt-lang", "de", "--directions", directions,
                 "--train-src", a[0], "--train-tgt", a[1], "--valid-src", a[0], "--valid-tgt", a[1],
                 "--output", str(tmp_path / "out"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message.split(":")[0] in err and not (tmp_path / "out").exists()
