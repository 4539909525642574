"""5. Post-LN needs warmup. The original Transformer normalises after each residual addition (post-LN) and
trains with a learning-rate warmup; Xiong et al. (2020, "On Layer Normalization in the Transformer
Architecture") show that post-LN's gradients near the output are large at initialisation, so without
warmup it trains badly or diverges, while pre-LN (normalise inside the branch, as GPT-2 and LLaMA do) can
skip the warmup. Measured: the character recipe, pre-LN vs post-LN, with and without warmup, at the
recipe's learning rate and at a higher one."""
from __future__ import annotations

import math
from pathlib import Path

from .charlm import train_char
from .report import Report, line_plot

NAME = "warmup"
CLAIM = "A post-LN Transformer needs a learning-rate warmup to train well; a pre-LN one does not."


def run(out: Path, *, tiny: bool = False, data: Path | None = None) -> Report:
    if data is None:
        raise ValueError("warmup needs the data directory (ATTNLAB_DATA or --data)")
    steps = 30 if tiny else 600  # the warmup's effect is early; 8 runs must fit the ~15-minute budget
    lrs = [1e-3] if tiny else [1e-3, 3e-3]
    results, rows, series = {}, [], {}
    for lr in lrs:
        for placement in ("pre", "post"):
            for warmup in (100 if not tiny else 5, 0):
                key = f"{placement}-LN, warmup {warmup}, lr {lr:g}"
                r = train_char(out, f"{placement}-w{warmup}-lr{lr:g}", {
                    "model": {"norm_placement": placement},
                    "train": {"warmup_steps": warmup, "lr": lr, "max_steps": steps}}, data=data, tiny=tiny)
                results[key] = r
                early = [loss for _, loss in r["curve"][:max(1, len(r["curve"]) // 10)]]
                rows.append([placement + "-LN", warmup, lr, round(r["val_loss"], 4) if math.isfinite(r["val_loss"])
                             else "diverged", round(max(early), 3) if early else "", r.get("tokens_per_s", "")])
                series[key] = [loss for _, loss in r["curve"]]
    steps_axis = [s for s, _ in next(iter(results.values()))["curve"]]
    figure = line_plot(out / f"{NAME}.png", steps_axis, series, xlabel="step", ylabel="training loss",
                       title="character GPT: pre-LN vs post-LN, with and without warmup", logy=True)

    def val(placement, warmup, lr):
        return results[f"{placement}-LN, warmup {warmup}, lr {lr:g}"]["val_loss"]
    w = 100 if not tiny else 5
    lr = lrs[-1]
    post_cost = val("post", 0, lr) - val("post", w, lr)
    pre_cost = val("pre", 0, lr) - val("pre", w, lr)
    holds = post_cost > max(0.02, 2 * pre_cost)
    if not (math.isfinite(post_cost) or math.isfinite(pre_cost)):
        holds = None
    verdict = (f"At lr {lr:g}, dropping the warmup costs post-LN {post_cost:+.3f} val loss and pre-LN "
               f"{pre_cost:+.3f}" + (f" (at lr {lrs[0]:g}: post-LN {val('post', 0, lrs[0]) - val('post', w, lrs[0]):+.3f}, "
                                     f"pre-LN {val('pre', 0, lrs[0]) - val('pre', w, lrs[0]):+.3f})" if len(lrs) > 1 else "")
               + ". " + ("Post-LN depends on the warmup far more than pre-LN." if holds else
                         "At this depth (4 layers) the difference is small: Xiong et al.'s effect grows with depth "
                         "and learning rate."))
    return Report(NAME, CLAIM, ["norm", "warmup steps", "peak lr", "val loss", "max train loss, first 10%",
                                "tokens/s"], rows, verdict, holds,
                  settings={"steps": steps, "model": "4x128 char GPT" if not tiny else "tiny", "tiny": tiny},
                  figure=figure)
