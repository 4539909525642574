"""The character-level GPT recipe as an experiment harness: nanoGPT's tiny-Shakespeare CPU recipe
(configs/pretrain-gpt-shakespeare-char.yaml: 4 layers × 128 wide, context 64, batch 12, AdamW, cosine
schedule) with one switch changed per run, every run on the same prepared corpus and held-out tail.
A run is a real `attnlab pretrain` (its recipe is written next to it as recipe.yaml) and returns its
summary (val loss, tokens/s, ...) and loss curve."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from ..data.shards import open_shards
from ..interop.api import load
from ..training.pretrain import load_config, pretrain

RECIPE: dict[str, dict[str, Any]] = {
    "model": dict(model_type="gpt2", causal=True, hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512,
                  max_position_embeddings=64, norm_placement="pre", activation="gelu", embedding_norm=False,
                  final_norm=True, pooler=False, type_vocab_size=0, bias=False, norm_eps=1e-5, dropout=0.0,
                  attention_dropout=0.0),
    "data": dict(tokenizer="char", documents="file", raw=True, heldout=0.1, heldout_mode="tail", seq_len=64,
                 batch_size=12, eval_batches=100),
    "objective": dict(kind="clm", random_windows=True),
    "train": dict(max_steps=2000, lr=1e-3, min_lr_ratio=0.1, warmup_steps=100, schedule="cosine",
                  weight_decay=0.1, beta2=0.99, eps=1e-8, clip_norm=1.0, log_every=25, eval_every=250,
                  save_every=0, keep_last=0, progress=False, nan_policy="stop"),
}
TINY = {"model": dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
        "data": dict(eval_batches=4), "train": dict(max_steps=30, warmup_steps=5, log_every=5, eval_every=15)}


def _merge(base: dict, change: dict) -> dict:
    out = copy.deepcopy(base)
    for section, values in change.items():
        out.setdefault(section, {}).update(values)
    return out


def train_char(out: Path, name: str, change: dict | None = None, *, data: Path, tiny: bool) -> dict[str, Any]:
    """Train the recipe with `change` ({section: {key: value}}) into out/runs/name; returns summary.json's
    numbers plus "curve" [(step, train loss)] and "evals" [(step, val loss)]. A diverged run (non-finite
    loss) returns val_loss = inf instead of raising."""
    tree = _merge(RECIPE, TINY) if tiny else copy.deepcopy(RECIPE)
    tree = _merge(tree, change or {})
    run_dir = out / "runs" / name
    tree["data"].update(path=str(out / "corpus-shakespeare-char"),
                        files=[str(data / "tiny_shakespeare" / "input.txt")])
    tree["train"]["output_dir"] = str(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    recipe = yaml.safe_dump(tree, sort_keys=False)
    diverged = None
    # a finished run of the same recipe is reused: an experiment rerun after an interruption (or to redo
    # its analysis) only trains what is missing
    done = (run_dir / "recipe.yaml").exists() and (run_dir / "recipe.yaml").read_text() == recipe and \
        (run_dir / "summary.json").exists() and (run_dir / "model").is_dir()
    if not done:
        (run_dir / "recipe.yaml").write_text(recipe)
        for stale in ("metrics.jsonl", "summary.json"):
            (run_dir / stale).unlink(missing_ok=True)
        try:
            pretrain(load_config(run_dir / "recipe.yaml"))
        except (RuntimeError, FloatingPointError, ValueError) as err:
            if "finite" not in str(err).lower() and "nan" not in str(err).lower():
                raise
            diverged = " ".join(str(err).split())[:200]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()] \
        if (run_dir / "metrics.jsonl").exists() else []
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    curve = [(r["step"], r["loss"]) for r in rows if "loss" in r and "step" in r]
    evals = [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r]
    val = summary.get("eval_loss", evals[-1][1] if evals else math.inf)
    if diverged or not math.isfinite(val):
        val = math.inf
    return {**summary, "val_loss": val, "curve": curve, "evals": evals, "diverged": diverged,
            "model_dir": str(run_dir / "model"), "corpus": str(out / "corpus-shakespeare-char")}


@torch.no_grad()
def heldout_loss(model_dir: str | Path, corpus: str | Path, seq_len: int, windows: int = 64,
                 last_half: bool = False, seed: int = 0) -> float:
    """Mean next-token loss of a saved model on `windows` random held-out windows of `seq_len` tokens
    (last_half: only the second half of each window's positions, i.e. those with long contexts)."""
    model = load(model_dir).eval()
    tokens = np.concatenate([s.tokens[: s.num_tokens] for s in open_shards(corpus, "heldout")]).astype(np.int64)
    if len(tokens) <= seq_len + 1:
        raise ValueError(f"{corpus}: held-out part has {len(tokens)} tokens, fewer than a window of {seq_len}")
    starts = np.random.default_rng(seed).integers(0, len(tokens) - seq_len - 1, size=windows)
    batch = torch.tensor(np.stack([tokens[s:s + seq_len + 1] for s in starts]))
    logits = model(input_ids=batch[:, :-1]).logits.float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")
    return float((nll[:, seq_len // 2:] if last_half else nll).mean())
