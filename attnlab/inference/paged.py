"""Paged KV cache (Kwon et al. 2023, "PagedAttention"): keys and values live in fixed-size blocks taken
from one shared pool, and each sequence owns a *block table*, the list of its blocks in order.

Why blocks: a contiguous per-request cache must be sized for the longest possible output, so most of it
sits empty; with blocks a sequence takes memory one block at a time and gives it back the moment it
finishes, so many more requests fit in the same memory and no request ever copies its history to grow.

Layout: per layer, a flat tensor of `num_blocks * block_size` token slots, each (kv_heads, head_dim);
one tensor per layer (not one stacked tensor) so that a compiled step can take them as separate,
non-aliasing inputs and update them in place.
Token j of a sequence lives in slot `table[j // block_size] * block_size + j % block_size`.
Block 0 is never handed out: it is the scratch slot that padding positions write to and read from
(always masked out by attention), so a batch can be a plain padded tensor with no special cases.

    >>> pool = BlockPool(num_layers=1, num_blocks=4, block_size=2, kv_heads=1, head_dim=1)
    >>> table = BlockTable()
    >>> pool.ensure(table, 3)          # room for 3 tokens = 2 blocks
    True
    >>> table.blocks, pool.num_free
    ([1, 2], 1)
    >>> pool.free(table); pool.num_free
    3

`PagedBatchCache` is what `Attention` sees during one forward pass of the engine (the `cache.update`
hook): new keys are written into their slots, then each row's whole history is gathered into a
padded (B, kv_heads, K, d) tensor, right-aligned so that the ordinary left-padding attention mask and
positions of `Encoder` apply unchanged.

Sliding-window models (Mistral) roll here too: after each pass a sequence gives back the blocks wholly
older than its window (`BlockPool.trim`), so it holds at most ceil((W - 1) / block_size) + 1 blocks
however long it runs, and the freed blocks serve other requests.
"""
from __future__ import annotations

import math
import threading

import torch

from ..nn.cpu_attention import paged_decode_attention

SCRATCH_BLOCK = 0


class BlockTable:
    """One sequence's blocks, in order, and how many tokens are stored in them. Under a sliding window
    the leading blocks that no query can see any more go back to the pool (`BlockPool.trim`); `dropped`
    counts them, so token j still lives in block `j // block_size - dropped` of the list."""

    def __init__(self) -> None:
        self.blocks: list[int] = []
        self.length = 0  # tokens whose keys/values are written
        self.dropped = 0  # leading blocks given back (a rolling window)

    def first_held(self, block_size: int) -> int:
        """The oldest token whose keys/values are still held."""
        return self.dropped * block_size

    def slots(self, start: int, end: int, block_size: int) -> list[int]:
        return [self.blocks[j // block_size - self.dropped] * block_size + j % block_size for j in range(start, end)]


class BlockPool:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is scratch), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        slots = num_blocks * block_size
        # zeros, not empty: masked slots still enter the softmax-weighted sum as 0 * value, which must
        # never be 0 * NaN
        shape = (slots, kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._free = list(range(num_blocks - 1, SCRATCH_BLOCK, -1))  # pop() hands out low ids first
        self._lock = threading.Lock()  # the server reads num_free from another thread

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int = 16, dtype: torch.dtype | None = None) -> "BlockPool":
        """dtype: the keys' and values' (default: the model's parameters'); fp16 halves the pool's memory
        and the bytes a decoding step reads, rounding each key and value to fp16 (as llama.cpp's default
        cache does)."""
        cfg = model.config
        p = next(model.parameters())
        return cls(cfg.num_layers, num_blocks, block_size, cfg.kv_heads, cfg.dim_head, dtype or p.dtype, p.device)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def capacity_blocks(self) -> int:
        """Blocks a sequence can ever hold (all but the scratch block)."""
        return self.num_blocks - 1

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def ensure(self, table: BlockTable, tokens: int) -> bool:
        """Grow `table` to hold `tokens` tokens. False (and nothing taken) when the pool is too empty."""
        need = self.blocks_for(tokens) - table.dropped - len(table.blocks)
        if need <= 0:
            return True
        with self._lock:
            if need > len(self._free):
                return False
            table.blocks += [self._free.pop() for _ in range(need)]
        return True

    def free(self, table: BlockTable) -> None:
        with self._lock:
            self._free += reversed(table.blocks)
        table.blocks, table.length, table.dropped = [], 0, 0

    def trim(self, table: BlockTable, window: int | None) -> None:
        """Sliding-window attention (Mistral): the next query, at position `table.length`, sees keys from
        length - window + 1 on; give back every leading block that lies wholly before that."""
        if window is None:
            return
        n = (table.length - window + 1) // self.block_size - table.dropped
        if n > 0:
            with self._lock:
                self._free += reversed(table.blocks[:n])
            table.blocks, table.dropped = table.blocks[n:], table.dropped + n

    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.keys[0][0].numel() * self.keys[0].element_size()


def slot_rows(held: list[list[int]], device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's slots, oldest first, as the paged attention kernel reads them: all rows' slots in one int64
    tensor, and the offsets where each row's begin (B + 1 of them, the last the total)."""
    offsets = [0]
    for h in held:
        offsets.append(offsets[-1] + len(h))
    return (torch.tensor([s for h in held for s in h], dtype=torch.long, device=device),
            torch.tensor(offsets, dtype=torch.long, device=device))


class PagedBatchCache:
    """The `past_key_values` of one engine forward pass over B sequences.

    Row i has `past[i]` tokens cached and `new[i]` new tokens in this pass; the inputs are left-padded to
    T = max(new), and the keys are gathered right-aligned into K = max(past + new) columns. Then for
    every row the query in column c has absolute key column c + (K - T): one causal offset for the
    whole batch, so `Encoder` only needs `get_seq_length() = K - T` and a left-padded mask (B, K).
    """

    def __init__(self, pool: BlockPool, tables: list[BlockTable], new: list[int], window: int | None = None) -> None:
        """window: a sliding-window model's W; each row then holds (and gathers) only its recent blocks,
        and `position_ids` (absolute positions of the new tokens) must be passed to the model, since the
        mask no longer starts at each row's first token."""
        bs = pool.block_size
        self.pool, self.window = pool, window
        past = [t.length for t in tables]
        total = [p + n for p, n in zip(past, new)]
        held = [tot - t.first_held(bs) for t, tot in zip(tables, total)]
        self.t, self.k = max(new), max(held)
        write, read = [], []
        mask = torch.zeros(len(tables), self.k, dtype=torch.long)
        positions = torch.zeros(len(tables), self.t, dtype=torch.long)
        self._held = []  # each row's slots, oldest first (for `decode_attention`)
        for i, (table, p, n, tot, h) in enumerate(zip(tables, past, new, total, held)):
            write += [SCRATCH_BLOCK] * (self.t - n) + table.slots(p, tot, bs)
            self._held.append(table.slots(tot - h, tot, bs))
            read += [SCRATCH_BLOCK] * (self.k - h) + self._held[-1]
            mask[i, self.k - h:] = 1
            positions[i, self.t - n:] = torch.arange(p, tot)
        device = pool.keys[0].device
        self.write = torch.tensor(write, dtype=torch.long, device=device)
        self.read = torch.tensor(read, dtype=torch.long, device=device)
        self.attention_mask = mask.to(device)
        self.position_ids = positions.to(device)
        self.tables, self.new = tables, new
        self._rows = None  # each row's slots without padding, for `decode_attention` (built on first use)

    def decode_attention(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         scale: float) -> torch.Tensor | None:
        """A decoding step (one new token a row, no sliding window): write the new keys and values, then
        attend over each row's own slots in place (nn/cpu_attention.py), with no padded copy. None when
        that is not this step's case or machine's: then `update` and SDPA."""
        if self.t != 1 or self.window is not None or any(n != 1 for n in self.new) or q.size(2) != 1:
            return None
        keys, values = self.pool.keys[layer_idx], self.pool.values[layer_idx]
        if self._rows is None:
            self._rows = slot_rows(self._held, keys.device)
        if not keys.is_contiguous() or keys.dtype not in (torch.float32, torch.float16) or q.dtype != torch.float32:
            return None
        if q.device.type != "cpu":
            return None
        self._write(layer_idx, k, v)  # the new token sees itself
        return paged_decode_attention(q, keys, values, *self._rows, scale)  # (None: `update` writes them again)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.k - self.t

    def _write(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """The new tokens' keys and values into their slots of the pool."""
        b, h, t, d = k.shape
        keys, values = self.pool.keys[layer_idx], self.pool.values[layer_idx]
        keys.index_copy_(0, self.write, k.transpose(1, 2).reshape(b * t, h, d).to(keys.dtype))
        values.index_copy_(0, self.write, v.transpose(1, 2).reshape(b * t, h, d).to(values.dtype))

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, h, t, d = k.shape
        keys, values = self.pool.keys[layer_idx], self.pool.values[layer_idx]
        self._write(layer_idx, k, v)
        k_all = keys.index_select(0, self.read).view(b, self.k, h, d).transpose(1, 2)
        v_all = values.index_select(0, self.read).view(b, self.k, h, d).transpose(1, 2)
        return k_all.to(k.dtype), v_all.to(v.dtype)  # (a pool kept in fp16 is read back in the model's dtype)

    def commit(self) -> None:
        """After the forward pass: the new tokens are now part of each sequence's history."""
        for table, n in zip(self.tables, self.new):
            table.length += n
            self.pool.trim(table, self.window)
