"""The key/value cache that makes decoding incremental.

A causal layer's keys and values for positions < t never change once computed, so generation keeps
them and feeds only the newest token through the stack: step t costs O(t) attention instead of
re-running the whole O(t^2) prefix. `Attention` calls `cache.update(layer_idx, k, v)` with this
step's keys/values (B, Hkv, T_new, d) and attends over what it returns, (B, Hkv, T_past + T_new, d).

Buffers are preallocated to `max_length` (when known) so that a step writes in place instead of
concatenating, which would copy the whole history every token; they grow by doubling otherwise.
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, max_length: int | None = None) -> None:
        self.num_layers = num_layers
        self.max_length = max_length
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.lengths = [0] * num_layers

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

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` (beam search: each surviving beam continues some earlier beam)."""
        for i in range(self.num_layers):
            if self.keys[i] is not None:
                n = self.lengths[i]
                self.keys[i][:, :, :n] = self.keys[i][index, :, :n]
                self.values[i][:, :, :n] = self.values[i][index, :, :n]

    def crop(self, length: int) -> None:
        """Forget everything after the first `length` tokens."""
        self.lengths = [min(n, length) for n in self.lengths]

    def __len__(self) -> int:
        return self.get_seq_length()
