"""`attnlab explore MODEL`: an interactive explorer of a model in the browser (offline, loopback by default).

The page (static/) calls a small JSON API (app.py) over one loaded model (session.py): tokens, every
layer and head's attention, one head's Q, K, V, scores, mask, softmax and weighted sum for a chosen
token; a decoder's next-token distribution under temperature / top-k / top-p, stepped with its KV cache
(decoding.py); fill-mask, sentence similarity and translation with cross-attention (tasks.py); the
parameter counts and FLOPs with their formulas (info.py).

    >>> from attnlab.explore import Explorer, create_app
    >>> app = create_app(Explorer.load("minilm"))
"""
from __future__ import annotations

from .app import create_app
from .session import ExploreError, Explorer

__all__ = ["Explorer", "ExploreError", "create_app"]
