"""Unpadded ("varlen") batches: the real tokens of a padded batch, concatenated.

A padded batch of B rows × T positions where only N positions are real wastes (B·T - N)/(B·T) of every
linear layer's work (on real sentence mixes, most of it). Unpadding is a representation, not a fork:
embeddings, every linear layer, FFN and norm run on the (N, d) tokens alone; only attention, which must
know where each sequence starts and ends, scatters its Q/K/V back into (B, T) for the kernel and gathers
the result. The batch is unpadded once after the embeddings and re-padded once at the end.

`sizes_per_octave` rounds the row count up with padding positions appended after the real ones (computed,
never copied back by `pad`) to one of that many sizes between each power of two and the next (16: at most
1/16 more rows): batches of every length then share a few row counts, and the allocator and oneDNN see the
same sizes again instead of a new one per batch (see `Encoder.unpad_sizes_per_octave`).

>>> mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
>>> v = Varlen.from_mask(mask)
>>> v.indices.tolist(), v.cu_seqlens.tolist()
([0, 1, 2, 3], [0, 3, 4])
>>> Varlen.from_mask(mask, sizes_per_octave=1).indices.tolist()  # 4 real rows (4 is a size), no more
[0, 1, 2, 3]
>>> Varlen.from_mask(torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]), sizes_per_octave=1).indices.tolist()
[0, 1, 2, 4, 5, 3, 6, 7]
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
    real: int = -1             # the first `real` indices are real tokens; any after them are padding rows

    def __post_init__(self) -> None:
        if self.real < 0:
            self.real = self.indices.numel()

    @classmethod
    def from_mask(cls, mask: torch.Tensor, sizes_per_octave: int = 0) -> "Varlen":
        """`sizes_per_octave` > 0: append padding positions until the row count is the next of the sizes
        (or the whole batch, if that comes first); 0 keeps the real tokens only."""
        mask = mask.bool()
        lengths = mask.sum(-1)
        cu = torch.zeros(mask.size(0) + 1, dtype=torch.int32, device=mask.device)
        cu[1:] = lengths.cumsum(0)
        flat = mask.flatten()
        indices = flat.nonzero().flatten()
        real = indices.numel()
        extra = min(rounded_rows(real, sizes_per_octave) - real, flat.numel() - real)
        if extra:
            indices = torch.cat([indices, (~flat).nonzero().flatten()[:extra]])
        return cls(indices, cu, mask.size(0), mask.size(1), mask, real)

    @property
    def num_tokens(self) -> int:
        """Rows of the unpadded layout (the real tokens and any rounding rows)."""
        return self.indices.numel()

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...)"""
        return x.reshape(self.batch * self.seq_len, *x.shape[2:]).index_select(0, self.indices)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...) with zeros at padding positions (rounding rows are dropped)."""
        out = x.new_zeros(self.batch * self.seq_len, *x.shape[1:])
        out.index_copy_(0, self.indices[:self.real], x[:self.real])
        return out.view(self.batch, self.seq_len, *x.shape[1:])


def rounded_rows(n: int, sizes_per_octave: int) -> int:
    """n rounded up to a multiple of 2**floor(log2 n) / sizes_per_octave (at least 1): with 16, 1000 -> 1024
    (a multiple of 32), 5000 -> 5120 (of 256). 0 returns n."""
    if sizes_per_octave <= 0 or n <= 0:
        return n
    step = max(1, (1 << (n.bit_length() - 1)) // sizes_per_octave)
    return -(-n // step) * step
