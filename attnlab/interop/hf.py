"""The Hugging Face layout in and out: config.json <-> ModelConfig through the family's mapping, weights
through its name tables (interop/names.py), files read and written by interop/files.py.

    model = load_pretrained("path/to/bert")        # the class config.json's `architectures` names
    save_pretrained(model, "out")                  # transformers' from_pretrained("out") loads it
"""
from __future__ import annotations

import json
from dataclasses import dataclass
import warnings
from pathlib import Path
from typing import Any

import torch

from ..config import ConfigError, ModelConfig
from ..models.base import Model, skip_init
from .files import CheckpointError, atomic_write, read_json, read_state_dict
from .names import hf_name, tables_for, tied_keys
from .registry import FAMILIES, Family, Row, family_of


# The type of each config.json key a family reads (the keys it renames to ModelConfig fields are checked
# there, under the file's own names); null is always allowed (HF writes it for "unset").
HF_KEY_TYPES = {
    **dict.fromkeys(("activation", "activation_function", "classifier_activation", "feed_forward_proj", "hidden_act",
                     "hidden_activation", "position_embedding_type", "pooler_hidden_act", "norm_rel_ebd"), "str"),
    **dict.fromkeys(("add_cross_attention", "attention_bias", "decoder_bias", "is_decoder", "mlp_bias",
                     "scale_attn_weights", "scale_decoder_outputs", "tie_word_embeddings", "scale_attn_by_inverse_layer_idx",
                     "reorder_and_upcast_attn", "relative_attention", "share_att_key", "position_biased_input"), "bool"),
    **dict.fromkeys(("embedding_size", "global_attn_every_n_layers", "local_attention", "n_embd", "n_inner",
                     "n_layer", "n_head", "n_positions", "n_ctx", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "num_layers", "num_heads", "hidden_size", "intermediate_size", "d_model",
                     "d_ff", "d_kv", "dim", "hidden_dim", "n_layers", "n_heads", "head_dim", "vocab_size",
                     "max_position_embeddings", "type_vocab_size", "pretraining_tp", "pad_token_id", "bos_token_id",
                     "eos_token_id", "decoder_start_token_id", "num_decoder_layers", "relative_attention_num_buckets",
                     "relative_attention_max_distance", "position_buckets", "max_relative_positions",
                     "conv_kernel_size", "attention_head_size"), "int"),
    **dict.fromkeys(("dropout_rate", "global_rope_theta", "local_rope_theta", "rope_theta", "layer_norm_eps",
                     "layer_norm_epsilon", "rms_norm_eps", "norm_eps", "initializer_range", "attention_dropout",
                     "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attn_pdrop", "resid_pdrop",
                     "embd_pdrop", "mlp_dropout"), "float"),
    **dict.fromkeys(("architectures", "layer_types"), "list[str]"),
    **dict.fromkeys(("rope_parameters", "rope_scaling"), "dict"),
}


def config_from_hf_dir(directory: Path) -> tuple[ModelConfig, dict]:
    """ModelConfig from directory/config.json; anything that cannot describe a model is a ConfigError
    naming the file (and the key, where one is to blame)."""
    from ..config import type_mismatch
    path = directory / "config.json"
    hf = read_json(path)
    family = family_of(hf.get("model_type", ""), str(path))
    for key, kind in HF_KEY_TYPES.items():
        want = type_mismatch(hf.get(key), f"{kind} | None")
        if want:
            raise ConfigError(f"{path}: {key}={hf[key]!r:.60} must be {want}")
    try:
        return family.config_from_hf(hf, str(path)), hf
    except ConfigError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError, OverflowError) as err:
        # values of the right types that still do not add up (e.g. a layer pattern longer than the stack)
        raise ConfigError(f"{path}: values that do not describe a {family.model_type} model "
                          f"({type(err).__name__}: {' '.join(str(err).split())})") from None


def load_pretrained(directory: str | Path, architecture: str | None = None,
                    dtype: torch.dtype | None = None, device: str | torch.device | None = None,
                    extra: dict | None = None) -> Model:
    """Load a Hugging Face directory into the matching attnlab model.

    `architecture` picks the wrapper (e.g. "BertForPreTraining"); by default the one config.json names.
    Backbone-only weights loaded into a head wrapper leave the head freshly initialised, with a warning
    naming those tensors (the fine-tuning case); head weights loaded as a backbone are dropped with a note.
    `extra` is merged into config.extra before the model is built (e.g. id2label for a new classifier).
    """
    directory = Path(directory)
    config, hf = config_from_hf_dir(directory)
    config.extra.update(extra or {})
    family = FAMILIES[config.model_type]
    arch = architecture or (hf.get("architectures") or [family.default_architecture])[0]
    if arch not in family.architectures:
        if architecture is not None:
            raise ConfigError(f"architecture {arch!r} is not available for model_type={config.model_type!r}; "
                              f"available: {', '.join(family.architectures)}")
        arch = family.default_architecture  # an unknown head in config.json: load the backbone
    cls, head_rows = family.architectures[arch]
    sd, source = read_state_dict(directory)
    with skip_init():  # the checkpoint's tensors replace the random draws...
        model = cls(config)
    mapped = Mapped.of(model, sd, family, head_rows)
    if not mapped.covers(model):
        model = cls(config)  # ...unless some part is new (a fresh head): then it gets its initialisation
    load_hf_state_dict(model, sd, family, head_rows, source, mapped)
    if dtype is not None:
        model = model.to(dtype)
    if device is not None:
        model = model.to(device)
    return model.eval()


@dataclass
class Mapped:
    """A checkpoint's tensors under our names for one model class and config: `table` and `prefix` (the head
    wrapper's backbone prefix, or ""), `ours` (our name -> tensor), `unmatched` (HF names that match none),
    `dropped` (head tensors left out when a head checkpoint loads as a backbone)."""
    table: Any
    prefix: str
    ours: dict[str, torch.Tensor]
    unmatched: list[str]
    dropped: list[str]

    @classmethod
    def of(cls, model: Model, sd: dict[str, torch.Tensor], family: Family, head_rows: list[Row]) -> "Mapped":
        table, prefix = tables_for(model, family, head_rows)
        has_prefix = any(k.startswith(family.backbone_prefix) for k in sd)
        dropped: list[str] = []
        if prefix and not has_prefix:      # a bare backbone checkpoint into a head wrapper
            sd = {family.backbone_prefix + k: v for k, v in sd.items()}
        elif not prefix and has_prefix:    # a head checkpoint loaded as a backbone: keep the backbone part
            dropped = [k for k in sd if not k.startswith(family.backbone_prefix)]
            sd = {k[len(family.backbone_prefix):]: v for k, v in sd.items() if k.startswith(family.backbone_prefix)}
        names = family.ignore(model.config) if callable(family.ignore) else family.ignore
        ignore = set(names) | {family.backbone_prefix + i for i in names}
        ours, unmatched = table.from_hf({k: v for k, v in sd.items() if k not in ignore})
        return cls(table, prefix, ours, unmatched, dropped)

    def covers(self, model: Model) -> bool:
        """Whether loading fills every tensor of `model` (ties aside), so its initialisation can be skipped."""
        tied = tied_keys(model)
        return all(k in self.ours or k in tied for k in model.state_dict())


def load_hf_state_dict(model: Model, sd: dict[str, torch.Tensor], family: Family, head_rows: list[Row],
                       source: Path | str = "checkpoint", mapped: Mapped | None = None) -> None:
    """Copy `sd` (HF names) into `model`, with clear errors for missing, mis-shaped or non-float tensors.
    `mapped`: the names already mapped for a model of this class and config (load_pretrained maps once)."""
    m = mapped or Mapped.of(model, sd, family, head_rows)
    table, prefix, ours, unmatched, dropped = m.table, m.prefix, m.ours, m.unmatched, m.dropped
    if dropped:
        warnings.warn(f"{source}: loading the backbone only; ignored {len(dropped)} head tensors "
                      f"({', '.join(dropped[:4])}{', ...' if len(dropped) > 4 else ''})", stacklevel=3)
    expected = model.state_dict()
    not_float = [f"{hf_name(table, k)} ({v.dtype})" for k, v in ours.items()
                 if k in expected and expected[k].is_floating_point() and not v.is_floating_point()]
    if not_float:  # integer or bool data where weights belong: a damaged or mislabelled file
        raise CheckpointError(f"{source}: tensor {not_float[0]} is not floating point"
                              + (f" (+{len(not_float) - 1} more)" if len(not_float) > 1 else ""))
    tied = tied_keys(model)
    mismatched = [f"{hf_name(table, k)} -> {k}: checkpoint {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
                  for k, v in ours.items() if k in expected and v.shape != expected[k].shape]
    if mismatched:
        raise CheckpointError(f"{source}: shape mismatch for " + "; ".join(mismatched[:5]) +
                              (f" (+{len(mismatched) - 5} more)" if len(mismatched) > 5 else ""))
    unexpected = unmatched + [k for k in ours if k not in expected]
    missing = [k for k in expected if k not in ours and k not in tied]
    # the pooler is a task layer in HF's BERT (BertForMaskedLM has none): a checkpoint without one gets a
    # fresh pooler with a warning, as transformers does, e.g. fine-tuning what MLM-only pretraining wrote
    backbone_missing = [k for k in missing if (not prefix or k.startswith("backbone."))
                        and not f".{k}".startswith((".pooler.", ".backbone.pooler."))]
    if backbone_missing:
        hf_names = table.to_hf({k: expected[k] for k in backbone_missing})
        raise CheckpointError(f"{source}: missing {len(hf_names)} tensors: " + ", ".join(list(hf_names)[:6]) +
                              (", ..." if len(hf_names) > 6 else ""))
    if missing:
        warnings.warn(f"{source}: newly initialised (not in the checkpoint): {', '.join(missing)}", stacklevel=3)
    if unexpected:
        warnings.warn(f"{source}: unused tensors in the checkpoint: {', '.join(unexpected[:8])}"
                      + (", ..." if len(unexpected) > 8 else ""), stacklevel=3)
    with torch.no_grad():
        for k, v in ours.items():
            if k in expected and k not in tied:
                expected[k].copy_(v.to(expected[k].dtype))


def hf_state_dict(model: Model) -> dict[str, torch.Tensor]:
    family = family_of(model.config.model_type, "model config")
    arch = model.hf_architecture
    head_rows = family.architectures[arch][1] if arch in family.architectures else []
    table, _ = tables_for(model, family, head_rows)
    tied = tied_keys(model)
    sd = {k: v for k, v in model.state_dict().items() if k not in tied}
    return table.to_hf(sd)


def _architecture(cfg: ModelConfig) -> dict[str, Any]:
    """The values that change what a checkpoint computes (not dropout, init or token ids)."""
    sig = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
               num_heads=cfg.num_heads, num_kv_heads=cfg.kv_heads, head_dim=cfg.dim_head,
               intermediate_size=cfg.intermediate_size, embedding_size=cfg.emb_size, position=cfg.position,
               norm=cfg.norm, norm_placement=cfg.norm_placement, activation=cfg.activation, bias=cfg.bias,
               causal=cfg.causal, sliding_window=cfg.sliding_window, attention_scale=cfg.attention_scale,
               embedding_norm=cfg.embedding_norm, final_norm=cfg.has_final_norm,
               tie_word_embeddings=cfg.tie_word_embeddings, norm_eps=cfg.norm_eps, num_languages=cfg.num_languages,
               head_transform=cfg.extra.get("head_transform", True),
               share_layers=getattr(cfg, "share_layers", False), qkv_bias=cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias,
               parallel_residual=cfg.parallel_residual, global_every=cfg.extra.get("global_every"),
               classifier_pooling=cfg.classifier_pooling,  # a mean-pooling head would load as [CLS] + pooler
               num_experts=cfg.num_experts, experts_top_k=cfg.experts_top_k if cfg.num_experts else None,
               attention_kind=cfg.attention_kind,  # no HF family has linear attention
               global_attention=cfg.global_attention,
               disentangled_attention=sorted(cfg.disentangled_attention), share_att_key=cfg.share_att_key,
               relative_embedding_norm=cfg.relative_embedding_norm,
               pooler_activation=cfg.extra.get("pooler_activation", "tanh"))
    if cfg.disentangled_attention:
        sig["relative_span"] = cfg.relative_span
        sig["position_buckets"] = cfg.position_buckets
        sig["max_relative_positions"] = cfg.max_relative_positions or cfg.max_position_embeddings
    if cfg.position == "relative_xl":
        sig.update(relative_segments=cfg.relative_segments, clamp_len=cfg.extra.get("clamp_len", -1))
    if cfg.attention_kind == "block_sparse":
        sig.update(sparse_block_size=cfg.sparse_block_size, num_random_blocks=cfg.num_random_blocks)
    if cfg.position in ("learned", "sinusoidal"):
        sig["max_position_embeddings"] = cfg.max_position_embeddings
    if cfg.position == "rope":
        sig["rope_theta"] = cfg.rope_theta
        sig["rotary_dim"] = cfg.rotary_dim
    return sig


def check_expressible(family: Family, cfg: ModelConfig) -> dict:
    """The HF config for `cfg`, after checking that reading it back describes the same model: a switch
    the family's checkpoints cannot express (a bias-free GPT-2, say) is an error, not a silently
    different model."""
    hf_cfg = family.config_to_hf(cfg)
    back = _architecture(family.config_from_hf(json.loads(json.dumps(hf_cfg)), "config.json"))
    for key, value in _architecture(cfg).items():
        if back.get(key) != value:
            raise ConfigError(f"{family.model_type} checkpoints cannot express {key}={value!r} (they would "
                              f"load as {key}={back.get(key)!r}); save with attnlab.save(model, dir), "
                              "which falls back to attnlab's own layout")
    return hf_cfg


def save_pretrained(model: Model, directory: str | Path) -> Path:
    from safetensors.torch import save_file
    directory = Path(directory)
    family = family_of(model.config.model_type, "model config")
    hf_cfg = check_expressible(family, model.config)
    directory.mkdir(parents=True, exist_ok=True)
    hf_cfg["architectures"] = [model.hf_architecture]
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in hf_state_dict(model).items()}
    if family.extra_save is not None:
        family.extra_save(model, tensors)
    atomic_write(directory / "model.safetensors", lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    atomic_write(directory / "config.json",
                 lambda tmp: Path(tmp).write_text(json.dumps(hf_cfg, indent=2, sort_keys=True) + "\n"))
    return directory
