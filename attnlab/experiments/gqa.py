"""8. GQA/MQA trade-off. Multi-query (Shazeer 2019) and grouped-query attention (Ainslie et al. 2023) share
each key/value head among several query heads: the KV cache shrinks by heads/kv_heads and decoding reads
less memory, for some loss in quality. Measured: the character recipe with 4 query heads and 4 (MHA),
2 (GQA) or 1 (MQA) key/value heads — val loss, KV-cache bytes per token, and cached decoding speed."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from ..inference.generate import generate
from ..interop.api import load
from .charlm import RECIPE, TINY, train_char
from .report import Report, line_plot

NAME = "gqa"
CLAIM = ("Sharing key/value heads (GQA, MQA) shrinks the KV cache and speeds decoding at a small cost in "
         "quality.")


@torch.no_grad()
def decode_speeds(model_dirs: list[str], new_tokens: int, batch: int = 1, rounds: int = 5) -> list[float]:
    """Cached greedy decoding tokens/s of each model, best of `rounds` taken in turns (a busy spell of a
    shared machine then hits every model, not whichever ran during it)."""
    models = [load(d).eval() for d in model_dirs]
    prompt = torch.zeros(batch, 4, dtype=torch.long)
    best = [0.0] * len(models)
    for r in range(rounds + 1):
        for i in (range(len(models)) if r % 2 else reversed(range(len(models)))):
            started = time.perf_counter()
            generate(models[i], prompt, max_new_tokens=new_tokens)
            if r:  # round 0 warms up
                best[i] = max(best[i], batch * new_tokens / (time.perf_counter() - started))
    return best


def run(out: Path, *, tiny: bool = False, data: Path | None = None) -> Report:
    if data is None:
        raise ValueError("gqa needs the data directory (ATTNLAB_DATA or --data)")
    steps = 30 if tiny else 1000
    shape = {**RECIPE["model"], **(TINY["model"] if tiny else {})}
    heads, width, layers = shape["num_heads"], shape["hidden_size"], shape["num_layers"]
    rows, losses, kv_bytes, dirs = [], [], [], []
    kv_options = [kv for kv in (heads, heads // 2, 1) if kv >= 1 and heads % kv == 0]
    kv_options = sorted(set(kv_options), reverse=True)
    for kv in kv_options:
        r = train_char(out, f"kv{kv}", {"model": {"num_kv_heads": kv}, "train": {"max_steps": steps}},
                       data=data, tiny=tiny)
        losses.append(r["val_loss"])
        kv_bytes.append(2 * layers * kv * (width // heads) * 4)  # keys + values per token, fp32
        dirs.append(r["model_dir"])
    # batch 16: at batch 1 a 128-wide model's cache is a few kB and decoding waits on everything but it
    batch = 2 if tiny else 16
    speeds = decode_speeds(dirs, 16 if tiny else 60, batch=batch, rounds=2 if tiny else 5)
    for kv, loss, per_token, speed in zip(kv_options, losses, kv_bytes, speeds):
        name = "MHA" if kv == heads else "MQA" if kv == 1 else "GQA"
        rows.append([f"{name} ({heads} q / {kv} kv)", round(loss, 4), per_token, round(speed, 1)])
    figure = line_plot(out / f"{NAME}.png", kv_options, {}, xlabel="key/value heads", ylabel="", title="",
                       panels={"val loss": {"series": {"val loss": losses}, "ylabel": "nats/char"},
                               "KV cache": {"series": {"bytes per token": kv_bytes}, "ylabel": "bytes"},
                               "decode": {"series": {"tokens/s (decoding)": speeds}, "ylabel": "tokens/s"}})
    cost = losses[-1] - losses[0]
    change = speeds[-1] / speeds[0] - 1
    smaller, cheap, faster = kv_bytes[-1] < kv_bytes[0], cost < 0.05, change > 0.05
    # the claim has three parts; all three must show for "holds", the cache and quality parts for "mixed"
    holds = (True if faster else None) if smaller and cheap else False
    verdict = (f"MQA keeps {kv_bytes[-1] / kv_bytes[0]:.0%} of MHA's KV cache for {cost:+.4f} val loss; batch-{batch} "
               f"decoding goes from {speeds[0]:.0f} to {speeds[-1]:.0f} tokens/s ({change:+.0%})."
               + ("" if faster else " Decoding is not faster here: with a 64-token context and a 128-wide model "
                  f"MHA's whole cache is {kv_bytes[0] * shape['max_position_embeddings'] * batch / 1e6:.1f} MB at "
                  f"batch {batch}, so reading it is not what a decoding "
                  "step waits on (the matmuls and per-step overhead are); the saving pays off with long "
                  "contexts and large batches, which this recipe does not reach."))
    return Report(NAME, CLAIM, ["attention", "val loss", "KV-cache bytes / token", "decode tokens/s"],
                  rows, verdict, holds, settings={"steps": steps, "decode_batch": batch, "tiny": tiny}, figure=figure)
