"""Which token may see which: the attention pattern of a model's own mask recipe, as a heatmap.

For a sliding window (Mistral, ModernBERT's local layers) and Longformer it is `AttentionMask.build` with
the model's window and the chosen global tokens (their rows and columns are full, Beltagy et al. 2020,
Fig. 2d); for BigBird it is `nn.block_sparse.token_counts`: the first and last block rows and columns, the
3-block band and the random blocks (Zaheer et al. 2020, Fig. 1). Nothing is run through the model: this is
the mask its attention applies, drawn cell by cell.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..config import ModelConfig
from ..nn.attention import AttentionMask
from ..nn.block_sparse import draw_random_blocks, token_counts, uses_blocks


def attention_pattern(config: ModelConfig, length: int, global_tokens: list[int] | None = None, *,
                      layer: int = 0, head: int = 0, seed: int = 0) -> tuple[torch.Tensor, str]:
    """((T, T) bool, True = query row may attend to key column; a one-line description). BigBird's random
    blocks are drawn as in training (generator seeded with `seed`); in eval mode transformers draws none."""
    if config.attention_kind == "block_sparse":
        if global_tokens:
            raise ValueError("--global-tokens: BigBird's global tokens are its first and last blocks, not chosen ones")
        block, r = config.sparse_block_size, config.num_random_blocks
        padded = -(-length // block) * block
        if not uses_blocks(padded, block, r):
            return torch.ones(length, length, dtype=torch.bool), \
                f"full attention: {length} tokens are at most (5 + 2 * {r}) blocks of {block}"
        random = draw_random_blocks(padded // block, r, head + 1, torch.Generator().manual_seed(seed))
        allowed = token_counts(padded, block, r, random[head:head + 1])[0, :length, :length] > 0
        return allowed, f"BigBird blocks of {block}: global first/last block, 3-block window, {r} random " \
                        f"block(s) per row (head {head}, training draw, seed {seed})"
    glob = None
    if global_tokens:
        bad = [i for i in global_tokens if not 0 <= i < length]
        if bad:
            raise ValueError(f"--global-tokens {bad} outside the {length} tokens of the input")
        glob = torch.zeros(1, length, dtype=torch.bool)
        glob[0, global_tokens] = True
    every = config.extra.get("global_every")
    window = config.sliding_window if config.sliding_window and not (every and layer % every == 0) else None
    mask = AttentionMask.build(None, length, length, causal=config.causal, window=window, global_tokens=glob,
                               device="cpu")
    allowed = mask.allowed
    if allowed is None:
        full = torch.ones(length, length, dtype=torch.bool)
        allowed = full.tril() if mask.is_causal else full
    parts = ["causal" if config.causal else "bidirectional"] + ([f"window |i - j| < {window}"] if window else []) \
        + ([f"global tokens {global_tokens}"] if glob is not None else [])
    return allowed.reshape(length, length), ", ".join(parts)


def save_pattern(allowed: torch.Tensor, tokens: list[str], path: str | Path, title: str = "") -> Path:
    """The (T, T) pattern as a PNG: a dark cell = the row's token may attend to the column's token."""
    from .heatmaps import _pyplot
    plt = _pyplot()
    path = Path(path)
    n = allowed.size(0)
    size = min(14.0, max(4.0, 0.22 * n + 1.5))
    fig, ax = plt.subplots(figsize=(size + 0.5, size))
    ax.imshow(allowed.float().numpy(), cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
    if n <= 80:  # token labels while they stay readable
        ax.set_xticks(range(n), tokens, rotation=90, fontsize=6)
        ax.set_yticks(range(n), tokens, fontsize=6)
    ax.set_xlabel("key (may be attended to)"), ax.set_ylabel("query")
    seen = allowed.sum(1).float()
    ax.set_title(f"{title}\nkeys per query: {seen.min():.0f}-{seen.max():.0f} of {n} "
                 f"({allowed.float().mean():.0%} of the matrix)", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
