"""GET /viz for a running server: the page of `attnlab.viz.page`, made so that it stalls no one.

- Only the forward pass that yields the attention weights holds the model's lock (the decoding engine
  waits for it); the page's JSON, by far the longer part, is built after the lock is released.
- The weights are turned into JSON one slice at a time (one `json.dumps` per ~16k numbers). A single call
  over the whole page holds Python's global lock for seconds (json and `tolist` are C loops that never
  let go of it), and the event loop answering every other client, /health included, would wait as long.
- The page holds layers × heads × T² weights, so its size is capped (`Limits.max_viz_weights`): a text
  over the cap is refused before any forward pass, naming the cap and the longest text that fits.

The page is byte for byte what `render_page` makes (tests hold them equal).
"""
from __future__ import annotations

import copy
import json
import math
import uuid

import torch

from ..viz.attention import AttentionData
from ..viz.page import render_page

SLICE = 1 << 14  # numbers per json.dumps call: a few ms each


def page_weights(num_layers: int, num_heads: int, tokens: int) -> int:
    return num_layers * num_heads * tokens * tokens


def max_tokens(num_layers: int, num_heads: int, cap: int) -> int:
    """The longest text (in tokens) whose page holds at most `cap` weights."""
    return math.isqrt(cap // max(num_layers * num_heads, 1))


def _matrix_json(w: torch.Tensor, digits: int) -> str:
    """json.dumps(round(w).tolist()) for a (T, S) matrix (as AttentionData.to_json rounds), by row slices."""
    rows = max(1, SLICE // max(w.size(1), 1))
    parts = []
    for start in range(0, w.size(0), rows):
        part = torch.round(w[start:start + rows].double(), decimals=digits).tolist()
        parts.append(json.dumps(part, separators=(",", ":"))[1:-1])
    return "[" + ",".join(parts) + "]"


class _Deferred(AttentionData):
    """The same data, whose to_json leaves a marker where the self-attention weights go."""

    marker: str

    def to_json(self, digits: int = 4):
        light = copy.copy(self)
        light.layers = []
        out = AttentionData.to_json(light, digits)
        out["layers"] = self.marker
        return out


def render(data: AttentionData, *, view: str = "head", layer: int = 0, head: int | None = None,
           digits: int = 4) -> str:
    """`render_page(data, ...)`, with the weights serialized in slices (see the module docstring)."""
    deferred = copy.copy(data)
    deferred.__class__ = _Deferred
    deferred.marker = f"attnlab-weights-{uuid.uuid4().hex}"  # a quoted JSON string no token can equal by chance
    page = render_page(deferred, view=view, layer=layer, head=head)
    # tensors of floats: their JSON has no "<" or ">" (which render_page escapes for the <script> element)
    weights = "[" + ",".join("[" + ",".join(_matrix_json(w[h], digits) for h in range(w.size(0))) + "]"
                             for w in data.layers) + "]"
    return page.replace(json.dumps(deferred.marker), weights, 1)
