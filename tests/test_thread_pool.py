"""The kernels' worker threads (csrc/thread_pool.c): a product or an attention step split over 1-4 threads
gives the same bits as on one; several Python threads calling at once each get their own answer (a busy pool
runs the caller's range alone); a forked child starts its own workers; a bad range is refused in C."""
from __future__ import annotations

import ctypes
import multiprocessing
import threading

import pytest
import torch

from attnlab.nn import kernels
from attnlab.nn.cpu_attention import paged_decode_attention
from attnlab.nn.kernel_signatures import SIGNATURES

from test_paged_attention import case

needs_kernel = pytest.mark.skipif(not kernels.active("ggml_blocks"), reason="no C compiler for the kernels")
Q4_1, K, N = 3, 256, 300  # N not a multiple of any thread count: uneven parts


@pytest.fixture
def threads():
    """torch.set_num_threads for the test, restored after it (the door splits over torch's thread count)."""
    before, grad = torch.get_num_threads(), torch.is_grad_enabled()
    yield torch.set_num_threads
    torch.set_num_threads(before)
    torch.set_grad_enabled(grad)


def blocks(seed: int = 0) -> torch.Tensor:
    """Random Q4_1 blocks for an (N, K) matrix: fp16 scale and minimum, then 16 bytes of 4-bit codes."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (N, K // 32, 20), dtype=torch.uint8, generator=g)
    dm = (torch.rand(N, K // 32, 2, generator=g) * 0.1).half().view(torch.uint8).view(N, K // 32, 4)
    raw[..., :4] = dm
    return raw.reshape(N, K // 32 * 20).contiguous()


def product(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.size(0), N)
    kernels.call("ggml_matmul_cols", Q4_1, x, x.size(0), K, w, N, out, min_rows=1)
    return out


@needs_kernel
def test_every_thread_count_gives_the_same_bits(threads):
    assert SIGNATURES["ggml_matmul_cols"]["parallel"] == "ggml_matmul_cols_par"
    w = blocks()
    for m in (1, 3, 8, 13):
        x = torch.randn(m, K, generator=torch.Generator().manual_seed(m))
        threads(1)
        want = product(w, x)
        assert want.abs().sum() > 0
        for t in (2, 3, 4):
            threads(t)
            assert torch.equal(product(w, x), want), (m, t)
    q, keys, values, slots, offsets = case([1, 63, 65, 200, 17], 9, 3, 64)
    torch.set_grad_enabled(False)  # (the attention kernel serves inference only)
    threads(1)
    want = paged_decode_attention(q, keys, values, slots, offsets, 0.125)
    for t in (2, 3, 4):
        threads(t)
        assert torch.equal(paged_decode_attention(q, keys, values, slots, offsets, 0.125), want)
        half = paged_decode_attention(q, keys.half(), values.half(), slots, offsets, 0.125)
        threads(1)
        assert torch.equal(half, paged_decode_attention(q, keys.half(), values.half(), slots, offsets, 0.125))


@needs_kernel
def test_python_threads_calling_at_once_each_get_their_answer(threads):
    threads(2)
    w = blocks(1)
    xs = [torch.randn(5, K, generator=torch.Generator().manual_seed(100 + i)) for i in range(4)]
    want = [product(w, x) for x in xs]
    bad: list[str] = []

    def hammer(i: int) -> None:
        for _ in range(40):
            if not torch.equal(product(w, xs[i]), want[i]):
                bad.append(f"thread {i}")
                return

    workers = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in workers) and not bad


def _child(conn) -> None:
    torch.set_num_threads(2)
    x = torch.randn(7, K, generator=torch.Generator().manual_seed(7))
    conn.send(product(blocks(2), x).numpy().tobytes())  # bytes: a tensor would travel as a shared fd


@needs_kernel
def test_a_forked_child_starts_its_own_workers(threads):
    threads(2)
    x = torch.randn(7, K, generator=torch.Generator().manual_seed(7))
    want = product(blocks(2), x)  # the parent's workers are running now
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child,))
    proc.start()
    assert parent.poll(120), "the forked child did not answer: its kernel call hung"
    got = parent.recv()
    proc.join(30)
    assert proc.exitcode == 0 and got == want.numpy().tobytes()


@needs_kernel
def test_c_refuses_a_range_outside_the_matrix():
    lib, w = kernels.library(), blocks()
    x, out = torch.randn(1, K), torch.empty(1, N)
    ptr = ctypes.c_void_p

    def run(start, end, parts):
        return lib.ggml_matmul_cols_par(Q4_1, ptr(x.data_ptr()), 1, K, ptr(w.data_ptr()), N, ptr(out.data_ptr()),
                                        start, end, parts)

    assert run(0, N, 2) == 0
    assert run(0, N + 1, 2) == -1 and run(-1, N, 2) == -1 and run(5, 4, 2) == -1
