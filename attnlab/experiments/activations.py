"""7. Activations. The feed-forward block's nonlinearity: ReLU (the original Transformer), GELU (BERT,
GPT-2), and the gated variants GeGLU and SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"), which
spend a third matrix on a gate — at equal parameters the inner size shrinks to 2/3. ReLU units that never
fire ("dead") are wasted capacity. Measured: the character recipe with each, at equal parameters."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..data.shards import open_shards
from ..interop.api import load
from .charlm import RECIPE, TINY, train_char
from .report import Report, bar_plot

NAME = "activations"
CLAIM = "Gated feed-forward layers (SwiGLU, GeGLU) beat ReLU and GELU at equal parameters; some ReLU units die."
KINDS = ("relu", "gelu", "swiglu", "geglu")


@torch.no_grad()
def dead_share(model_dir: str, corpus: str, seq_len: int, windows: int = 64) -> float:
    """Share of FFN units (all layers) whose pre-activation is never positive on held-out windows."""
    model = load(model_dir).eval()
    tokens = np.concatenate([s.tokens[: s.num_tokens] for s in open_shards(corpus, "heldout")]).astype(np.int64)
    starts = np.random.default_rng(0).integers(0, len(tokens) - seq_len, size=windows)
    batch = torch.tensor(np.stack([tokens[s:s + seq_len] for s in starts]))
    alive: list[torch.Tensor] = []
    hooks = [m.ffn.up.register_forward_hook(lambda _m, _i, y: alive.append((y > 0).flatten(0, -2).any(0)))
             for m in model.backbone.layers]
    model(input_ids=batch)
    for h in hooks:
        h.remove()
    fired = torch.cat(alive)
    return float(1 - fired.float().mean())


def run(out: Path, *, tiny: bool = False, data: Path | None = None) -> Report:
    if data is None:
        raise ValueError("activations needs the data directory (ATTNLAB_DATA or --data)")
    steps = 30 if tiny else 1000
    inner = (TINY if tiny else RECIPE)["model"]["intermediate_size"]
    rows, losses = [], []
    for kind in KINDS:
        gated = kind.endswith("glu")
        size = int(round(inner * 2 / 3)) if gated else inner  # 3 matrices of d x 2/3·4d = 2 of d x 4d
        r = train_char(out, f"act-{kind}", {"model": {"activation": kind, "intermediate_size": size},
                                             "train": {"max_steps": steps}}, data=data, tiny=tiny)
        dead = dead_share(r["model_dir"], r["corpus"], 64) if kind == "relu" else None
        params = sum(p.numel() for p in load(r["model_dir"]).parameters())
        losses.append(r["val_loss"])
        rows.append([kind, size, params, round(r["val_loss"], 4), f"{dead:.1%}" if dead is not None else "n/a",
                     r.get("tokens_per_s", "")])
    figure = bar_plot(out / f"{NAME}.png", list(KINDS), {"val loss": losses}, ylabel="held-out loss (nats/char)",
                      title="feed-forward activation at equal parameters")
    by = dict(zip(KINDS, losses))
    best_glu, best_plain = min(by["swiglu"], by["geglu"]), min(by["relu"], by["gelu"])
    holds = best_glu < best_plain
    verdict = (f"Val loss: " + ", ".join(f"{k} {v:.4f}" for k, v in by.items())
               + f". The best gated variant is {abs(best_plain - best_glu):.4f} "
               + ("better" if best_glu < best_plain else "worse") + " than the best ungated one"
               + (f"; {rows[0][4]} of ReLU's units never fire on held-out text." if rows[0][4] != "n/a" else "."))
    return Report(NAME, CLAIM, ["activation", "inner size", "parameters", "val loss", "dead units", "tokens/s"],
                  rows, verdict, holds, settings={"steps": steps, "tiny": tiny}, figure=figure,
                  notes=["Differences below ~0.01 nats are within run-to-run noise at this budget (one seed each)."])
