"""Show a model's config, its parameters per component, and one layer walked through in the notes' terms
with real shapes and FLOPs.

examples:
  attnlab info bert-base                  # a preset: prints "parameters: 109,482,240"
  attnlab info bert-large --seq-len 128
  attnlab info sentence-transformers/all-MiniLM-L6-v2
  attnlab info path/to/hf_model_dir
"""
from __future__ import annotations

import argparse

NAME = "info"
HELP = "config, parameters per component and a per-layer shape/FLOP walkthrough of a model or preset"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL_OR_PRESET", help="a preset name (bert-base, bert-large, ...) or a model")
    p.add_argument("--seq-len", type=int, default=128, help="sequence length for the walkthrough (default 128)")
    p.add_argument("--architecture", help="head wrapper to count, e.g. BertForPreTraining (default: the backbone "
                                          "for presets, what config.json names for directories)")


def model_skeleton(name: str, architecture: str | None = None):
    """A weightless model (meta device) for a preset or a model directory: enough to count and explain."""
    from ..config import PRESETS, preset
    from ..interop.hf import FAMILIES, config_from_hf_dir
    from ..interop.local import resolve
    from ..viz.explain import build_on_meta
    if name in PRESETS:
        cfg, arch = preset(name), architecture
    else:
        cfg, hf = config_from_hf_dir(resolve(name))
        arch = architecture or (hf.get("architectures") or [None])[0]
    family = FAMILIES[cfg.model_type]
    cls = family.architectures.get(arch or family.default_architecture, family.architectures[family.default_architecture])[0]
    return build_on_meta(cls, cfg)


def run(args: argparse.Namespace) -> int:
    from ..viz.explain import describe
    if args.seq_len <= 0:
        raise ValueError(f"--seq-len must be positive, got {args.seq_len}")
    model = model_skeleton(args.model, args.architecture)
    print(describe(model, seq_len=args.seq_len, title=args.model))
    return 0
