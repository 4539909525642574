"""Hugging Face layout in and out: config.json <-> ModelConfig, and state-dict names through one table
per architecture family (not a converter per model).

A table row is `(ours, theirs)` or `(ours, theirs, transform)`: module or parameter paths, with `{i}`
standing for a layer number. `ours` may be a tuple of names that HF stores fused in one tensor (GPT-2's
c_attn holds Q, K, V); such rows are concatenated / split along dim 0. `transform="T"` transposes
(GPT-2's Conv1D stores weights as (in, out)).

Families register themselves in `FAMILIES`; BERT is defined here, later families in their own modules.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..config import ConfigError, ModelConfig
from ..models.base import Model

Row = tuple  # (ours: str | tuple[str, ...], theirs: str[, transform: str])


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model: names the file, the tensors and the shapes."""


@dataclass
class Family:
    model_type: str
    config_from_hf: Callable[[dict], ModelConfig]
    config_to_hf: Callable[[ModelConfig], dict]
    backbone_rows: list[Row]
    backbone_prefix: str                         # where HF head models keep the backbone ("bert.")
    architectures: dict[str, tuple[type, list[Row]]] = field(default_factory=dict)  # name -> (class, head rows)
    default_architecture: str = ""
    ignore: tuple[str, ...] = ()                 # HF keys that carry no weights we need (buffers)
    # HF keys with no counterpart here that may be absent from a checkpoint yet must be present in a save
    # for transformers to load it cleanly are produced by this hook
    extra_save: Callable[[Model, dict], None] | None = None


FAMILIES: dict[str, Family] = {}


# ----------------------------------------------------------------------------------- name mapping
def _pattern(template: str) -> re.Pattern:
    body = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)")
    if "(?P<i>" not in body:
        body += "(?P<i>)"  # an empty group keeps one code path for layer and non-layer rows
    return re.compile("^" + body + r"(?P<rest>(\..+)?)$")


class NameTable:
    """Bidirectional mapping between our state-dict keys and Hugging Face keys."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = []
        for row in rows:
            ours, theirs = row[0], row[1]
            transform = row[2] if len(row) > 2 else None
            ours_t = ours if isinstance(ours, tuple) else (ours,)
            self.rows.append((ours_t, theirs, transform, [_pattern(o) for o in ours_t], _pattern(theirs)))

    def to_hf(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        fused: dict[str, list] = {}
        for key, value in sd.items():
            for ours_t, theirs, transform, ours_pats, _ in self.rows:
                for j, pat in enumerate(ours_pats):
                    m = pat.match(key)
                    if m:
                        name = theirs.replace("{i}", m.group("i") or "") + m.group("rest")
                        if len(ours_t) > 1:
                            fused.setdefault(name, [None] * len(ours_t))[j] = (value, transform)
                        else:
                            out[name] = _apply(value, transform)
                        break
                else:
                    continue
                break
            else:
                raise CheckpointError(f"no Hugging Face name for parameter {key!r} (interop table incomplete)")
        for name, parts in fused.items():
            transform = parts[0][1]
            out[name] = _apply(torch.cat([p[0] for p in parts], dim=0), transform)
        return out

    def from_hf(self, sd: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
        """Returns (our state dict, HF keys no row matched)."""
        out: dict[str, torch.Tensor] = {}
        unmatched = []
        for key, value in sd.items():
            for ours_t, _, transform, _, theirs_pat in self.rows:
                m = theirs_pat.match(key)
                if m:
                    names = [o.replace("{i}", m.group("i") or "") + m.group("rest") for o in ours_t]
                    value = _apply(value, transform)
                    if len(names) == 1:
                        out[names[0]] = value
                    else:
                        for name, part in zip(names, value.chunk(len(names), dim=0)):
                            out[name] = part
                    break
            else:
                unmatched.append(key)
        return out, unmatched


def _apply(value: torch.Tensor, transform: str | None) -> torch.Tensor:
    if transform == "T" and value.dim() == 2:
        return value.t()
    return value


# ----------------------------------------------------------------------------------- config helpers
def config_from_mapping(hf: dict, source: str, renames: dict[str, str], fixed: dict[str, Any],
                        consumed: set[str]) -> ModelConfig:
    """Build a ModelConfig from an HF config dict: `renames` maps HF key -> our field, `fixed` are values
    the family implies, every other HF key is kept in `extra` so that a save writes it back."""
    values = dict(fixed)
    for theirs, ours in renames.items():
        if theirs in hf and hf[theirs] is not None:
            values[ours] = hf[theirs]
    skip = set(renames) | consumed | {"architectures", "model_type", "transformers_version", "dtype", "torch_dtype"}
    values["extra"] = {k: v for k, v in hf.items() if k not in skip}
    try:
        return ModelConfig.from_dict(values, source=source)
    except ConfigError as err:
        msg = str(err)
        for theirs, ours in renames.items():  # speak the file's language: its own key names
            msg = re.sub(rf"\b{ours}=", f"{theirs}=", msg)
        raise ConfigError(msg) from None


# ----------------------------------------------------------------------------------- BERT
_BERT_RENAMES = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads", "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings", "type_vocab_size": "type_vocab_size",
    "hidden_dropout_prob": "dropout", "attention_probs_dropout_prob": "attention_dropout",
    "initializer_range": "initializer_range", "layer_norm_eps": "norm_eps", "pad_token_id": "pad_token_id",
}
_HF_ACT = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
           "silu": "silu", "swish": "silu"}


def hf_activation(name: str, source: str) -> str:
    if name not in _HF_ACT:
        raise ConfigError(f"{source}: hidden_act={name!r} is not supported; supported: {', '.join(_HF_ACT)}")
    return _HF_ACT[name]


def bert_config_from_hf(hf: dict, source: str = "config.json") -> ModelConfig:
    pos = hf.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ConfigError(f"{source}: position_embedding_type={pos!r} is not supported (only 'absolute')")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise ConfigError(f"{source}: BERT as a decoder (is_decoder/add_cross_attention) is not supported")
    fixed = dict(model_type="bert", activation=hf_activation(hf.get("hidden_act", "gelu"), source),
                 tie_word_embeddings=hf.get("tie_word_embeddings", True))
    return config_from_mapping(hf, source, _BERT_RENAMES, fixed,
                               {"hidden_act", "position_embedding_type", "tie_word_embeddings"})


def bert_config_to_hf(cfg: ModelConfig) -> dict:
    act = {v: k for k, v in _HF_ACT.items() if k in ("gelu", "relu", "gelu_new", "silu")}[cfg.activation]
    out = dict(cfg.extra)
    out.update({theirs: getattr(cfg, ours) for theirs, ours in _BERT_RENAMES.items()})
    out.update(model_type="bert", hidden_act=act, position_embedding_type="absolute",
               tie_word_embeddings=cfg.tie_word_embeddings)
    return out


BERT_BACKBONE: list[Row] = [
    ("embeddings.tok", "embeddings.word_embeddings"),
    ("embeddings.pos", "embeddings.position_embeddings"),
    ("embeddings.seg", "embeddings.token_type_embeddings"),
    ("embeddings.norm", "embeddings.LayerNorm"),
    ("layers.{i}.attn.q", "encoder.layer.{i}.attention.self.query"),
    ("layers.{i}.attn.k", "encoder.layer.{i}.attention.self.key"),
    ("layers.{i}.attn.v", "encoder.layer.{i}.attention.self.value"),
    ("layers.{i}.attn.o", "encoder.layer.{i}.attention.output.dense"),
    ("layers.{i}.attn_norm", "encoder.layer.{i}.attention.output.LayerNorm"),
    ("layers.{i}.ffn.up", "encoder.layer.{i}.intermediate.dense"),
    ("layers.{i}.ffn.down", "encoder.layer.{i}.output.dense"),
    ("layers.{i}.ffn_norm", "encoder.layer.{i}.output.LayerNorm"),
    ("pooler.dense", "pooler.dense"),
]
BERT_MLM: list[Row] = [
    ("mlm.dense", "cls.predictions.transform.dense"),
    ("mlm.norm", "cls.predictions.transform.LayerNorm"),
    ("mlm.bias", "cls.predictions.bias"),
    ("mlm.decoder", "cls.predictions.decoder"),
]
BERT_NSP: list[Row] = [("nsp.linear", "cls.seq_relationship")]
BERT_CLASSIFIER: list[Row] = [("classifier", "classifier")]  # sequence and token classification
BERT_QA: list[Row] = [("qa_outputs", "qa_outputs")]


def register(family: Family) -> Family:
    FAMILIES[family.model_type] = family
    return family


def _bert_family() -> Family:
    from ..heads import MaskedLM, PreTraining, QuestionAnswering, SequenceClassification, TokenClassification
    from ..models.encoder import Encoder
    return Family(
        model_type="bert", config_from_hf=bert_config_from_hf, config_to_hf=bert_config_to_hf,
        backbone_rows=BERT_BACKBONE, backbone_prefix="bert.",
        architectures={"BertModel": (Encoder, []), "BertForMaskedLM": (MaskedLM, BERT_MLM),
                       "BertForPreTraining": (PreTraining, BERT_MLM + BERT_NSP),
                       "BertForSequenceClassification": (SequenceClassification, BERT_CLASSIFIER),
                       "BertForTokenClassification": (TokenClassification, BERT_CLASSIFIER),
                       "BertForQuestionAnswering": (QuestionAnswering, BERT_QA)},
        default_architecture="BertModel",
        ignore=("embeddings.position_ids", "cls.predictions.decoder.bias"))


register(_bert_family())


# ----------------------------------------------------------------------------------- reading files
def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: not found (a Hugging Face model directory needs config.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


# safetensors dtype -> bytes per element (sub-byte float formats are left to the library's own check)
SAFETENSORS_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1,
                      "F8_E5M2FNUZ": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
                      "C64": 8, "F64": 8, "I64": 8, "U64": 8, "F4": None, "F6_E2M3": None, "F6_E3M2": None}
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # the format's own limit


def check_safetensors(path: Path) -> None:
    """Check a safetensors header against the file before any tensor is read: every dtype known, every
    shape a list of non-negative integers, every byte range inside the file and of the size its shape
    and dtype need. The error names the file and the tensor (the library's own errors name neither)."""
    import struct
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header length)")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, MAX_SAFETENSORS_HEADER):
                raise CheckpointError(f"{path}: safetensors header length {n} exceeds the file ({size} bytes): "
                                      "truncated or not a safetensors file")
            raw = fh.read(n)
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read ({err.strerror or err})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: safetensors header is not valid JSON ({err})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header must be a JSON object, got {type(header).__name__}")
    data_len = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name!r}"
        if not isinstance(info, dict):
            raise CheckpointError(f"{where}: header entry must be an object, got {type(info).__name__}")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
            raise CheckpointError(f"{where}: unknown dtype {dtype!r}; known: {', '.join(SAFETENSORS_DTYPES)}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise CheckpointError(f"{where}: shape {shape!r} is not a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise CheckpointError(f"{where}: data_offsets {offsets!r} is not a [begin, end] pair with begin <= end")
        if offsets[1] > data_len:
            raise CheckpointError(f"{where}: bytes {offsets[0]}..{offsets[1]} lie beyond the end of the data "
                                  f"({data_len} bytes): the file is truncated or its header is wrong")
        itemsize = SAFETENSORS_DTYPES[dtype]
        if itemsize is not None:
            numel = 1
            for d in shape:
                numel *= d
            if offsets[1] - offsets[0] != numel * itemsize:
                raise CheckpointError(f"{where}: shape {shape} of {dtype} needs {numel * itemsize} bytes, "
                                      f"the header gives it {offsets[1] - offsets[0]}")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file, after `check_safetensors`; any error names the file."""
    from safetensors.torch import load_file
    check_safetensors(path)
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors raises its own error types; name the file
        raise CheckpointError(f"{path}: cannot read safetensors ({first_line(err)})") from None


def first_line(err: BaseException) -> str:
    """The first line of an error message (torch's unpickling errors run to a page)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def read_state_dict(directory: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """model.safetensors (or a sharded index), else pytorch_model.bin loaded with weights_only=True:
    a pickle can run code on load, so nothing but tensors is accepted."""
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.exists():
        return read_safetensors(single), single
    if index.exists():
        weight_map = read_json(index).get("weight_map", {})
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index}: weight_map must map tensor names to shard file names")
        sd: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            if Path(shard).name != shard:  # a shard outside the directory ("../x") is not read
                raise CheckpointError(f"{index}: shard {shard!r} is not a file name inside {directory}")
            sd.update(read_safetensors(directory / shard))
        return sd, index
    binary = directory / "pytorch_model.bin"
    if binary.exists():
        try:
            sd = torch.load(binary, map_location="cpu", weights_only=True)
        except Exception as err:
            raise CheckpointError(f"{binary}: refused or unreadable; only plain tensors are loaded "
                                  f"(weights_only=True): {first_line(err)}") from None
        if not isinstance(sd, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                               for k, v in sd.items()):
            raise CheckpointError(f"{binary}: expected a mapping of tensor names to tensors")
        return sd, binary
    raise FileNotFoundError(f"{directory}: no weights found (looked for model.safetensors, "
                            "model.safetensors.index.json, pytorch_model.bin)")


# ----------------------------------------------------------------------------------- load / save
def family_of(model_type: str, source: str) -> Family:
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise ConfigError(f"{source}: model_type={model_type!r} is not supported; supported: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[model_type]


# The type of each config.json key a family reads (the keys it renames to ModelConfig fields are checked
# there, under the file's own names); null is always allowed (HF writes it for "unset").
HF_KEY_TYPES = {
    **dict.fromkeys(("activation", "activation_function", "classifier_activation", "feed_forward_proj", "hidden_act",
                     "hidden_activation", "position_embedding_type"), "str"),
    **dict.fromkeys(("add_cross_attention", "attention_bias", "decoder_bias", "is_decoder", "mlp_bias",
                     "scale_attn_weights", "scale_decoder_outputs", "tie_word_embeddings", "scale_attn_by_inverse_layer_idx",
                     "reorder_and_upcast_attn"), "bool"),
    **dict.fromkeys(("embedding_size", "global_attn_every_n_layers", "local_attention", "n_embd", "n_inner",
                     "n_layer", "n_head", "n_positions", "n_ctx", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "num_layers", "num_heads", "hidden_size", "intermediate_size", "d_model",
                     "d_ff", "d_kv", "dim", "hidden_dim", "n_layers", "n_heads", "head_dim", "vocab_size",
                     "max_position_embeddings", "type_vocab_size", "pretraining_tp", "pad_token_id", "bos_token_id",
                     "eos_token_id", "decoder_start_token_id", "num_decoder_layers", "relative_attention_num_buckets",
                     "relative_attention_max_distance"), "int"),
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
    if not (directory / "config.json").exists() and (directory / "attnlab_config.json").exists():
        from ..training.checkpoint import load_native  # attnlab's own layout (no HF family fits)
        model = load_native(directory, extra)
        return (model.to(dtype) if dtype is not None else model).to(device or "cpu").eval()
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
    model = cls(config)
    sd, source = read_state_dict(directory)
    load_hf_state_dict(model, sd, family, head_rows, source)
    if dtype is not None:
        model = model.to(dtype)
    if device is not None:
        model = model.to(device)
    return model.eval()


def _tables(model: Model, family: Family, head_rows: list[Row]) -> tuple[NameTable, str]:
    """Our keys are `backbone.*` + head keys in wrappers, bare backbone keys in a backbone."""
    is_wrapper = hasattr(model, "backbone")
    if not is_wrapper:
        return NameTable(family.backbone_rows), ""
    rows = [(tuple("backbone." + o for o in r[0]) if isinstance(r[0], tuple) else "backbone." + r[0],
             family.backbone_prefix + r[1], *r[2:]) for r in family.backbone_rows]
    return NameTable(rows + head_rows), family.backbone_prefix


def load_hf_state_dict(model: Model, sd: dict[str, torch.Tensor], family: Family, head_rows: list[Row],
                       source: Path | str = "checkpoint") -> None:
    table, prefix = _tables(model, family, head_rows)
    has_prefix = any(k.startswith(family.backbone_prefix) for k in sd)
    if prefix and not has_prefix:      # a bare backbone checkpoint into a head wrapper
        sd = {family.backbone_prefix + k: v for k, v in sd.items()}
    elif not prefix and has_prefix:    # a head checkpoint loaded as a backbone: keep the backbone part
        dropped = [k for k in sd if not k.startswith(family.backbone_prefix)]
        sd = {k[len(family.backbone_prefix):]: v for k, v in sd.items() if k.startswith(family.backbone_prefix)}
        if dropped:
            warnings.warn(f"{source}: loading the backbone only; ignored {len(dropped)} head tensors "
                          f"({', '.join(dropped[:4])}{', ...' if len(dropped) > 4 else ''})", stacklevel=3)
    ignore = {i for i in family.ignore} | {family.backbone_prefix + i for i in family.ignore}
    sd = {k: v for k, v in sd.items() if k not in ignore}
    expected = model.state_dict()
    ours, unmatched = table.from_hf(sd)
    not_float = [f"{_hf_name(table, k)} ({v.dtype})" for k, v in ours.items()
                 if k in expected and expected[k].is_floating_point() and not v.is_floating_point()]
    if not_float:  # integer or bool data where weights belong: a damaged or mislabelled file
        raise CheckpointError(f"{source}: tensor {not_float[0]} is not floating point"
                              + (f" (+{len(not_float) - 1} more)" if len(not_float) > 1 else ""))
    tied = _tied_keys(model)
    mismatched = [f"{_hf_name(table, k)} -> {k}: checkpoint {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
                  for k, v in ours.items() if k in expected and v.shape != expected[k].shape]
    if mismatched:
        raise CheckpointError(f"{source}: shape mismatch for " + "; ".join(mismatched[:5]) +
                              (f" (+{len(mismatched) - 5} more)" if len(mismatched) > 5 else ""))
    unexpected = unmatched + [k for k in ours if k not in expected]
    missing = [k for k in expected if k not in ours and k not in tied]
    backbone_missing = [k for k in missing if not prefix or k.startswith("backbone.")]
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


def _hf_name(table: NameTable, key: str) -> str:
    """The checkpoint's name for our parameter `key` (for error messages)."""
    for ours_t, theirs, _, ours_pats, _ in table.rows:
        for pat in ours_pats:
            m = pat.match(key)
            if m:
                return theirs.replace("{i}", m.group("i") or "") + m.group("rest")
    return key


def _tied_keys(model: Model) -> set[str]:
    """Keys that share storage with an earlier key (a tied output projection)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        else:
            seen[id(p)] = name
    return tied


def hf_state_dict(model: Model) -> dict[str, torch.Tensor]:
    family = family_of(model.config.model_type, "model config")
    arch = model.hf_architecture
    head_rows = family.architectures[arch][1] if arch in family.architectures else []
    table, _ = _tables(model, family, head_rows)
    tied = _tied_keys(model)
    sd = {k: v for k, v in model.state_dict().items() if k not in tied}
    return table.to_hf(sd)


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Write through a temporary file in the same directory, then rename: a killed run leaves either
    the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _architecture(cfg: ModelConfig) -> dict[str, Any]:
    """The values that change what a checkpoint computes (not dropout, init or token ids)."""
    sig = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
               num_heads=cfg.num_heads, num_kv_heads=cfg.kv_heads, head_dim=cfg.dim_head,
               intermediate_size=cfg.intermediate_size, embedding_size=cfg.emb_size, position=cfg.position,
               norm=cfg.norm, norm_placement=cfg.norm_placement, activation=cfg.activation, bias=cfg.bias,
               causal=cfg.causal, sliding_window=cfg.sliding_window, attention_scale=cfg.attention_scale,
               embedding_norm=cfg.embedding_norm, final_norm=cfg.has_final_norm,
               tie_word_embeddings=cfg.tie_word_embeddings, norm_eps=cfg.norm_eps,
               share_layers=getattr(cfg, "share_layers", False))
    if cfg.position in ("learned", "sinusoidal"):
        sig["max_position_embeddings"] = cfg.max_position_embeddings
    if cfg.position == "rope":
        sig["rope_theta"] = cfg.rope_theta
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
                              f"load as {key}={back.get(key)!r}); save with attnlab.training.checkpoint.save_model, "
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


# ----------------------------------------------------------------------------------- other families
# Imported last: each module registers its Family with the helpers defined above.
from . import gpt2, llama  # noqa: E402,F401
from . import albert, distilbert, electra, modernbert, roberta  # noqa: E402,F401  (the BERT family, issue 9)
from . import t5  # noqa: E402,F401  (T5 and the original Transformer, issue 8)
