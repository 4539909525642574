"""Show a model's config, its parameters per component, and one layer walked through with real shapes
and FLOPs; --explain walks every kind of layer, with activation memory and totals. MODEL_OR_PRESET
is a preset name (bert-base, bert-large, gpt2, t5-small, mixtral-8x7b, ...) or a model: only its
config is read, no weights.

examples:
  attnlab info minilm
  attnlab info bert-base --seq-len 512 --explain
  attnlab info bert-base --explain --set causal=true --set num_kv_heads=4
  attnlab info mixtral-8x7b

Guide: docs/guides/inspection.md
"""
from __future__ import annotations

import argparse

NAME = "info"
HELP = "a model's config, parameters and a per-layer shape/FLOP walkthrough"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL_OR_PRESET", help="a preset name (bert-base, bert-large, ...) or a model")
    p.add_argument("--seq-len", type=int, default=128, help="sequence length for the walkthrough (default 128)")
    p.add_argument("--architecture", help="head wrapper to count, e.g. BertForPreTraining (default: the backbone "
                                          "for presets, what config.json names for directories)")
    p.add_argument("--explain", action="store_true", help="walk every kind of layer through the notes' steps "
                   "with shapes, parameters, FLOPs and activation memory, then the totals")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change a config field before counting (JSON value; extra.NAME for config.extra)")
    p.add_argument("--bytes", type=int, default=4, choices=(1, 2, 4), help="bytes per activation (default 4, fp32)")


def parse_overrides(items: list[str]) -> dict:
    """["num_kv_heads=4", "extra.global_every=3"] -> {"num_kv_heads": 4, "extra": {"global_every": 3}}."""
    import json
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. --set num_kv_heads=4")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw  # a bare word: a string such as rmsnorm
        if key.startswith("extra."):
            out.setdefault("extra", {})[key.removeprefix("extra.")] = value
        else:
            out[key] = value
    return out


def model_skeleton(name: str, architecture: str | None = None, overrides: dict | None = None):
    """A weightless model (meta device) for a preset or a model directory: enough to count and explain."""
    from ..config import PRESETS, preset
    from ..interop.hf import config_from_hf_dir
    from ..interop.registry import FAMILIES
    from ..interop.local import resolve
    from ..viz.explain import build_on_meta
    if name in PRESETS:
        cfg, arch = preset(name), architecture
    elif resolve(name).suffix.lower() == ".gguf":  # config from the file's metadata, no weights read
        from ..interop.gguf import gguf_config
        cfg, arch = gguf_config(resolve(name)), architecture
    elif (resolve(name) / "attnlab_config.json").exists() and not (resolve(name) / "config.json").exists():
        import json  # attnlab's own layout: the config names the class
        from ..config import ModelConfig
        from ..interop.native import native_classes
        data = json.loads((resolve(name) / "attnlab_config.json").read_text())
        cls = native_classes()[data["extra"].pop("attnlab_class", "Encoder")]
        cfg = ModelConfig.from_dict(data)
        if overrides:
            cfg = cfg.replace(**{**overrides, "extra": {**cfg.extra, **overrides.get("extra", {})}})
        return build_on_meta(cls, cfg)
    else:
        cfg, hf = config_from_hf_dir(resolve(name))
        arch = architecture or (hf.get("architectures") or [None])[0]
    if overrides:
        cfg = cfg.replace(**{**overrides, "extra": {**cfg.extra, **overrides.get("extra", {})}})
    family = FAMILIES[cfg.model_type]
    cls = family.architectures.get(arch or family.default_architecture, family.architectures[family.default_architecture])[0]
    return build_on_meta(cls, cfg)


def run(args: argparse.Namespace) -> int:
    from ..viz.explain import describe
    if args.seq_len <= 0:
        raise ValueError(f"--seq-len must be positive, got {args.seq_len}")
    model = model_skeleton(args.model, args.architecture, parse_overrides(args.set))
    print(describe(model, seq_len=args.seq_len, title=args.model, walkthrough=not args.explain))
    if model.config.num_experts:  # a mixture of experts: what a token pays for vs what the model holds
        from ..nn.moe import active_parameters
        active, total = active_parameters(model)
        print(f"experts: {model.config.num_experts} per layer, top-{model.config.experts_top_k} routing; "
              f"parameters active per token: {active:,} of {total:,} ({active / total:.1%})")
    if args.explain:
        from ..viz.walkthrough import explain_model, format_explanation
        print()
        print(format_explanation(explain_model(model, args.seq_len, args.bytes)))
    return 0
