"""Attention as one self-contained web page: the data and an inline script in a single HTML file that
works offline in any browser (nothing is fetched: no CDN, no fonts, no network).

Three views, after bertviz's idea (Vig 2019) but our own drawing:
  head    tokens on two sides, lines weighted by attention; layer/head selectors; hover a token to see
          only its lines; sentence A/B filters for pairs; cross-attention reads the source tokens
  model   every layer × head as a small map (row = query, column = key); a decoder's upper triangle is
          empty; click a map to open it in the head view
  neuron  one query against every key: q, k, q⊙k, q·k, the scaled score and the softmax, next to the
          weight the model itself returned

    >>> import torch
    >>> from attnlab.viz.attention import AttentionData
    >>> html = render_page(AttentionData(["a", "b"], [torch.tensor([[[1.0, 0.0], [0.5, 0.5]]])], causal=True))
    >>> html.startswith("<!DOCTYPE html>") and "http" not in html.split("<script>")[1]
    True
"""
from __future__ import annotations

import html as html_lib
import json
from importlib import resources
from pathlib import Path

from .attention import AttentionData, extract_text

VIEWS = ("head", "model", "neuron")
TEMPLATE = "page_template.html"


def _template() -> str:
    return resources.files(__package__).joinpath(TEMPLATE).read_text(encoding="utf-8")


def _script_json(value) -> str:
    """JSON that is safe inside <script>: a token like "</script>" or "<!--" must not end the script."""
    return json.dumps(value, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")


def render_page(data: AttentionData, *, view: str = "head", layer: int = 0, head: int | None = None) -> str:
    """The HTML of the page; `view`, `layer` and `head` (None = all heads) say what it opens on."""
    if view not in VIEWS:
        raise ValueError(f"view must be one of {', '.join(VIEWS)}, not {view!r}")
    if not 0 <= layer < data.num_layers:
        raise ValueError(f"layer {layer} does not exist: the model has layers 0..{data.num_layers - 1}")
    if head is not None and not 0 <= head < data.num_heads:
        raise ValueError(f"head {head} does not exist: the model has heads 0..{data.num_heads - 1}")
    initial = {"view": view, "layer": layer, "head": head}
    page = _template()
    for marker, value in (("__ATTNLAB_DATA__", _script_json(data.to_json())),
                          ("__ATTNLAB_INITIAL__", _script_json(initial)),
                          ("__ATTNLAB_TITLE__", html_lib.escape(data.title or "Attention"))):
        page = page.replace(marker, value, 1)
    return page


def attention_page(model, tokenizer, text: str, text_b: str | None = None, *, view: str = "head",
                   layer: int = 0, head: int | None = None, title: str = "") -> str:
    """Text in, page HTML out: what `attnlab viz` writes and what a server can answer at /viz."""
    data = extract_text(model, tokenizer, text, text_b, neuron=True, neuron_fallback=layer, title=title)
    return render_page(data, view=view, layer=layer, head=head)


def write_page(path: str | Path, page: str) -> Path:
    """Write the page atomically (a reader never sees half a file)."""
    from ..interop.files import atomic_write
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))
    return path
