"""BART (issue 23): parity with transformers' BartForConditionalGeneration (the test-only oracle) in both
directions, cached decoding, the byte-level BPE tokenizer's special tokens, the five noising functions of
the paper with their statistics on WikiText-2, and the pretraining path. Tiny shapes throughout."""
from __future__ import annotations

import warnings

import pytest
import torch

import attnlab
from attnlab.config import ConfigError, preset
from attnlab.inference.kv_cache import KVCache
from attnlab.inference.seq2seq import generate
from attnlab.models.seq2seq import CrossKVCache, Seq2SeqLM

transformers = pytest.importorskip("transformers")

V = 99


def _hf_bart(tmp_path, name, emb_std=0.3, **kw):
    cfg = dict(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=40)
    cfg.update(kw)
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(transformers.BartConfig(**cfg)).eval()
    with torch.no_grad():  # wider weights than the default init, so that generations are not degenerate
        for key, p in model.named_parameters():  # (LayerNorm biases near 1 would make every output alike)
            p.normal_(0, 0.3) if p.dim() > 1 else p.uniform_(0.5, 1.5) if key.endswith("weight") else p.normal_(0, 0.1)
        # a random model with tied embeddings tends to repeat its input token; a smaller embedding loosens that
        model.model.shared.weight.normal_(0, emb_std)
        model.final_logits_bias.normal_(0, 0.2)  # a zero bias would not test that it is applied
    path = tmp_path / name
    model.save_pretrained(path)
    return model, path


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, V, (3, 13), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # a padded source row (BART's positions do not depend on the padding)
    ids[1, 9:] = 1
    dec = torch.randint(3, V, (3, 7), generator=g)
    return ids, mask, dec


@pytest.mark.parametrize("scale,act,dec_layers", [(False, "gelu", 3), (True, "relu", 2)])
def test_bart_logits_load_and_save(tmp_path, scale, act, dec_layers):
    hf, path = _hf_bart(tmp_path, f"{scale}-{act}", scale_embedding=scale, activation_function=act,
                        decoder_layers=dec_layers)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no missing / unused tensors
        ours = attnlab.load(path)
    assert type(ours).__name__ == "Seq2SeqLM" and len(ours.decoder.layers) == dec_layers
    assert ours.config.scale_embeddings is scale and ours.config.max_position_embeddings == 42  # 40 + offset 2
    ids, mask, dec = _batch()
    labels = dec.clone()
    labels[2, 5:] = -100
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec)
        mine = ours(input_ids=ids, attention_mask=mask, decoder_input_ids=dec)
        assert mine.logits.std() > 1.0  # not a degenerate comparison
        assert (theirs.logits - mine.logits).abs().max() <= 1e-5
        real = mask.bool()
        assert (theirs.encoder_last_hidden_state[real] - mine.encoder_last_hidden_state[real]).abs().max() <= 1e-5
        # labels -> decoder inputs shifted right from decoder_start_token_id = </s> = 2, as HF's shift_tokens_right
        loss_t = hf(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss_m = ours(input_ids=ids, attention_mask=mask, labels=labels).loss
        assert abs(loss_t.item() - loss_m.item()) <= 1e-5
    ours.save(tmp_path / "ours")
    back = transformers.BartForConditionalGeneration.from_pretrained(tmp_path / "ours").eval()
    assert back.config.max_position_embeddings == 40 and back.config.decoder_layers == dec_layers
    with torch.no_grad():
        again = back(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    assert (again - mine.logits).abs().max() <= 1e-5
    assert torch.equal(back.final_logits_bias, hf.final_logits_bias)


def test_bart_from_scratch_saves_for_transformers(tmp_path):
    """A model attnlab built (random init, preset shape shrunk) loads in transformers with equal logits."""
    cfg = preset("bart-base", vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48,
                 max_position_embeddings=34, extra={**preset("bart-base").extra, "num_decoder_layers": 1})
    torch.manual_seed(0)
    ours = Seq2SeqLM(cfg).eval()
    with torch.no_grad():
        ours.final_logits_bias.normal_()
    ours.save(tmp_path / "m")
    back = transformers.BartForConditionalGeneration.from_pretrained(tmp_path / "m").eval()
    ids, mask, dec = _batch()
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        b = back(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    assert (a - b).abs().max() <= 1e-5
    assert back.config.decoder_start_token_id == 2 and back.config.pad_token_id == 1


def test_bart_generation_and_cache(tmp_path):
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
    # cached decoding (self-attention K/V cached, cross K/V projected once) equals one full pass
    with torch.no_grad():
        full = ours(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        memory = ours.encode(ids, mask).last_hidden_state
        cache, cross = KVCache(2), CrossKVCache(2)
        steps = [ours.decode(dec[:, t:t + 1], memory, mask, past_key_values=cache, cross_cache=cross).logits
                 for t in range(dec.size(1))]
    assert (torch.cat(steps, 1) - full).abs().max() <= 1e-5


def test_bart_base_parameters_and_info(capsys):
    from attnlab.cli import main
    with torch.device("meta"):
        hf = transformers.BartForConditionalGeneration(transformers.BartConfig(
            d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12, decoder_attention_heads=12,
            encoder_ffn_dim=3072, decoder_ffn_dim=3072))
    assert main(["info", "bart-base"]) in (0, None)
    out = capsys.readouterr().out
    assert f"parameters: {hf.num_parameters():,}" in out and "model_type=bart" in out  # 139,420,416


def test_bart_config_errors(tmp_path):
    import json
    _, path = _hf_bart(tmp_path, "bad")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "decoder_ffn_dim": 64}))
    with pytest.raises(ConfigError, match="decoder_ffn_dim=64 differs from encoder_ffn_dim=48"):
        attnlab.load(path)
    pre = Seq2SeqLM(preset("bart-base", vocab_size=V, hidden_size=32, num_layers=1, num_heads=4,
                           intermediate_size=48, norm_placement="pre"))
    with pytest.raises(ConfigError, match="norm_placement"):
        attnlab.save(pre, tmp_path / "pre", layout="hf")
