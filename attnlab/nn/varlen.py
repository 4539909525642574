"""Unpadded ("varlen") batches: the real tokens of a padded batch, concatenated.

A padded batch of B rows × T positions where only N positions are real wastes (B·T - N)/(B·T) of every
linear layer's work (on real sentence mixes, most of it). Unpadding is a representation, not a fork:
embeddings, every linear layer, FFN and norm run on the (N, d) tokens alone; only attention, which must
know where each sequence starts and ends, scatters its Q/K/V back into (B, T) for the kernel and gathers
the result. The batch is unpadded once after the embeddings and re-padded once at the end.

>>> mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
>>> v = Varlen.from_mask(mask)
>>> v.indices.tolist(), v.cu_seqlens.tolist()
([0, 1, 2, 3], [0, 3, 4])
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Varlen:
    indices: torch.Tensor      # (N,) positions of the real tokens in the flattened (B*T) batch
    cu_seqlens: torch.Tensor   # (B+1,) cumulative sequence lengths: row i is tokens cu[i]:cu[i+1]
    batch: int
    seq_len: int
    padding: torch.Tensor      # the (B, T) mask it came from, for attention's key-padding mask

    @classmethod
    def from_mask(cls, mask: torch.Tensor) -> "Varlen":
        mask = mask.bool()
        lengths = mask.sum(-1)
        cu = torch.zeros(mask.size(0) + 1, dtype=torch.int32, device=mask.device)
        cu[1:] = lengths.cumsum(0)
        return cls(mask.flatten().nonzero().flatten(), cu, mask.size(0), mask.size(1), mask)

    @property
    def num_tokens(self) -> int:
        return self.indices.numel()

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...)"""
        return x.reshape(self.batch * self.seq_len, *x.shape[2:]).index_select(0, self.indices)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...) with zeros at padding positions."""
        out = x.new_zeros(self.batch * self.seq_len, *x.shape[1:])
        out.index_copy_(0, self.indices, x)
        return out.view(self.batch, self.seq_len, *x.shape[1:])
