"""T5 parity with transformers (the oracle): a random-init T5ForConditionalGeneration loads via
attnlab.load with equal logits and equal greedy/beam generations, and attnlab's save loads back into
transformers with equal logits. Tiny shapes; weights re-drawn so that generations are not degenerate."""
from __future__ import annotations

import warnings

import pytest
import torch

import attnlab
from _families import check_seq2seq_attentions, check_seq2seq_parity
from attnlab.inference.seq2seq import generate

transformers = pytest.importorskip("transformers")


def _hf_t5(tmp_path, name, **kw):
    cfg = dict(vocab_size=97, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
               relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0)
    cfg.update(kw)
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**cfg)).eval()
    with torch.no_grad():  # the default init (shared ~ N(0, 1)) makes greedy output one token forever
        for p in model.parameters():
            p.normal_(0, 0.3) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    path = tmp_path / name
    model.save_pretrained(path)
    return model, path


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 97, (3, 13), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # a padded source row
    dec = torch.randint(2, 97, (3, 7), generator=g)
    return ids, mask, dec


@pytest.mark.parametrize("proj,dec_layers", [("relu", 3), ("gated-gelu", 2)])
def test_t5_logits_load_and_save(tmp_path, proj, dec_layers):
    hf, path = _hf_t5(tmp_path, proj, feed_forward_proj=proj, num_decoder_layers=dec_layers)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no missing / unused tensors
        ours = attnlab.load(path)
    assert type(ours).__name__ == "Seq2SeqLM" and len(ours.decoder.layers) == dec_layers
    ids, mask, dec = _batch()
    labels = dec.clone()
    labels[2, 5:] = -100
    check_seq2seq_parity(hf, ours, tmp_path, ids, mask, dec, labels)


def test_t5_generation_matches(tmp_path):
    hf, path = _hf_t5(tmp_path, "gen")  # equal layer counts: transformers' generation cache assumes it
    ours = attnlab.load(path)
    ids, mask, _ = _batch()
    for beams in (1, 3):
        theirs = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, num_beams=beams)
        mine = generate(ours, ids, mask, max_new_tokens=10, num_beams=beams)
        assert mine.tolist() == theirs.tolist(), f"num_beams={beams}"
    assert len(set(mine[:, 1:].flatten().tolist())) > 3  # not degenerate


def test_t5_cross_attentions_match(tmp_path):
    _, path = _hf_t5(tmp_path, "attn")
    hf = transformers.T5ForConditionalGeneration.from_pretrained(path, attn_implementation="eager").eval()
    ours = attnlab.load(path)
    check_seq2seq_attentions(hf, ours, *_batch(), layers=2, heads=4)
