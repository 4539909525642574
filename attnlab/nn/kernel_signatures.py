"""What each C function of `csrc/` takes, declared once, and the check of a call against it (nn/kernels.py).

A pointer argument is declared as a tensor: `Buf` (contiguous, its element count a function of the other
arguments) or `Strided` (any element strides with the last dimension contiguous, its shape a function of
the others; the door passes the pointer and the strides of its first three dimensions, so C reads exactly
the tensor's elements). `checks` are conditions on the arguments the C code assumes (a GQA group size, a
block type, a tile that fits its stack buffer). `rows` says that the function works on a range [start, end)
of rows (appended by the door, which splits the range over threads); `parallel` names the C function that
takes the same arguments and a thread count, and splits the range over csrc/thread_pool.c's workers.
"""
from __future__ import annotations

import ctypes

import torch

F32, BF16, F16, I8, U8, I32, I64 = (torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int32,
                                    torch.int64)
FLOAT_ROWS = (F32, BF16)
BLOCK_BYTES = {2: 18, 3: 20, 8: 34}  # GGML type id -> bytes per block of 32 weights (Q4_0, Q4_1, Q8_0)
_PLAIN = (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer) if hasattr(torch.nn, "Buffer") else \
    (torch.Tensor, torch.nn.Parameter)


class KernelArgumentError(ValueError):
    """A call that does not match the C function's declared signature (raised before C runs)."""


class Int:
    c = ctypes.c_int64

    def __init__(self, name: str) -> None:
        self.name = name


class Int32(Int):
    c = ctypes.c_int


class Float(Int):
    c = ctypes.c_float


class Buf:
    """A contiguous tensor: dtype one of `dtypes`, `numel(args)` elements (None: any), None allowed if optional."""

    def __init__(self, name: str, dtypes, numel=None, optional: bool = False) -> None:
        self.name, self.dtypes, self.numel, self.optional = name, dtypes, numel, optional


class Strided(Buf):
    """A tensor of shape `shape(args)`, last dimension contiguous; `writes`: C writes it, so no two of its
    elements may share memory."""

    def __init__(self, name: str, dtypes, shape, writes: bool = False) -> None:
        super().__init__(name, dtypes)
        self.shape, self.writes = shape, writes


def int8_packed_bytes(K: int, N: int) -> int:
    """Bytes of `int8_pack_b`'s copy of a (K, N) int8 matrix: panels of 16 columns, K in quads."""
    return (N + 15) // 16 * 16 * ((K + 3) // 4 * 4)


def _rb(a) -> int:
    return a["K"] // 32 * BLOCK_BYTES[a["kind"]]


def _row_ranges(offsets: torch.Tensor, n: int) -> bool:
    return (offsets.dtype == I64 and offsets.numel() >= 2 and int(offsets[0]) == 0 and int(offsets[-1]) == n
            and bool((offsets[1:] > offsets[:-1]).all()))


def _within(slots: torch.Tensor, size: int) -> bool:
    if slots.dtype != I64 or slots.numel() == 0:
        return False
    low, high = torch.aminmax(slots)
    return int(low) >= 0 and int(high) < size


_KIND = (lambda a: a["kind"] in BLOCK_BYTES, "kind is a GGML block type (2 Q4_0, 3 Q4_1, 8 Q8_0)")
_K32 = (lambda a: a["K"] > 0 and a["K"] % 32 == 0, "K a positive multiple of 32")
_SAME = (lambda *names: (lambda a: all(a[n].dtype == a[names[0]].dtype for n in names),
                         f"{', '.join(names)} of one dtype"))
_FLAG = (lambda flag, t: (lambda a: a[flag] == int(a[t].dtype == BF16), f"{flag} == ({t} is bfloat16)"))

def _paged(cache: torch.dtype) -> dict:
    """paged_decode_attention's signature over a pool of `cache` elements (fp32, or fp16: --kv-dtype fp16)."""
    return {
        "args": [Buf("q", (F32,), lambda a: a["B"] * a["Hq"] * a["D"]),
                 Buf("keys", (cache,), lambda a: a["S"] * a["Hk"] * a["D"]),
                 Buf("values", (cache,), lambda a: a["S"] * a["Hk"] * a["D"]),
                 Int("S"), Int("B"), Int("Hq"), Int("Hk"), Int("D"),
                 Buf("slots", (I64,), lambda a: a["N"]), Buf("offsets", (I64,), lambda a: a["B"] + 1), Int("N"),
                 Float("scale"), Buf("out", (F32,), lambda a: a["B"] * a["Hq"] * a["D"])],
        "checks": [(lambda a: a["Hk"] > 0 and a["Hq"] % a["Hk"] == 0, "Hq a multiple of Hk"),
                   (lambda a: 0 < a["D"] and a["D"] % 16 == 0 and a["Hq"] // a["Hk"] * a["D"] <= 4096,
                    "D a multiple of 16 and (Hq / Hk) x D <= 4096"),
                   (lambda a: _row_ranges(a["offsets"], a["N"]), "offsets rise from 0 to N, one slot or more a row"),
                   (lambda a: _within(a["slots"], a["S"]), "every slot in [0, S)")],
        "rows": lambda a: a["B"] * a["Hk"],
        "parallel": "paged_decode_attention" + ("_par" if cache == F32 else "_f16_par")}


SIGNATURES: dict[str, dict] = {
    "ggml_exact": {"args": [Int32("on")], "status": False},
    "ggml_matmul": {"args": [Int32("kind"), Buf("x", (F32,), lambda a: a["M"] * a["K"]), Int("M"), Int("K"),
                             Buf("w", (U8,), lambda a: a["N"] * _rb(a)), Int("N"),
                             Buf("out", (F32,), lambda a: a["M"] * a["N"])], "checks": [_KIND, _K32]},
    "ggml_matmul_cols": {"args": [Int32("kind"), Buf("x", (F32,), lambda a: a["M"] * a["K"]), Int("M"), Int("K"),
                                  Buf("w", (U8,), lambda a: a["N"] * _rb(a)), Int("N"),
                                  Buf("out", (F32,), lambda a: a["M"] * a["N"])], "checks": [_KIND, _K32],
                         "rows": lambda a: a["N"], "parallel": "ggml_matmul_cols_par"},
    "ggml_matvec_step": {"args": [Int32("kind"), Buf("x", (F32,), lambda a: a["K"]), Int("K"),
                                  Buf("w", (U8,), lambda a: a["N"] * _rb(a)), Int("N"),
                                  Buf("out", (F32,), lambda a: a["N"])], "checks": [_KIND, _K32]},
    "ggml_x16_supported": {"args": [], "status": False},
    "ggml_x16_pack": {"args": [Int32("kind"), Buf("w", (U8,), lambda a: a["N"] * _rb(a)), Int("N"), Int("K"),
                               Buf("out", (U8,), lambda a: a["N"] * a["K"] // 32 * 20), Int32("parts")],
                      "checks": [(lambda a: a["kind"] in (2, 3), "kind 2 (Q4_0) or 3 (Q4_1)"),
                                 (lambda a: a["parts"] >= 1, "parts >= 1"),
                                 (lambda a: a["N"] > 0 and a["N"] % 16 == 0, "N a positive multiple of 16"),
                                 (lambda a: 0 < a["K"] <= 65536 and a["K"] % 32 == 0,
                                  "K a multiple of 32 up to 65,536")]},
    "ggml_x16_step": {"args": [Buf("w", (U8,), lambda a: a["N"] * a["K"] // 32 * 20),
                               Buf("x", (F32,), lambda a: a["K"]), Int("K"), Int("N"),
                               Buf("out", (F32,), lambda a: a["N"]), Int32("parts")],
                      "checks": [(lambda a: a["N"] > 0 and a["N"] % 16 == 0, "N a positive multiple of 16"),
                                 (lambda a: 0 < a["K"] <= 65536 and a["K"] % 32 == 0,
                                  "K a multiple of 32 up to 65,536"),
                                 (lambda a: a["parts"] >= 1, "parts >= 1")]},
    **{fn: {"args": [Int32("kind"), Buf("w", (U8,), lambda a: a["rows"] * _rb(a)), Int("rows"), Int("K"),
                     Buf("ids", (I64,), lambda a: a["n"]), Int("n"), Buf("out", (dt,), lambda a: a["n"] * a["K"])],
            "checks": [_KIND, _K32]} for fn, dt in (("ggml_rows", F32), ("ggml_rows_bf16", BF16))},
    "int8_quantize_rows": {"args": [Buf("x", (F32,), lambda a: a["rows"] * a["cols"]),
                                    Buf("factors", (F32,), lambda a: a["cols"], optional=True), Int("rows"),
                                    Int("cols"), Buf("q", (I8,), lambda a: a["rows"] * a["cols"]),
                                    Buf("scale", (F32,), lambda a: a["rows"])]},
    "int8_quantize_rows_u7": {"args": [Buf("x", (F32,), lambda a: a["rows"] * a["cols"]),
                                       Buf("factors", (F32,), lambda a: a["cols"], optional=True), Int("rows"),
                                       Int("cols"), Buf("q", (U8,), lambda a: a["rows"] * a["cols"]),
                                       Buf("scale", (F32,), lambda a: a["rows"]),
                                       Buf("zero", (I32,), lambda a: a["rows"])]},
    "int8_dequant_rows": {"args": [Buf("acc", (I32,), lambda a: a["rows"] * a["cols"]),
                                   Buf("scale", (F32,), lambda a: a["rows"]),
                                   Buf("weight_scale", (F32,), lambda a: a["cols"]),
                                   Buf("bias", (F32,), lambda a: a["cols"], optional=True), Int("rows"), Int("cols")]},
    "int8_gemm_supported": {"args": [], "status": False},
    "int8_pack_b": {"args": [Buf("b", (I8,), lambda a: a["K"] * a["N"]), Int("K"), Int("N"),
                             Buf("out", (I8,), lambda a: int8_packed_bytes(a["K"], a["N"])),
                             Buf("colsum", (I32,), lambda a: a["N"])]},
    "int8_gemm": {"args": [Buf("a", (U8,), lambda a: a["M"] * a["K"]), Buf("ascale", (F32,), lambda a: a["M"]),
                           Buf("zero", (I32,), lambda a: a["M"]), Int("M"), Int("K"),
                           Buf("packed", (I8,), lambda a: int8_packed_bytes(a["K"], a["N"])),
                           Buf("colsum", (I32,), lambda a: a["N"]), Buf("weight_scale", (F32,), lambda a: a["N"]),
                           Buf("bias", (F32,), lambda a: a["N"], optional=True), Int("N"),
                           Buf("y", (F32,), lambda a: a["M"] * a["N"]), Int32("act")],
                  "checks": [(lambda a: a["act"] in (0, 1), "act 0 (none) or 1 (GELU, erf form)")],
                  "rows": lambda a: a["M"]},
    "int8_amx_supported": {"args": [], "status": False},
    "int8_amx_gemm": {"args": [Buf("a", (I8,), lambda a: a["M"] * a["K"]), Buf("ascale", (F32,), lambda a: a["M"]),
                               Int("M"), Int("K"), Buf("packed", (I8,), lambda a: int8_packed_bytes(a["K"], a["N"])),
                               Buf("weight_scale", (F32,), lambda a: a["N"]),
                               Buf("bias", (F32,), lambda a: a["N"], optional=True), Int("N"),
                               Buf("y", (F32,), lambda a: a["M"] * a["N"]), Int32("act")],
                      "checks": [(lambda a: a["act"] in (0, 1), "act 0 (none) or 1 (GELU, erf form)"),
                                 (lambda a: a["K"] % 64 == 0 and a["N"] % 16 == 0,
                                  "K a multiple of 64 and N of 16 (whole tiles)")],
                      "rows": lambda a: a["M"]},
    "int8_vnni_supported": {"args": [], "status": False},
    "int8_vnni_gemm": {"args": [Buf("a", (I8,), lambda a: a["M"] * a["K"]), Buf("ascale", (F32,), lambda a: a["M"]),
                                Int("M"), Int("K"), Buf("packed", (I8,), lambda a: int8_packed_bytes(a["K"], a["N"])),
                                Buf("colsum", (I32,), lambda a: a["N"]), Buf("weight_scale", (F32,), lambda a: a["N"]),
                                Buf("bias", (F32,), lambda a: a["N"], optional=True), Int("N"),
                                Buf("y", (F32,), lambda a: a["M"] * a["N"]), Int32("act")],
                       "checks": [(lambda a: a["act"] in (0, 1), "act 0 (none) or 1 (GELU, erf form)")],
                       "rows": lambda a: a["M"]},
    "short_attention_supported": {"args": [], "status": False},
    "short_attention": {
        "args": [Strided("q", (F32,), lambda a: (a["B"], a["Hq"], a["Tq"], a["D"])),
                 Strided("k", (F32,), lambda a: (a["B"], a["Hk"], a["Tk"], a["D"])),
                 Strided("v", (F32,), lambda a: (a["B"], a["Hk"], a["Tk"], a["D"])),
                 Int("B"), Int("Hq"), Int("Hk"), Int("Tq"), Int("Tk"), Int("D"),
                 Buf("keep", (U8,), lambda a: a["B"] * a["Tk"], optional=True), Float("scale"),
                 Buf("out", (F32,), lambda a: a["B"] * a["Tq"] * a["Hq"] * a["D"])],
        "checks": [(lambda a: a["Hk"] > 0 and a["Hq"] % a["Hk"] == 0, "Hq a multiple of Hk"),
                   (lambda a: 0 < a["D"] <= 128 and a["D"] % 16 == 0, "D a multiple of 16 up to 128"),
                   (lambda a: 0 < a["Tk"] and a["D"] * ((a["Tk"] + 15) // 16 * 16) <= 16384,
                    "1 <= Tk and D x Tk (padded to 16) <= 16384")],
        "rows": lambda a: a["B"] * a["Hq"]},
    "paged_decode_attention": _paged(F32),
    "paged_decode_attention_f16": _paged(F16),
    "silu_mul_rows": {"args": [Buf("gate", FLOAT_ROWS), Buf("up", FLOAT_ROWS, lambda a: a["gate"].numel()),
                               Buf("out", FLOAT_ROWS, lambda a: a["gate"].numel()), Int32("bf16")],
                      "checks": [_SAME("gate", "up", "out"), _FLAG("bf16", "gate")],
                      "rows": lambda a: a["gate"].numel()},
    "rms_norm_rows": {"args": [Buf("x", FLOAT_ROWS), Buf("weight", FLOAT_ROWS, lambda a: a["cols"]),
                               Buf("out", FLOAT_ROWS, lambda a: a["x"].numel()), Int("cols"), Float("eps"),
                               Int32("bf16")],
                      "checks": [(lambda a: a["cols"] > 0 and a["x"].numel() % a["cols"] == 0,
                                  "x's element count a multiple of cols"),
                                 _SAME("x", "weight", "out"), _FLAG("bf16", "x")],
                      "rows": lambda a: a["x"].numel() // a["cols"]},
    "rope_rows": {
        "args": [Strided("x", FLOAT_ROWS, lambda a: (a["x"].size(0), a["H"], a["T"], a["D"])),
                 Buf("cos", FLOAT_ROWS, lambda a: (a["x"].size(0) if a["cs_batch"] else 1) * a["T"] * a["D"]),
                 Buf("sin", FLOAT_ROWS, lambda a: a["cos"].numel()), Int("cs_batch"), Int32("cs_bf16"),
                 Strided("out", FLOAT_ROWS, lambda a: tuple(a["x"].shape), writes=True),
                 Int("H"), Int("T"), Int("D"), Int32("bf16")],
        "checks": [(lambda a: a["x"].dim() == 4 and a["D"] > 0 and a["D"] % 2 == 0, "x 4-D, D even"),
                   (lambda a: a["cs_batch"] in (0, a["T"] * a["D"]), "cs_batch 0 or T x D"),
                   _SAME("x", "out"), _SAME("cos", "sin"), _FLAG("bf16", "x"), _FLAG("cs_bf16", "cos"),
                   (lambda a: a["bf16"] or not a["cs_bf16"], "fp32 x with fp32 cos/sin")],
        "rows": lambda a: a["x"].size(0) * a["H"] * a["T"]},
    "lse_tile_rows": {
        "args": [Buf("logits", FLOAT_ROWS, lambda a: a["target"].numel() * a["cols"]), Int("cols"), Int32("bf16"),
                 Buf("target", (I64,)), Int("v0"), *(Buf(n, (F32,), lambda a: a["target"].numel())
                                                     for n in ("run_max", "run_sum", "picked"))],
        "checks": [(lambda a: a["cols"] > 0, "cols >= 1"), _FLAG("bf16", "logits")],
        "rows": lambda a: a["target"].numel()},
    "dropout_rows": {"args": [Buf("x", FLOAT_ROWS), Buf("out", FLOAT_ROWS, lambda a: a["x"].numel()), Int("cols"),
                              Int("seed"), Int("threshold"), Float("scale"), Int32("bf16")],
                     "checks": [(lambda a: a["cols"] > 0 and a["x"].numel() % a["cols"] == 0,
                                 "x's element count a multiple of cols"),
                                (lambda a: 0 <= a["threshold"] < 1 << 32, "threshold in [0, 2^32)"),
                                _SAME("x", "out"), _FLAG("bf16", "x")],
                     "rows": lambda a: a["x"].numel() // a["cols"]},
    "causal_attention_supported": {"args": [], "status": False},
    "causal_attention_bf16": {
        "args": [Strided("q", (BF16,), lambda a: (a["q"].size(0), a["H"], a["T"], a["D"])),
                 Strided("k", (BF16,), lambda a: (a["q"].size(0), a["Hk"], a["T"], a["D"])),
                 Strided("v", (BF16,), lambda a: (a["q"].size(0), a["Hk"], a["T"], a["D"])),
                 Strided("out", (BF16,), lambda a: tuple(a["q"].shape), writes=True),
                 Int("H"), Int("Hk"), Int("T"), Int("D"), Float("scale")],
        "checks": [(lambda a: a["q"].dim() == 4, "q 4-D"), (lambda a: a["D"] in (64, 128), "D 64 or 128"),
                   (lambda a: a["Hk"] > 0 and a["H"] % a["Hk"] == 0, "H a multiple of Hk")],
        "rows": lambda a: a["q"].size(0) * a["Hk"]},
}

# kernel (csrc/<name>.c) -> the CPU flags its code needs on x86-64 and the C probe saying the build has them
KERNELS: dict[str, dict] = {
    "ggml_blocks": {"needs": (), "probe": None},
    "int8_rows": {"needs": (), "probe": None},
    "int8_gemm": {"needs": ("avx2", "fma"), "probe": "int8_gemm_supported"},
    "int8_amx": {"needs": ("amx_int8", "amx_tile", "avx512f"), "probe": "int8_amx_supported",
                 "probe_fails": "built without AMX, or the OS did not grant the tile registers (Linux >= 5.16)"},
    "short_attention": {"needs": ("avx2", "fma"), "probe": "short_attention_supported"},  # or avx512f
    "fused_rows": {"needs": (), "probe": None},
    "causal_attention": {"needs": ("avx512f", "avx512_bf16"), "probe": "causal_attention_supported"},
    "paged_attention": {"needs": (), "probe": None},
    "dropout": {"needs": (), "probe": None},
    "ggml_x16": {"needs": ("avx2", "fma", "f16c"), "probe": "ggml_x16_supported",  # or avx512 with vnni
                 "probe_fails": "built with AVX-512 but without AVX512-VNNI, or without AVX2"},
    "int8_vnni": {"needs": ("avx512f", "avx512bw", "avx512_vnni"), "probe": "int8_vnni_supported"},
}


def ctypes_args(sig: dict) -> list:
    out = []
    for spec in sig["args"]:
        if isinstance(spec, Strided):
            out += [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]
        elif isinstance(spec, Buf):
            out.append(ctypes.c_void_p)
        else:
            out.append(spec.c)
    return out + ([ctypes.c_int64, ctypes.c_int64] if "rows" in sig else [])


def _dense(t: torch.Tensor) -> bool:
    """No two elements share memory: strides, smallest first, each cover the dimensions below them."""
    expected = 1
    for stride, size in sorted(zip(t.stride(), t.shape)):
        if size > 1:
            if stride < expected:
                return False
            expected = stride * size
    return True


def _code(spec) -> int:
    return 3 if isinstance(spec, Strided) else 2 if isinstance(spec, Buf) else 1 if spec.c is ctypes.c_float else 0


for _sig in SIGNATURES.values():  # what the fast path below reads, worked out once
    _sig["names"] = tuple(spec.name for spec in _sig["args"])
    _sig["codes"] = tuple(_code(spec) for spec in _sig["args"])
    _sig.setdefault("checks", [])


def _fast(sig: dict, args: tuple) -> tuple[list, int | None] | None:
    """The check of a call as a few attribute reads per argument: (C values, rows), or None when anything is
    off (then `_explain` says what). Runs on every kernel call."""
    if len(args) != len(sig["names"]):
        return None
    a = dict(zip(sig["names"], args))
    for ok, _ in sig["checks"]:
        if not ok(a):
            return None
    values = []
    for code, spec, v in zip(sig["codes"], sig["args"], args):
        if code == 0:
            if type(v) is not int:
                return None
            values.append(v)
        elif code == 1:
            if type(v) is not float and type(v) is not int:
                return None
            values.append(v)
        elif v is None:
            if not spec.optional:
                return None
            values.append(None)
        elif type(v) not in _PLAIN or not v.is_cpu or v.dtype not in spec.dtypes:
            return None
        elif code == 2:
            if not v.is_contiguous() or (spec.numel is not None and v.numel() != spec.numel(a)):
                return None
            values.append(v.data_ptr())
        else:
            st = v.stride()
            if (v.shape != spec.shape(a) or (st[-1] != 1 and v.size(-1) > 1)
                    or (spec.writes and not _dense(v))):
                return None
            values.append(v.data_ptr())
            values.append((ctypes.c_int64 * 3)(*st[:3]))
    return values, (sig["rows"](a) if "rows" in sig else None)


def check_args(fn: str, sig: dict, args: tuple) -> tuple[list, int | None]:
    """(the C argument values, the row count or None), or KernelArgumentError naming fn and the argument."""
    try:
        done = _fast(sig, args)
    except Exception:  # noqa: BLE001  (a check that cannot even be evaluated: `_explain` names it)
        done = None
    if done is None:
        _explain(fn, sig, args)
    return done


def _explain(fn: str, sig: dict, args: tuple) -> None:
    """Raise the KernelArgumentError that says which argument of `fn` is off, and how."""
    specs = sig["args"]
    if len(args) != len(specs):
        raise KernelArgumentError(f"{fn}: expected {len(specs)} arguments "
                                  f"({', '.join(s.name for s in specs)}), got {len(args)}")
    a = {}
    for spec, value in zip(specs, args):
        where = f"C kernel function {fn}, argument {spec.name}"
        if not isinstance(spec, Buf):
            if isinstance(value, torch.Tensor) or not isinstance(value, (int, float)) or (
                    spec.c is not ctypes.c_float and not isinstance(value, int)):
                raise KernelArgumentError(f"{where}: expected a Python {'float' if spec.c is ctypes.c_float else 'int'}"
                                          f", got {type(value).__name__}")
        elif value is None:
            if not spec.optional:
                raise KernelArgumentError(f"{where}: expected a tensor, got None")
        elif type(value) not in _PLAIN:
            raise KernelArgumentError(f"{where}: expected a plain torch.Tensor, got {type(value).__name__}")
        elif value.device.type != "cpu":
            raise KernelArgumentError(f"{where}: expected a CPU tensor, got one on {value.device}")
        elif value.dtype not in spec.dtypes:
            raise KernelArgumentError(f"{where}: expected dtype {' or '.join(map(str, spec.dtypes))}, "
                                      f"got {value.dtype}")
        elif isinstance(spec, Strided):
            if value.dim() and value.stride(-1) != 1 and value.size(-1) > 1:
                raise KernelArgumentError(f"{where}: expected the last dimension contiguous, got strides "
                                          f"{tuple(value.stride())}")
            if spec.writes and not _dense(value):
                raise KernelArgumentError(f"{where}: an output whose elements overlap (strides "
                                          f"{tuple(value.stride())}, shape {tuple(value.shape)})")
        elif not value.is_contiguous():
            raise KernelArgumentError(f"{where}: expected a contiguous tensor, got strides {tuple(value.stride())} "
                                      f"for shape {tuple(value.shape)}")
        a[spec.name] = value
    for ok, what in sig.get("checks", ()):
        try:
            good = ok(a)
        except (IndexError, KeyError, TypeError, RuntimeError):  # e.g. a 0-d tensor where a 4-D one belongs
            good = False
        if not good:
            raise KernelArgumentError(f"C kernel function {fn}: expected {what}, got "
                                      + ", ".join(f"{k}={_show(v)}" for k, v in a.items()))
    values = []
    for spec in specs:
        value = a[spec.name]
        if isinstance(spec, Strided):
            try:
                want = tuple(spec.shape(a))
            except (IndexError, RuntimeError):
                want = "a 4-D tensor"
            if tuple(value.shape) != want:
                raise KernelArgumentError(f"C kernel function {fn}, argument {spec.name}: expected shape {want}, "
                                          f"got {tuple(value.shape)}")
            values += [value.data_ptr(), (ctypes.c_int64 * 3)(*value.stride()[:3])]
        elif isinstance(spec, Buf):
            if value is not None and spec.numel is not None and value.numel() != spec.numel(a):
                raise KernelArgumentError(f"C kernel function {fn}, argument {spec.name}: expected "
                                          f"{spec.numel(a)} elements, got {value.numel()} (shape "
                                          f"{tuple(value.shape)})")
            values.append(None if value is None else value.data_ptr())
        else:
            values.append(value)
    raise KernelArgumentError(f"C kernel function {fn}: the arguments do not match its signature "
                              f"({', '.join(f'{k}={_show(v)}' for k, v in a.items())})")


def _show(v) -> str:
    if isinstance(v, torch.Tensor):
        return f"{v.dtype} {tuple(v.shape)}"
    return repr(v)
