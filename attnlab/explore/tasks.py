"""What an encoder or an encoder-decoder answers besides attention: the masked-token guesses of an MLM
head (/api/fill_mask), the cosine of two sentence vectors (/api/similarity, pooled the way a
sentence-transformers checkpoint was trained), and a translation whose cross-attention the page shows
per generated target token (/api/translate, /api/cross).
"""
from __future__ import annotations

import time
import uuid

import torch

from ..inference.embed import embed
from .session import ExploreError, Explorer, Run, rounded

MASK_SPELLINGS = ("[MASK]", "<mask>")
MAX_TRANSLATE = 64


def fills_masks(ex: Explorer) -> bool:
    """An encoder with a masked-LM head (BertForMaskedLM, RobertaForMaskedLM, ...) and a mask token."""
    return ex.kind == "encoder" and getattr(ex.model, "mlm", None) is not None and \
        ex.tokenizer.mask_token_id is not None


def mask_token(ex: Explorer) -> str | None:
    return ex.tokenizer.special_tokens.get("mask_token") if ex.tokenizer.mask_token_id is not None else None


def fill_mask(ex: Explorer, text: str, top: int = 10) -> dict:
    if not fills_masks(ex):
        raise ExploreError(400, f"{ex.name} has no masked-LM head: fill-mask needs an MLM checkpoint "
                                "(e.g. BertForMaskedLM)")
    if not isinstance(top, int) or not 1 <= top <= 100:
        raise ExploreError(422, f"top: must be an integer in 1..100, got {top}")
    if not isinstance(text, str) or not text.strip():
        raise ExploreError(400, "text: empty; write a sentence with a mask token in it")
    own = mask_token(ex)
    for spelling in MASK_SPELLINGS:  # either common spelling means the model's own mask token
        text = text.replace(spelling, own)
    ids, _ = ex.encode(text)
    ex.check_length(ids.size(1))
    positions = (ids[0] == ex.tokenizer.mask_token_id).nonzero().flatten().tolist()
    if not positions:
        raise ExploreError(400, f"text: no mask token; write {own} (or [MASK] / <mask>) where a word is missing")
    with ex.lock, torch.inference_mode():
        logits = ex.model(input_ids=ids).logits[0].float()
    masks = []
    for pos in positions:
        probs = logits[pos].softmax(-1)
        values, top_ids = torch.topk(probs, min(top, probs.numel()))
        masks.append({"position": pos, "top": [{"id": int(i), "piece": ex.piece(int(i)), "prob": rounded(p)}
                                               for p, i in zip(values, top_ids)]})
    return {"tokens": ex.token_list(ids[0].tolist()), "masks": masks}


def similarity(ex: Explorer, a: str, b: str) -> dict:
    """cos(a, b) of the sentence vectors `attnlab embed` gives with the checkpoint's pooling (mean
    when the checkpoint names none)."""
    if ex.kind != "encoder":
        raise ExploreError(400, f"{ex.name} is an {ex.kind}: sentence similarity needs an encoder")
    for name, text in (("a", a), ("b", b)):
        if not isinstance(text, str) or not text.strip():
            raise ExploreError(400, f"{name}: empty; give two sentences")
        ex.check_length(len(ex.tokenizer.encode(text)), name)
    pooling = ex.pooling or "mean"
    with ex.lock:
        vectors = torch.from_numpy(embed(ex.model, ex.tokenizer, [a, b], pooling=pooling, normalize=True))
    return {"cosine": rounded(float(vectors[0] @ vectors[1])), "pooling": pooling, "dim": int(vectors.size(1))}


def translate(ex: Explorer, text: str, max_new_tokens: int = 32, target: str | None = None) -> dict:
    """Greedy generation (or the given `target`, teacher-forced), then one forward pass with the weights:
    the decoder's causal self-attention, its cross-attention over the source, the encoder's attention."""
    if ex.kind != "encoder-decoder":
        raise ExploreError(400, f"{ex.name} is an {ex.kind}: translation needs an encoder-decoder (T5, BART, ...)")
    if not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= MAX_TRANSLATE:
        raise ExploreError(422, f"max_new_tokens: must be an integer in 1..{MAX_TRANSLATE}, got {max_new_tokens}")
    src, _ = ex.encode(text)
    ex.check_length(src.size(1))
    model = ex.model
    with ex.lock, torch.inference_mode():
        start = time.perf_counter()
        if target:
            tgt = ex.tokenizer(target, return_tensors="pt")["input_ids"]
            ex.check_length(tgt.size(1), "target")
            dec = torch.cat([torch.tensor([[model.decoder_start_token_id]]), tgt], dim=1)
        else:
            from ..inference.seq2seq import generate
            dec = generate(model, src, max_new_tokens=max_new_tokens)
        out = model(input_ids=src, decoder_input_ids=dec, output_attentions=True)
        stacks = {"decoder": [w[0].float() for w in out.attentions],
                  "cross": [w[0].float() for w in out.cross_attentions],
                  "encoder": [w[0].float() for w in out.extra["encoder_attentions"]]}
        ms = (time.perf_counter() - start) * 1e3
        run = Run(uuid.uuid4().hex[:12], src, None, [ex.piece(i) for i in src[0].tolist()], None, None,
                  stacks=stacks, model=model.encoder)
        ex._keep(run)
    return {"run": run.id, "source": ex.token_list(src[0].tolist()), "target": ex.token_list(dec[0].tolist()),
            "num_layers": len(stacks["decoder"]), "num_heads": stacks["decoder"][0].size(0), "ms": round(ms, 3)}
