"""9. Scaling law. Kaplan et al. (2020): with enough data, test loss falls as a power law in the number of
non-embedding parameters, L(N) ≈ (N_c / N)^α_N with α_N ≈ 0.076 for their word-level models. Measured:
the character recipe at 5+ sizes (depth and width growing together), each trained on the same token
budget; a line fitted to log loss vs log N gives the exponent. At a fixed, small token budget the
largest models are data- and step-limited, which bends the curve: the fit says how far it holds."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..interop.api import load
from .charlm import train_char
from .report import Report, line_plot

NAME = "scaling"
CLAIM = "Loss falls as a power law in model size: a straight line on a log-log plot."
SIZES = [(1, 32, 2), (2, 48, 2), (2, 64, 4), (3, 96, 4), (4, 128, 4)]  # layers, width, heads
TINY_SIZES = [(1, 16, 2), (1, 32, 2)]


def non_embedding_params(model) -> int:
    skip = {id(p) for name, p in model.named_parameters() if "embed" in name or "lm_head" in name}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def fit_power_law(n: list[float], loss: list[float]) -> tuple[float, float, float]:
    """log L = log a − α log N by least squares: (α, a, R² of the fit in log space)."""
    x, y = np.log(np.array(n, dtype=float)), np.log(np.array(loss, dtype=float))
    slope, intercept = np.polyfit(x, y, 1)
    pred = slope * x + intercept
    r2 = 1 - ((y - pred) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-12)
    return float(-slope), float(math.exp(intercept)), float(r2)


def run(out: Path, *, tiny: bool = False, data: Path | None = None) -> Report:
    if data is None:
        raise ValueError("scaling needs the data directory (ATTNLAB_DATA or --data)")
    steps = 30 if tiny else 600
    rows, params, losses = [], [], []
    for layers, width, heads in (TINY_SIZES if tiny else SIZES):
        r = train_char(out, f"size-{layers}x{width}", {
            "model": {"num_layers": layers, "hidden_size": width, "num_heads": heads, "intermediate_size": 4 * width},
            "train": {"max_steps": steps}}, data=data, tiny=tiny)
        n = non_embedding_params(load(r["model_dir"]))
        params.append(n)
        losses.append(r["val_loss"])
        rows.append([f"{layers} x {width}", n, round(r["val_loss"], 4), r.get("tokens_seen", ""),
                     r.get("tokens_per_s", "")])
    alpha, a, r2 = fit_power_law(params, losses)
    fitted = [a * n ** -alpha for n in params]
    figure = line_plot(out / f"{NAME}.png", params, {"measured": losses, f"fit: {a:.2f}·N^-{alpha:.3f}": fitted},
                       xlabel="non-embedding parameters N", ylabel="val loss (nats/char)",
                       title=f"character GPT, {steps} steps each (same tokens)", logx=True, logy=True)
    holds = r2 > 0.9 and alpha > 0
    verdict = (f"Fitted L ≈ {a:.2f}·N^-{alpha:.3f} with R² = {r2:.3f} (log space) over {len(params)} sizes from "
               f"{params[0]:,} to {params[-1]:,} non-embedding parameters (Kaplan et al.: α_N ≈ 0.076 for words "
               f"with unlimited data).")
    return Report(NAME, CLAIM, ["layers x width", "non-embedding params", "val loss", "tokens seen", "tokens/s"],
                  rows, verdict, holds, settings={"steps": steps, "tiny": tiny}, figure=figure)
