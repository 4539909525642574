"""2. Parallel vs sequential. An RNN computes position t after position t−1: T dependent steps per layer,
however many cores there are. A Transformer layer computes every position at once (Vaswani et al. 2017,
sec. 4: O(1) sequential operations vs O(n) for recurrence), at O(n²·d) attention cost.

Measured: training throughput (forward + backward + SGD step, tokens/s) of one causal Transformer layer
vs one LSTM layer with the same number of parameters, at a fixed number of tokens per batch, as the
sequence length grows."""
from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from torch import nn

from ..config import ModelConfig
from ..nn.attention import AttentionMask
from ..nn.block import Block
from .report import Report, line_plot

NAME = "parallel"
CLAIM = ("Self-attention processes all positions in parallel, so a Transformer layer trains faster than a "
         "recurrent layer of the same size, which must step through the sequence.")


def lstm_hidden_for(params: int, width: int) -> int:
    """Hidden size h of an LSTM over `width` inputs with about `params` parameters: 4h(width + h) + 8h."""
    return max(1, round((-(width + 2) + math.sqrt((width + 2) ** 2 + params)) / 2))


class _Transformer(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.block = Block(ModelConfig(hidden_size=width, num_heads=heads, intermediate_size=4 * width,
                                       causal=True, norm_placement="pre", dropout=0.0, attention_dropout=0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x, AttentionMask(None, True))[0]


class _LSTM(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.rnn = nn.LSTM(width, hidden, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]


def throughput(model: nn.Module, width: int, batch: int, length: int, steps: int) -> float:
    """Training tokens/s: forward, a sum loss, backward, SGD step; the first step is warm-up."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(batch, length, width)
    elapsed = 0.0
    for step in range(steps + 1):
        started = time.perf_counter()
        model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step:
            elapsed += time.perf_counter() - started
    return batch * length * steps / elapsed


def run(out: Path, *, tiny: bool = False, data: Path | None = None) -> Report:
    width, heads = (64, 2) if tiny else (256, 4)
    tokens = 1024 if tiny else 8192
    lengths = [16, 64] if tiny else [32, 64, 128, 256, 512, 1024, 2048]
    steps = 2 if tiny else 5
    torch.manual_seed(0)
    transformer = _Transformer(width, heads)
    params = sum(p.numel() for p in transformer.parameters())
    lstm = _LSTM(width, lstm_hidden_for(params, width))
    lstm_params = sum(p.numel() for p in lstm.parameters())
    rows, t_series, l_series = [], [], []
    for length in lengths:
        batch = max(1, tokens // length)
        # interleaved, so that a slow minute on a shared machine hits both sides
        t = throughput(transformer, width, batch, length, steps)
        r = throughput(lstm, width, batch, length, steps)
        t_series.append(t)
        l_series.append(r)
        rows.append([length, batch, round(t), round(r), f"{t / r:.2f}x"])
    figure = line_plot(out / f"{NAME}.png", lengths, {f"Transformer layer ({params / 1e3:.0f}k params)": t_series,
                                                      f"LSTM layer ({lstm_params / 1e3:.0f}k params)": l_series},
                       xlabel="sequence length (tokens per batch fixed)", ylabel="training tokens/s",
                       title=f"one layer, width {width}, {torch.get_num_threads()} threads", logx=True, logy=True)
    faster = [t > r for t, r in zip(t_series, l_series)]
    holds = True if all(faster) else False if not any(faster) else None
    best = max(range(len(lengths)), key=lambda i: t_series[i] / l_series[i])
    verdict = (f"The Transformer layer trains at {t_series[0] / l_series[0]:.1f}x the LSTM's tokens/s at length "
               f"{lengths[0]} and {t_series[-1] / l_series[-1]:.1f}x at {lengths[-1]} (best {t_series[best] / l_series[best]:.1f}x "
               f"at {lengths[best]}), with equal parameters and tokens per batch.")
    if holds is None:
        cross = [lengths[i] for i, f in enumerate(faster) if not f]
        why = ("attention's O(n²) cost catches up" if min(cross) > lengths[best] else
               "with few steps per sequence the recurrence costs little, and the attention layer's fixed "
               "per-call overheads dominate")
        verdict += f" The LSTM is faster at length(s) {cross}: {why}."
    return Report(NAME, CLAIM, ["length", "batch", "Transformer tokens/s", "LSTM tokens/s", "ratio"], rows,
                  verdict, holds, settings={"width": width, "heads": heads, "tokens_per_batch": tokens,
                                            "transformer_params": params, "lstm_params": lstm_params,
                                            "lstm_hidden": lstm.rnn.hidden_size, "tiny": tiny},
                  notes=["On a GPU the gap is much larger: there the LSTM's T dependent steps leave most of "
                         "the device idle, while on 2 CPU cores even the parallel layer has few lanes to fill."],
                  figure=figure)
