"""6. Positions. Self-attention is order-blind; the order comes from position information: learned absolute
embeddings (BERT, GPT-2), fixed sinusoids (Vaswani et al. 2017, who hoped they would "extrapolate to
sequence lengths longer than the ones encountered during training"), rotary embeddings (RoPE, Su et al.
2021) and a learned relative bias (T5, Raffel et al. 2020). Measured: the character recipe trained at
context 64 with each scheme, val loss at 64, and loss on windows of 128 (2x the training context)."""
from __future__ import annotations

from pathlib import Path

from .charlm import heldout_loss, train_char
from .report import Report, bar_plot

NAME = "positions"
CLAIM = ("Relative schemes (RoPE, relative bias) train as well as absolute ones and extrapolate beyond the "
         "training context; learned absolute positions cannot.")
SCHEMES = ("learned", "sinusoidal", "rope", "relative_bias")


def run(out: Path, *, tiny: bool = False, data: Path | None = None) -> Report:
    if data is None:
        raise ValueError("positions needs the data directory (ATTNLAB_DATA or --data)")
    steps = 30 if tiny else 1000
    context = 64
    rows, at_train, at_double, late = [], [], [], []
    for scheme in SCHEMES:
        # 2x the context is allowed by the tables (positions 64..127 of a learned table stay untrained)
        r = train_char(out, f"pos-{scheme}", {"model": {"position": scheme, "max_position_embeddings": 2 * context},
                                               "train": {"max_steps": steps}}, data=data, tiny=tiny)
        windows = 8 if tiny else 200
        short = heldout_loss(r["model_dir"], r["corpus"], context, windows=windows)
        double = heldout_loss(r["model_dir"], r["corpus"], 2 * context, windows=windows)
        double_late = heldout_loss(r["model_dir"], r["corpus"], 2 * context, windows=windows, last_half=True)
        at_train.append(short)
        at_double.append(double)
        late.append(double_late)
        rows.append([scheme, round(r["val_loss"], 4), round(short, 4), round(double, 4), round(double_late, 4),
                     f"{double_late - short:+.3f}"])
    figure = bar_plot(out / f"{NAME}.png", list(SCHEMES),
                      {f"context {context} (trained)": at_train, f"context {2 * context}, all positions": at_double,
                       f"context {2 * context}, positions {context}-{2 * context - 1}": late},
                      ylabel="held-out loss (nats/char)", title="positions: trained at 64, tested at 128")
    best = min(range(len(SCHEMES)), key=lambda i: at_train[i])
    extrapolate = {s: late[i] - at_train[i] for i, s in enumerate(SCHEMES)}
    rel_ok = max(extrapolate["rope"], extrapolate["relative_bias"]) < extrapolate["learned"]
    holds = rel_ok and at_train[SCHEMES.index("rope")] <= at_train[SCHEMES.index("learned")] + 0.02
    verdict = (f"Best at the trained context: {SCHEMES[best]} ({at_train[best]:.3f}). Beyond it (positions "
               f"{context}-{2 * context - 1}), the loss changes by "
               + ", ".join(f"{s} {d:+.3f}" for s, d in extrapolate.items()) + ".")
    return Report(NAME, CLAIM, ["position", "val loss (trainer)", f"loss @ {context}", f"loss @ {2 * context}",
                                f"loss @ {2 * context}, 2nd half", "2nd half − @64"], rows, verdict, holds,
                  settings={"steps": steps, "context": context, "tiny": tiny}, figure=figure)
