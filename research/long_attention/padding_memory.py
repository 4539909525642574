"""Peak memory of SDPA with a dense padding + causal mask vs the tiled path with the same mask (forward,
one causal layer B=1 H=4 d=64; the last 1/8 of the row is padding). Memory only: run with
MALLOC_MMAP_THRESHOLD_=65536 (see benchmarks/long_attention.py), which also slows the tiled loop.

    MALLOC_MMAP_THRESHOLD_=65536 OMP_NUM_THREADS=1 python research/long_attention/padding_memory.py
"""
import os, sys, json, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
import long_attention as la
from attnlab.nn.attention import AttentionMask, scaled_dot_product_attention
rows = []
for t in (2048, 4096, 8192):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, t, 64, generator=g) for _ in range(3))
    pad = torch.ones(1, t, dtype=torch.long); pad[0, t - t // 8:] = 0   # the last 1/8 is padding
    for name, tiled in (("sdpa+padding mask", False), ("tiled+padding", True)):
        def f():
            with torch.no_grad():
                scaled_dot_product_attention(q, k, v, AttentionMask.build(pad, t, t, causal=True), tiled=tiled)
        sec, peak = la.measure(f)
        rows.append((name, t, round(sec, 3), round(peak / 2**20, 1), os.getloadavg()[0]))
        print(rows[-1], flush=True)
