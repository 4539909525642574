"""Adapters on disk in the PEFT layout: `adapter_config.json` + `adapter_model.safetensors`, so that
`peft.PeftModel.from_pretrained(hf_model, dir)` loads what attnlab trained and attnlab loads peft's.

Key names are peft's: "base_model.model." + the Hugging Face name of the wrapped module (through the
family's name table, interop/names.py) + ".lora_A.weight" / ".lora_B.weight"; a trained head that is
not an adapter (a new classifier) is saved whole under its HF name and listed in `modules_to_save`.

    apply_lora(model, targets=["q_proj", "v_proj"], r=8, alpha=16)   # HF or attnlab module names
    save_adapter(model, "adapter/")
    load_adapter(base_model, "adapter/")                             # wraps and fills the same modules

Houlsby bottleneck adapters (nn/lora.py) use the same two files with peft_type "BOTTLENECK": that is
attnlab's own; peft has no such adapter type and cannot load it.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn

from ..models.base import Model
from ..nn.lora import (BottleneckLinear, LoRALinear, LoraSettings, add_bottleneck_adapters, add_lora,
                       adapter_modules, is_adapter_parameter, linear_paths, mark_only_adapters_trainable, merge_lora,
                       target_matcher)
from .files import CheckpointError, atomic_write, read_json
from .names import NameTable, hf_name, tables_for
from .registry import family_of

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."
DEFAULT_TARGETS = ["attn.q", "attn.v"]  # peft's default for BERT and LLaMA alike (query/value, q_proj/v_proj)
TASK_TYPES = {"ForCausalLM": "CAUSAL_LM", "LMHeadModel": "CAUSAL_LM", "ForSequenceClassification": "SEQ_CLS",
              "ForTokenClassification": "TOKEN_CLS", "ForQuestionAnswering": "QUESTION_ANS",
              "ForConditionalGeneration": "SEQ_2_SEQ_LM"}
TASK_HEADS = {"SEQ_CLS": ["classifier"], "TOKEN_CLS": ["classifier"], "QUESTION_ANS": ["qa_outputs"]}
# peft options that change what an adapter computes and that attnlab does not implement
UNSUPPORTED = {"use_dora": False, "lora_bias": False, "bias": "none", "layers_to_transform": None,
               "target_parameters": None, "trainable_token_indices": None, "layer_replication": None,
               "use_bdlora": None, "use_qalora": False}


def _table(model: Model) -> NameTable:
    family = family_of(model.config.model_type, "model config")
    arch = getattr(model, "hf_architecture", "")
    head_rows = family.architectures[arch][1] if arch in family.architectures else []
    return tables_for(model, family, head_rows)[0]


def hf_module_names(model: Model) -> dict[str, str]:
    """Our path -> the Hugging Face path of every plain or adapted Linear in `model`."""
    table = _table(model)
    paths = linear_paths(model) + list(adapter_modules(model))
    return {p: hf_name(table, p + ".weight")[: -len(".weight")] for p in paths}


def apply_lora(model: Model, targets: list[str] | str | None = None, r: int = 8, alpha: float = 8.0,
               dropout: float = 0.0, rslora: bool = False) -> list[str]:
    """LoRA on the Linears whose attnlab path (`layers.0.attn.q`) or Hugging Face path
    (`model.layers.0.self_attn.q_proj`) matches `targets` (peft's rule: suffixes, or one regex).
    Default: the query and value projections, as peft's default for BERT and LLaMA."""
    targets = DEFAULT_TARGETS if targets is None else targets
    match, hf = target_matcher(targets), hf_module_names(model)
    return add_lora(model, lambda p: match(p) or match(hf.get(p, p)), r=r, alpha=alpha, dropout=dropout,
                    rslora=rslora)


def apply_bottleneck(model: Model, targets: list[str] | str | None = None, size: int = 64,
                     activation: str = "gelu") -> list[str]:
    match, hf = target_matcher(targets or ["attn.o", "ffn.down"]), hf_module_names(model)
    return add_bottleneck_adapters(model, lambda p: match(p) or match(hf.get(p, p)), size, activation)


def lora_for_training(model: Model, r: int = 8, alpha: float = 16.0, dropout: float = 0.0,
                      targets: list[str] | str | None = None, rslora: bool = False) -> int:
    """LoRA on `targets`, everything else frozen except the task head (a classifier or span head is new
    and must learn, as peft's task types do). Returns the number of trainable parameters."""
    apply_lora(model, targets, r=r, alpha=alpha, dropout=dropout, rslora=rslora)
    return mark_only_adapters_trainable(model, also=TASK_HEADS.get(_task_type(model), []))


def merged_copy(model: Model) -> Model:
    """A copy with every LoRA folded in and unwrapped: a plain model that saves in the HF layout."""
    import copy
    plain = copy.deepcopy(model)
    merge_lora(plain, unload=True)
    return plain


def attach_adapter(model: Model, directory: str | Path) -> Model:
    """Load an adapter for inference: LoRA is merged into the base weights (decoding costs what the base
    model's does); bottleneck adapters stay as modules. `model` is changed in place and returned."""
    load_adapter(model, directory)
    merge_lora(model, unload=True)
    return model.eval()


def adapter_view(model: Model, directory: str | Path) -> Model:
    """Another model over the *same* base weights with `directory`'s adapter on top, left unmerged, so that
    one server holds the base model once and any number of adapters (each adds its small matrices, and
    r-rank products per token; merging would write into the shared weights). An adapter that also saves
    whole modules (a task head) is refused: loading it would overwrite weights the other models use."""
    import copy

    from safetensors import safe_open
    weights = Path(directory) / ADAPTER_WEIGHTS
    if weights.exists():
        with safe_open(str(weights), "pt") as f:
            whole = [k[len(PREFIX):] for k in f.keys() if not is_adapter_parameter(k)]
        if whole:
            raise ValueError(f"{weights}: saves whole modules ({whole[0]}) besides the adapter; it cannot share the "
                             f"base weights with other adapters (serve it alone, merged)")
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    view = copy.deepcopy(model, memo=shared)   # new modules, the same Parameter and buffer objects
    for m in view.modules():   # attention's stacked Q/K/V copy (nn/attention.py) is rebuilt on demand, not copied
        m.__dict__.pop("_qkv_cache", None)
    return load_adapter(view, directory).eval()


def _task_type(model: Model) -> str | None:
    arch = getattr(model, "hf_architecture", "")
    return next((t for suffix, t in TASK_TYPES.items() if arch.endswith(suffix)), None)


def _target_modules(chosen_hf: list[str], all_hf: list[str]) -> list[str]:
    """peft's `target_modules`: for each adapted module the shortest path suffix that matches adapted
    modules only ("query", but "intermediate.dense" where "dense" would also catch the output layers)."""
    chosen, out = set(chosen_hf), set()
    for path in chosen_hf:
        parts = path.split(".")
        for k in range(1, len(parts) + 1):
            suffix = ".".join(parts[-k:])
            match = target_matcher([suffix])
            if all(p in chosen for p in all_hf if match(p)):
                out.add(suffix)
                break
    return sorted(out)


def save_adapter(model: Model, directory: str | Path, modules_to_save: list[str] | tuple[str, ...] | None = None,
                 base_model_name_or_path: str | None = None) -> Path:
    """Write the model's adapters (and the whole of each module in `modules_to_save`, our or HF names)
    to `directory` in the PEFT layout. By default a task head is saved whole (the classifier, the QA
    span head), as peft does for those task types: it is trained from scratch alongside the adapter."""
    from safetensors.torch import save_file
    directory = Path(directory)
    mods = adapter_modules(model)
    if not mods:
        raise ValueError("save_adapter: the model has no adapters (apply_lora or apply_bottleneck first)")
    kinds = {type(m) for m in mods.values()}
    if len(kinds) > 1:
        raise ValueError("save_adapter: the model mixes LoRA and bottleneck adapters; one directory holds one kind")
    hf = hf_module_names(model)
    chosen_hf = [hf[p] for p in mods]
    if len(set(chosen_hf)) < len(chosen_hf):  # GPT-2's c_attn holds q, k and v in one HF module
        dup = sorted({h for h in chosen_hf if chosen_hf.count(h) > 1})
        raise ValueError(f"save_adapter: {', '.join(dup)} fuses several attnlab projections into one Hugging Face "
                         "module; the PEFT layout cannot hold separate adapters for them")
    merged = [p for p, m in mods.items() if getattr(m, "merged", False)]
    if merged:
        raise ValueError(f"save_adapter: LoRA is merged into {merged[0]} (and {len(merged) - 1} more); unmerge first")
    tensors: dict[str, torch.Tensor] = {}
    for path, m in mods.items():
        for name, p in m.named_parameters():
            if is_adapter_parameter(name):
                tensors[PREFIX + hf[path] + "." + name] = p
    table = _table(model)
    if modules_to_save is None:
        modules_to_save = TASK_HEADS.get(_task_type(model), [])
    keep = target_matcher(list(modules_to_save))
    extra = {k: v for k, v in model.state_dict().items()
             if not is_adapter_parameter(k) and (keep(k.rpartition(".")[0]) or keep(hf_name(table, k).rpartition(".")[0]))}
    saved_modules = sorted({hf_name(table, k).rpartition(".")[0] for k in extra})
    tensors.update({PREFIX + k: v for k, v in table.to_hf(extra).items()})
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    first = next(iter(mods.values()))
    if isinstance(first, LoRALinear):
        settings = {(m.r, m.lora_alpha, m.scaling) for m in mods.values()}
        if len(settings) > 1:
            raise ValueError("save_adapter: the LoRA layers differ in rank or alpha; the PEFT layout written here "
                             "holds one (r, alpha)")
        r, alpha, scaling = settings.pop()
        drop = first.lora_dropout.p if isinstance(first.lora_dropout, nn.Dropout) else 0.0
        config = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "lora_dropout": drop,
                  "use_rslora": abs(scaling - alpha / r) > 1e-12, "fan_in_fan_out": False, "bias": "none",
                  "init_lora_weights": True, "rank_pattern": {}, "alpha_pattern": {}, "use_dora": False}
    else:
        config = {"peft_type": "BOTTLENECK", "adapter_size": first.adapter_size,
                  "adapter_activation": first.adapter_activation,
                  "note": "attnlab's Houlsby adapter (Houlsby et al. 2019); peft cannot load this type"}
    config.update(target_modules=_target_modules(chosen_hf, list(hf.values())), task_type=_task_type(model),
                  modules_to_save=saved_modules or None, base_model_name_or_path=base_model_name_or_path,
                  inference_mode=True)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / ADAPTER_WEIGHTS, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    atomic_write(directory / ADAPTER_CONFIG,
                 lambda tmp: Path(tmp).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n"))
    return directory


def read_adapter_config(directory: str | Path) -> dict:
    path = Path(directory) / ADAPTER_CONFIG
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found (an adapter directory holds {ADAPTER_CONFIG} + {ADAPTER_WEIGHTS})")
    config = read_json(path)
    kind = config.get("peft_type")
    if kind not in ("LORA", "BOTTLENECK"):
        raise CheckpointError(f"{path}: peft_type={kind!r} is not supported; supported: LORA, BOTTLENECK")
    for key, default in UNSUPPORTED.items():
        if config.get(key, default) not in (default, None, False, "none", {}):
            raise CheckpointError(f"{path}: {key}={config[key]!r} is not supported by attnlab's LoRA")
    if kind == "LORA":
        for key in ("r", "lora_alpha"):
            if not isinstance(config.get(key), (int, float)) or isinstance(config.get(key), bool) or config[key] <= 0:
                raise CheckpointError(f"{path}: {key}={config.get(key)!r} must be a positive number")
    return config


def _alpha_for(config: dict, hf_path: str, r: int) -> float:
    """peft's alpha_pattern: a key matches a module path when the path ends in it (as a regex)."""
    for key, alpha in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({key})$", hf_path):
            return float(alpha)
    return float(config["lora_alpha"])


def load_adapter(model: Model, directory: str | Path, trainable: bool = False) -> Model:
    """Wrap the modules `directory`'s weights name and fill them; `model` is changed in place (and
    returned). The rank of each layer is read from its tensors, so peft's rank_pattern needs no rule."""
    from safetensors.torch import load_file
    from .files import check_safetensors
    directory = Path(directory)
    config = read_adapter_config(directory)
    weights = directory / ADAPTER_WEIGHTS
    if not weights.exists():
        raise FileNotFoundError(f"{weights}: not found")
    check_safetensors(weights)
    raw = load_file(str(weights))
    bad = [k for k in raw if not k.startswith(PREFIX)]
    if bad:
        raise CheckpointError(f"{weights}: tensor {bad[0]!r} does not start with {PREFIX!r} (not peft's layout)")
    sd = {k[len(PREFIX):]: v for k, v in raw.items()}
    ours_of = {h: p for p, h in hf_module_names(model).items()}
    family = family_of(model.config.model_type, "model config")
    bp = family.backbone_prefix
    modules = {k.rsplit(".", 2)[0] for k in sd if is_adapter_parameter(k)}
    if modules and not all(m in ours_of for m in modules):  # adapter of a head model on a bare backbone or back
        if all(m.startswith(bp) and m[len(bp):] in ours_of for m in modules):
            sd = {k[len(bp):]: v for k, v in sd.items() if k.startswith(bp)}
        elif all(bp + m in ours_of for m in modules):
            sd = {bp + k: v for k, v in sd.items()}
        modules = {k.rsplit(".", 2)[0] for k in sd if is_adapter_parameter(k)}
    unknown = sorted(m for m in modules if m not in ours_of)
    if unknown:
        more = f" (+{len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise CheckpointError(f"{weights}: no linear layer {unknown[0]!r} in this {model.config.model_type} model{more}")
    for hf_path in sorted(modules):
        path = ours_of[hf_path]
        base = model.get_submodule(path)
        if config["peft_type"] == "LORA":
            a = sd.get(hf_path + ".lora_A.weight")
            if a is None or hf_path + ".lora_B.weight" not in sd:
                raise CheckpointError(f"{weights}: {hf_path} needs both lora_A.weight and lora_B.weight")
            r = a.shape[0]
            settings = LoraSettings(r=r, alpha=_alpha_for(config, hf_path, r),
                                    dropout=float(config.get("lora_dropout") or 0.0),
                                    rslora=bool(config.get("use_rslora")))
            new = LoRALinear(base, settings)
        else:
            new = BottleneckLinear(base, int(config["adapter_size"]), config.get("adapter_activation", "gelu"))
        parent, _, attr = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, new)
    # fill adapter tensors and saved modules through one state-dict load, every shape checked by name
    table = _table(model)
    adapter_sd = {}
    for k, v in sd.items():
        if is_adapter_parameter(k):
            module, sub, leaf = k.rsplit(".", 2)
            adapter_sd[f"{ours_of[module]}.{sub}.{leaf}"] = v
    head_sd, unmatched = table.from_hf({k: v for k, v in sd.items() if not is_adapter_parameter(k)})
    expected = model.state_dict()
    extra = unmatched + [k for k in {**adapter_sd, **head_sd} if k not in expected]
    if extra:
        raise CheckpointError(f"{weights}: tensors with no place in the model: {', '.join(extra[:5])}")
    for k, v in {**adapter_sd, **head_sd}.items():
        if v.shape != expected[k].shape:
            raise CheckpointError(f"{weights}: {k}: adapter {tuple(v.shape)} vs model {tuple(expected[k].shape)}")
    wanted = {f"{p}.{n}" for p, m in adapter_modules(model).items() for n, _ in m.named_parameters()
              if is_adapter_parameter(n)}
    missing = sorted(wanted - set(adapter_sd))
    if missing:
        raise CheckpointError(f"{weights}: missing {missing[0]}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""))
    with torch.no_grad():
        for k, v in {**adapter_sd, **head_sd}.items():
            expected[k].copy_(v.to(expected[k].dtype))
    if trainable:
        mark_only_adapters_trainable(model, also=[p for p in {k.rpartition(".")[0] for k in head_sd}])
    return model
