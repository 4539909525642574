"""GET /api/model: what the model is, what the page can show for it, and "explain a number": parameter
counts and FLOPs per token with the formulas `attnlab info --explain` prints (viz/explain.py,
viz/walkthrough.py), counted on a weightless copy of the model (a GGUF kept quantized holds its matrices
as blocks, which are not parameters; the copy on the meta device counts them as the architecture has them).
"""
from __future__ import annotations

from ..viz.explain import build_on_meta, count, human
from ..viz.walkthrough import explain_model

SEQ_LEN = 128  # the sequence length FLOPs per token are quoted at (attention grows with it)


def _item(id_: str, label: str, value: float, formula: str, detail: str) -> dict:
    return {"id": id_, "label": label, "value": value, "pretty": human(value).strip(), "formula": formula,
            "detail": detail}


def _attention_formula(cfg) -> str:
    d, h, hk, dh = cfg.hidden_size, cfg.num_heads, cfg.kv_heads, cfg.dim_head
    bias = cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias
    if h == hk and h * dh == d:
        return ("4 x d^2 + 4 x d = 4 x {0}^2 + 4 x {0}" if bias and cfg.bias else "4 x d^2 = 4 x {0}^2").format(d)
    terms = f"d x (h + 2 x h_kv) x d_k + h x d_k x d = {d} x ({h} + 2 x {hk}) x {dh} + {h} x {dh} x {d}"
    return terms + (f" + biases ({(h + 2 * hk) * dh} + {d})" if bias else "")


def _mlp_formula(cfg) -> str:
    d, ff = cfg.hidden_size, cfg.intermediate_size
    if cfg.is_glu:
        return f"3 x d x d_ff = 3 x {d} x {ff} ({cfg.activation}: gate, up, down)"
    return (f"2 x d x d_ff + d_ff + d = 2 x {d} x {ff} + {ff} + {d}" if cfg.bias
            else f"2 x d x d_ff = 2 x {d} x {ff}")


def explain_items(model) -> list[dict]:
    skeleton = build_on_meta(type(model), model.config)
    ex = explain_model(skeleton, SEQ_LEN)
    cfg = model.config
    stacks = [skeleton.encoder, skeleton.decoder] if ex.kinds and hasattr(skeleton, "decoder") and \
        hasattr(skeleton, "encoder") else [getattr(skeleton, "backbone", skeleton)]
    first = stacks[0].layers[0]
    emb = stacks[0].embeddings
    parts = [f"{m.num_embeddings} x {m.embedding_dim} {what}" for what, m in
             (("tokens", getattr(emb, "tok", None)), ("positions", getattr(emb, "pos", None)),
              ("segments", getattr(emb, "seg", None))) if m is not None and hasattr(m, "num_embeddings")]
    if getattr(emb, "norm", None) is not None:
        parts.append(f"norm {count(emb.norm)}")
    layers = sum(len(s.layers) for s in stacks)
    per_layer = count(first)
    norms = count(first.attn_norm) + count(first.ffn_norm) + count(getattr(first, "cross_norm", None))
    cross = count(getattr(first, "cross_attn", None))
    items = [
        _item("params_total", "parameters", ex.total_params,
              f"embeddings + layers + other = {ex.embedding_params:,} + {ex.layer_params:,} + {ex.other_params:,}",
              f"{layers} layers; 'other' is the final norm, pooler and heads not tied to the embeddings"),
        _item("params_embeddings", "embedding parameters", ex.embedding_params,
              " + ".join(parts) if parts else "token embedding table",
              "one row of d numbers per vocabulary entry (and per position / segment where the model learns them)"),
        _item("params_per_layer", "parameters per layer", per_layer,
              f"attention + MLP + norms{' + cross-attention' if cross else ''} = {count(first.attn):,} + "
              f"{count(first.ffn):,} + {norms:,}" + (f" + {cross:,}" if cross else ""),
              f"every one of the {len(stacks[0].layers)} layers of the first stack has this many"),
        _item("params_attention", "attention parameters per layer", count(first.attn), _attention_formula(cfg),
              f"W_Q, W_K, W_V and W_O: {cfg.num_heads} heads of d_k={cfg.dim_head}"
              + (f", {cfg.kv_heads} key/value heads" if cfg.kv_heads != cfg.num_heads else "")),
        _item("params_mlp", "MLP parameters per layer", count(first.ffn), _mlp_formula(cfg),
              f"d={cfg.hidden_size} -> d_ff={cfg.intermediate_size} -> d"),
        _item("flops_per_token", f"forward FLOPs per token ({SEQ_LEN}-token sequence)", ex.forward_flops / SEQ_LEN,
              " + ".join(f"{len(k.layers)} x {human(k.flops)}F" for k in ex.kinds)
              + (f" + head {human(ex.head_flops)}F" if ex.head_flops else "") + f", / {SEQ_LEN} tokens",
              "a matmul (m x k)@(k x n) costs 2 m k n FLOPs; about 2 x non-embedding parameters per token, "
              "plus attention, which grows with the sequence"),
    ]
    return items


def model_info(ex) -> dict:
    """The answer of GET /api/model for an `Explorer` (built once: counting builds a copy of the model)."""
    if getattr(ex, "info", None) is None:
        ex.info = _model_info(ex)
    return ex.info


def _model_info(ex) -> dict:
    from .tasks import fills_masks, mask_token
    model, cfg = ex.model, ex.stack.config
    arch = getattr(model, "hf_architecture", None) or type(model).__name__
    return {"name": ex.name, "kind": ex.kind, "family": model.config.model_type, "architecture": arch,
            "num_layers": cfg.num_layers, "num_heads": cfg.num_heads, "num_kv_heads": cfg.kv_heads,
            "head_dim": cfg.dim_head, "hidden_size": cfg.hidden_size, "vocab_size": model.config.vocab_size,
            "max_tokens": ex.max_tokens, "quantized": ex.quantized,
            "features": {"attention": True, "next_token": ex.kind == "decoder", "fill_mask": fills_masks(ex),
                         "similarity": ex.kind == "encoder" and (ex.pooling is not None or not fills_masks(ex)), "cross_attention": ex.kind == "encoder-decoder"},
            "mask_token": mask_token(ex) if fills_masks(ex) else None,
            "attention_kind": ex.attention_kind(), "explain": explain_items(model)}
