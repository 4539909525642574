"""The pre-Transformer baseline: RNN encoder-decoder without attention, with additive (Bahdanau) and
dot/general (Luong) attention, GRU or LSTM — cached decoding equals full decoding, padding changes
nothing, the no-attention decoder sees the source only through its fixed-size initial state, and the
translation commands train, translate, evaluate and draw it."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.config import ConfigError, preset
from attnlab.inference.kv_cache import KVCache
from attnlab.inference.seq2seq import generate
from attnlab.models.rnn import RNNSeq2Seq

DATA = Path(__file__).resolve().parents[1] / "examples" / "data"


def tiny(attention: str, cell: str = "gru", layers: int = 2) -> RNNSeq2Seq:
    torch.manual_seed(0)
    cfg = preset("rnn-attention", vocab_size=40, hidden_size=16, num_layers=layers, dropout=0.0)
    return RNNSeq2Seq(cfg.replace(extra={**cfg.extra, "attention": attention, "cell": cell})).eval()


@pytest.mark.parametrize("attention", ["none", "additive", "dot", "general"])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_cached_decoding_equals_full_decoding(attention, cell):
    m = tiny(attention, cell)
    src = torch.randint(3, 40, (2, 6))
    tgt = torch.randint(3, 40, (2, 5))
    memory = m.encode(src).last_hidden_state
    dec = m.shift_right(tgt)
    full = m.decode(dec, memory).logits
    cache = KVCache(m.config.num_layers)
    steps = torch.cat([m.decode(dec[:, t:t + 1], memory, past_key_values=cache).logits for t in range(5)], 1)
    assert torch.allclose(full, steps, atol=1e-6)


@pytest.mark.parametrize("attention", ["none", "additive", "general"])
def test_padding_changes_nothing(attention):
    m = tiny(attention)
    a, b = torch.randint(3, 40, (1, 7)), torch.randint(3, 40, (1, 4))
    batch = torch.zeros(2, 7, dtype=torch.long)
    batch[0], batch[1, :4] = a[0], b[0]
    mask = (batch != 0).long()
    tgt = torch.randint(3, 40, (2, 5))
    together = m(input_ids=batch, attention_mask=mask, labels=tgt).logits
    alone = m(input_ids=b, labels=tgt[1:]).logits
    assert torch.allclose(together[1:], alone, atol=1e-5)


def test_without_attention_the_source_reaches_the_decoder_only_through_one_vector():
    m = tiny("none", layers=1)
    src = torch.randint(3, 40, (1, 8))
    memory = m.encode(src).last_hidden_state
    dec = torch.randint(3, 40, (1, 4))
    changed = memory.clone()
    changed[:, 1:-1] = torch.randn_like(changed[:, 1:-1])  # everything but the two final states
    assert torch.equal(m.decode(dec, memory).logits, m.decode(dec, changed).logits)
    with_att = tiny("additive", layers=1)
    memory = with_att.encode(src).last_hidden_state
    changed = memory.clone()
    changed[:, 1:-1] += 1.0
    assert not torch.allclose(with_att.decode(dec, memory).logits, with_att.decode(dec, changed).logits)


def test_attention_weights_are_distributions_that_skip_padding():
    m = tiny("additive")
    src = torch.tensor([[5, 6, 7, 0, 0]])
    out = m(input_ids=src, attention_mask=(src != 0).long(), decoder_input_ids=torch.tensor([[2, 9, 10]]),
            output_attentions=True)
    w = out.cross_attentions[0][0, 0]
    assert w.shape == (3, 5) and torch.allclose(w.sum(-1), torch.ones(3)) and float(w[:, 3:].detach().abs().max()) == 0


def test_beam_search_and_save_load_round_trip(tmp_path):
    m = tiny("general", "lstm")
    src = torch.randint(3, 40, (2, 6))
    greedy = generate(m, src, max_new_tokens=6)
    beams = generate(m, src, max_new_tokens=6, num_beams=3)
    assert greedy.shape[0] == beams.shape[0] == 2
    attnlab.save(m, tmp_path / "rnn")
    back = attnlab.load(tmp_path / "rnn")
    assert type(back).__name__ == "RNNSeq2Seq" and torch.equal(generate(back, src, max_new_tokens=6), greedy)


def test_bad_switch_names_the_field():
    cfg = preset("rnn")
    with pytest.raises(ConfigError, match="extra.attention='luong'"):
        RNNSeq2Seq(cfg.replace(extra={**cfg.extra, "attention": "luong"}))


def test_translation_commands_train_translate_evaluate_and_draw_it(tmp_path, capsys):
    out = tmp_path / "rnn"
    assert main(["finetune", "translation", "--model", "rnn-attention", "--src-lang", "en", "--tgt-lang", "de",
                 "--train-src", str(DATA / "parallel-train.en"), "--train-tgt", str(DATA / "parallel-train.de"),
                 "--valid-src", str(DATA / "parallel-valid.en"), "--valid-tgt", str(DATA / "parallel-valid.de"),
                 "--output", str(out), "--set", "hidden_size=32", "--vocab-size", "200", "--epochs", "1", "--max-tokens", "1024",
                 "--warmup", "10", "--no-progress"]) == 0
    assert main(["evaluate", "translation", "--model", str(out), "--source", str(DATA / "parallel-valid.en"),
                 "--reference", str(DATA / "parallel-valid.de"), "--num-beams", "2"]) == 0
    assert '"bleu"' in capsys.readouterr().out
    assert main(["viz", str(out), "--text", "A dog runs.", "--output", str(tmp_path / "align.html")]) == 0
    png = (tmp_path / "align.png").read_bytes()
    assert png[:4] == b"\x89PNG"
