"""The key/value cache that makes decoding incremental.

A causal layer's keys and values for positions < t never change once computed, so generation keeps
them and feeds only the newest token through the stack: step t costs O(t) attention instead of
re-running the whole O(t^2) prefix. `Attention` calls `cache.update(layer_idx, k, v)` with this
step's keys/values (B, Hkv, T_new, d) and attends over what it returns, (B, Hkv, T_past + T_new, d).

Buffers are preallocated to `max_length` (when known) so that a step writes in place instead of
concatenating, which would copy the whole history every token; they grow by doubling otherwise.

A sliding-window layer (Mistral, Jiang et al. 2023, §2 "Rolling buffer cache") rolls: a query at position i
sees keys i - W < j <= i, so after a step only the last W - 1 keys can ever be needed again and the layer keeps
just those. `update` then returns those plus the new ones, starting at absolute position
`key_start(layer_idx)` (the Encoder drops the mask's columns before it). Memory stays O(W) however long
the generation; positions are already baked into the cached keys by RoPE.

    >>> cache = KVCache(1, windows=[3])
    >>> k = torch.zeros(1, 1, 5, 2)
    >>> cache.update(0, k, k)[0].shape[2], cache.keys[0].shape[2], cache.key_start(0)   # 5 seen, 2 kept
    (5, 2, 3)
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, max_length: int | None = None,
                 windows: list[int | None] | None = None) -> None:
        """windows: per layer, the sliding window W of a local layer (its cache rolls), None for a global one."""
        self.num_layers = num_layers
        self.max_length = max_length
        self.windows = list(windows) if windows is not None else [None] * num_layers
        if len(self.windows) != num_layers:
            raise ValueError(f"KVCache: {len(self.windows)} windows for {num_layers} layers")
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.lengths = [0] * num_layers

    @classmethod
    def for_model(cls, model, max_length: int | None = None) -> "KVCache":
        """The cache a causal LM decodes with: rolling in its sliding-window layers."""
        backbone = getattr(model, "backbone", model)
        cfg = model.config
        windows = [cfg.sliding_window if cfg.sliding_window and backbone._is_local(i) else None
                   for i in range(cfg.num_layers)]
        return cls(cfg.num_layers, max_length=max_length, windows=windows)

    def key_start(self, layer_idx: int) -> int:
        """Absolute position of the first key `update` returns next: 0, unless a window dropped older keys."""
        if self.windows[layer_idx] is None or self.keys[layer_idx] is None:
            return 0
        return self.lengths[layer_idx] - self.keys[layer_idx].size(2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens already cached (the position of the next token). Layer 0 is updated first in a
        forward pass, so the Encoder asks before any layer runs."""
        return self.lengths[layer_idx]

    def _grow(self, layer_idx: int, like: torch.Tensor, needed: int) -> None:
        old_k, old_v = self.keys[layer_idx], self.values[layer_idx]
        capacity = 0 if old_k is None else old_k.size(2)
        if self.max_length is not None and needed <= self.max_length:
            new_capacity = self.max_length
        else:
            new_capacity = max(needed, 2 * capacity, 64)
        b, h, _, d = like.shape
        k = like.new_empty(b, h, new_capacity, d)
        v = like.new_empty(b, h, new_capacity, d)
        n = self.lengths[layer_idx]
        if old_k is not None and n:
            k[:, :, :n] = old_k[:, :, :n]
            v[:, :, :n] = old_v[:, :, :n]
        self.keys[layer_idx], self.values[layer_idx] = k, v

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= layer_idx < self.num_layers:
            raise IndexError(f"KVCache has {self.num_layers} layers; got layer_idx={layer_idx}")
        if self.windows[layer_idx] is not None:
            return self._roll(layer_idx, k, v, self.windows[layer_idx])
        start = self.lengths[layer_idx]
        end = start + k.size(2)
        buf = self.keys[layer_idx]
        if buf is None or end > buf.size(2) or buf.shape[:2] != k.shape[:2] or buf.dtype != k.dtype:
            if buf is not None and (buf.shape[:2] != k.shape[:2] or buf.dtype != k.dtype) and start:
                raise ValueError(f"KVCache layer {layer_idx}: cached (batch, heads)={tuple(buf.shape[:2])} "
                                 f"{buf.dtype} but got {tuple(k.shape[:2])} {k.dtype}")
            self._grow(layer_idx, k, end)
        self.keys[layer_idx][:, :, start:end] = k
        self.values[layer_idx][:, :, start:end] = v
        self.lengths[layer_idx] = end
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def _roll(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor, window: int):
        """A window layer: attend over the kept keys + the new ones, then keep the last window - 1."""
        old_k, old_v = self.keys[layer_idx], self.values[layer_idx]
        if old_k is not None and old_k.size(2):
            if old_k.shape[:2] != k.shape[:2] or old_k.dtype != k.dtype:
                raise ValueError(f"KVCache layer {layer_idx}: cached (batch, heads)={tuple(old_k.shape[:2])} "
                                 f"{old_k.dtype} but got {tuple(k.shape[:2])} {k.dtype}")
            k_all, v_all = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        else:
            k_all, v_all = k, v
        n = k_all.size(2)
        keep_from = max(n - (window - 1), 0)
        kept_k, kept_v = k_all[:, :, keep_from:], v_all[:, :, keep_from:]
        if n > window:  # a view would keep the whole (long prompt's) tensor alive: copy the window out
            kept_k, kept_v = kept_k.clone(), kept_v.clone()
        self.keys[layer_idx], self.values[layer_idx] = kept_k, kept_v
        self.lengths[layer_idx] += k.size(2)
        return k_all, v_all

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` (beam search: each surviving beam continues some earlier beam)."""
        for i in range(self.num_layers):
            if self.windows[i] is not None and self.keys[i] is not None:
                self.keys[i], self.values[i] = self.keys[i][index], self.values[i][index]
            elif self.keys[i] is not None:
                n = self.lengths[i]
                self.keys[i][:, :, :n] = self.keys[i][index, :, :n]
                self.values[i][:, :, :n] = self.values[i][index, :, :n]

    def crop(self, length: int) -> None:
        """Forget everything after the first `length` tokens."""
        for i, n in enumerate(self.lengths):
            if self.windows[i] is not None and self.keys[i] is not None and length < n:
                start = self.key_start(i)
                if start:  # the keys a query at `length` would need are gone
                    raise ValueError(f"KVCache layer {i}: cannot crop a rolling window cache to {length} tokens "
                                     f"after it dropped the first {start}")
                self.keys[i], self.values[i] = self.keys[i][:, :, :length], self.values[i][:, :, :length]
        self.lengths = [min(n, length) for n in self.lengths]

    def __len__(self) -> int:
        return self.get_seq_length()
