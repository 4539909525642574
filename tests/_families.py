"""Shared steps of the BERT-family parity tests (issue 9): random HF model -> save -> attnlab load ->
compare on padded inputs -> attnlab save -> transformers load -> compare again."""
from __future__ import annotations

import warnings

import torch

import attnlab


def randomize(model: torch.nn.Module, std: float = 0.05) -> torch.nn.Module:
    """HF initialises norms to ones/zeros and biases to zero; perturb every parameter so that a row mapping
    one norm or bias onto another cannot hide."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


def padded_inputs(vocab: int, pad: int, batch: int = 3, seq: int = 11, low: int = 3, left_pad_row: bool = False):
    """Random ids with padding: row 1 right-padded from 7, row 2 from 4 (optionally left-padded instead)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(low, vocab, (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    if left_pad_row:
        mask[2, : seq - 4] = 0
    else:
        mask[2, 4:] = 0
    ids[mask == 0] = pad
    return ids, mask


def max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest difference over real tokens (padded positions are left out by the unpadded encoder)."""
    if a.shape[:2] != mask.shape:  # one vector per sequence (pooled output, SOP logits)
        return (a - b).abs().max().item()
    return (a - b)[mask.bool()].abs().max().item()


def roundtrip(hf_model, tmp_path, ours_key: str, hf_key: str, inputs: dict, mask: torch.Tensor,
              architecture: str | None = None) -> tuple[float, float, object]:
    """Returns (diff attnlab vs transformers, diff transformers-reloaded vs transformers, our model)."""
    src, back = tmp_path / "hf", tmp_path / "ours"
    hf_model.save_pretrained(src)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean load: no missing or unused tensors
        ours = attnlab.load(src, architecture=architecture)
    with torch.no_grad():
        want = getattr(hf_model(**inputs), hf_key)
        got = getattr(ours(**inputs), ours_key)
    ours.save(back)
    again, info = type(hf_model).from_pretrained(back, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        reloaded = getattr(again.eval()(**inputs), hf_key)
    return max_diff(got, want, mask), max_diff(reloaded, want, mask), ours


def check_seq2seq_attentions(hf, ours, ids: torch.Tensor, mask: torch.Tensor, dec: torch.Tensor, layers: int,
                             heads: int) -> None:
    """Decoder self-attention and cross-attention weights of an encoder-decoder equal transformers' (an
    eager-attention HF model), layer by layer, padded source included."""
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, output_attentions=True)
        mine = ours(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, output_attentions=True)
    assert len(mine.cross_attentions) == len(theirs.cross_attentions) == layers
    for a, b in zip(mine.cross_attentions, theirs.cross_attentions):
        assert a.shape == (ids.size(0), heads, dec.size(1), ids.size(1)) and (a - b).abs().max() <= 1e-5
    for a, b in zip(mine.attentions, theirs.decoder_attentions):
        assert (a - b).abs().max() <= 1e-5


def check_seq2seq_parity(hf, ours, tmp_path, ids: torch.Tensor, mask: torch.Tensor, dec: torch.Tensor,
                         labels: torch.Tensor | None = None, field: str = "logits"):
    """An encoder-decoder equals transformers' `hf` on `field` (logits, or last_hidden_state of a bare
    model), on the encoder's real tokens and on the loss of `labels`; attnlab's save loads in transformers'
    class with the same `field`. Returns (our output, the reloaded transformers model)."""
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec)
        mine = ours(input_ids=ids, attention_mask=mask, decoder_input_ids=dec)
        assert (getattr(theirs, field) - getattr(mine, field)).abs().max() <= 1e-5
        real = mask.bool()  # the unpadded encoder leaves padded positions at zero; compare real tokens
        assert (theirs.encoder_last_hidden_state[real] - mine.encoder_last_hidden_state[real]).abs().max() <= 1e-5
        if labels is not None:
            loss_t = hf(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss_m = ours(input_ids=ids, attention_mask=mask, labels=labels).loss
            assert abs(loss_t.item() - loss_m.item()) <= 1e-5
    ours.save(tmp_path / "ours")
    back = type(hf).from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        again = getattr(back(input_ids=ids, attention_mask=mask, decoder_input_ids=dec), field)
    assert (again - getattr(mine, field)).abs().max() <= 1e-5
    return mine, back


def hf_seq2seq(cls, config, tmp_path, name: str, emb_std: float = 0.3):
    """A random transformers encoder-decoder with wider weights than the default init, so that generations
    are not degenerate (LayerNorm weights near 1 would make every output alike; a random model with tied
    embeddings tends to repeat its input token, which a smaller embedding loosens), saved to tmp_path/name."""
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            p.normal_(0, 0.3) if p.dim() > 1 else p.uniform_(0.5, 1.5) if key.endswith("weight") else p.normal_(0, 0.1)
        model.get_input_embeddings().weight.normal_(0, emb_std)
    model.save_pretrained(tmp_path / name)
    return model, tmp_path / name


def seq2seq_batch(vocab: int, pad: int, low: int = 3):
    """Source ids (3, 13) with row 1 padded after 9 tokens, its mask, and decoder inputs (3, 7)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(low, vocab, (3, 13), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    ids[1, 9:] = pad
    return ids, mask, torch.randint(low, vocab, (3, 7), generator=g)


def load_clean(path):
    """attnlab.load that fails on any missing or unused tensor warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return attnlab.load(path)


def check_loads_in_transformers(ours, cls, tmp_path, ids: torch.Tensor, mask: torch.Tensor, dec: torch.Tensor):
    """An encoder-decoder attnlab built saves to a directory transformers' `cls` loads with equal logits."""
    ours.eval().save(tmp_path / "m")
    back = cls.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        b = back(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    assert (a - b).abs().max() <= 1e-5
    return back
