"""Attention as PNG heatmaps for reports (matplotlib, drawn off-screen): an overview of every layer ×
head, and one head at full size with its tokens on the axes."""
from __future__ import annotations

from pathlib import Path

from .attention import AttentionData


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt
    return plt


def save_heatmaps(data: AttentionData, path: str | Path, *, layer: int = 0, head: int = 0,
                  cross: bool = False) -> list[Path]:
    """Write `path` (all layers × heads) and `<stem>-L{layer}H{head}.png` (one head with its tokens).

    A decoder's maps show their empty upper triangle; `cross=True` draws cross-attention instead."""
    plt = _pyplot()
    path = Path(path)
    weights = data.cross if cross else data.layers
    if weights is None:
        raise ValueError("this attention data has no cross-attention")
    keys = data.source_tokens if cross else data.tokens
    kind = "cross-attention" if cross else ("causal self-attention" if data.causal else "self-attention")
    title = f"{data.title} — {kind}" if data.title else kind
    path.parent.mkdir(parents=True, exist_ok=True)

    L, H = len(weights), weights[0].shape[0]
    fig, axes = plt.subplots(L, H, figsize=(1.1 * H + 0.6, 1.1 * L + 0.8), squeeze=False)
    for l in range(L):
        for h in range(H):
            ax = axes[l][h]
            ax.imshow(weights[l][h].numpy(), cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks([]), ax.set_yticks([])
            if l == 0:
                ax.set_title(f"head {h}", fontsize=7)
            if h == 0:
                ax.set_ylabel(f"layer {l}", fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

    detail = path.with_name(f"{path.stem}-L{layer}H{head}{path.suffix or '.png'}")
    w = weights[layer][head].numpy()
    size = max(4.0, 0.28 * max(w.shape) + 1.5)
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    im = ax.imshow(w, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=8)
    ax.set_yticks(range(len(data.tokens)), data.tokens, fontsize=8)
    ax.set_xlabel("key (attended to)"), ax.set_ylabel("query")
    ax.set_title(f"{title}: layer {layer}, head {head}", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    fig.savefig(detail, dpi=110)
    plt.close(fig)
    return [path, detail]


def save_alignment(weights, source_tokens: list[str], target_tokens: list[str], path: str | Path,
                   title: str = "") -> Path:
    """One (target x source) attention matrix with its tokens on the axes: the alignment plot of an
    RNN encoder-decoder with attention (Bahdanau et al. 2015, Fig. 3)."""
    plt = _pyplot()
    path = Path(path)
    w = weights.detach().float().cpu().numpy()
    if w.shape != (len(target_tokens), len(source_tokens)):
        raise ValueError(f"alignment has shape {w.shape}; expected ({len(target_tokens)}, {len(source_tokens)})")
    fig, ax = plt.subplots(figsize=(0.45 * len(source_tokens) + 2, 0.4 * len(target_tokens) + 1.5))
    ax.imshow(w, cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks(range(len(source_tokens)), source_tokens, rotation=90, fontsize=8)
    ax.set_yticks(range(len(target_tokens)), target_tokens, fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("target (each row: where the decoder looked)")
    ax.set_title(title or "alignment", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
