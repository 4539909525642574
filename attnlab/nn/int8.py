"""An int8 linear layer that keeps an encoder's accuracy: int8 weights with one scale per output row, int8
activations with one scale per token, and optional SmoothQuant factors per input channel.

y = x W^T + b becomes, per token m and output n,

    y_mn = s_m w_n sum_k q(x_mk f_k / s_m) q(W_nk / (f_k w_n)) + b_n

- per-token scales s_m (not one scale per batch): one token with large activations no longer coarsens
  the grid of every other token in the batch;
- SmoothQuant (Xiao et al. 2023, §4): a few input channels carry activations 10-100x the others (the
  known outlier dimensions of BERT-style models). Dividing channel k by f_k and multiplying W's column k
  by f_k leaves the product unchanged but moves the range from the activations, quantized per token, into
  the weights, quantized per output row. f_k = max|X_k|^alpha / max|W_k|^(1-alpha), with max|X_k| from
  calibration text.

On CPUs with AMX-INT8 the product runs in `csrc/int8_amx.c` (the tiles, weights packed once, the scaling, bias
and GELU fused into the store) wherever the shape fills whole tiles (K a multiple of 64, N of 16); on CPUs with
AVX512-VNNI in `csrc/int8_vnni.c` (the same fusions, vpdpbusd on the codes offset by 128). Elsewhere it runs in
`torch._int_mm` (int8 x int8 -> int32), a VNNI instruction on CPUs that have one. On CPUs
with AVX2 and no VNNI, where `_int_mm` is a plain loop, it runs in `csrc/int8_gemm.c` (the exact integer sum
with the scaling fused in, weights packed once) on 7-bit activation codes with a zero point per token
(`quantize_rows_u7`): the byte product that makes that kernel fast cannot saturate on them. The element-wise
ends run in `csrc/int8_rows.c` (one pass each; torch ops as the fallback, same numbers).
On all-MiniLM-L6-v2 and 1,024 SST-2/CoNLL sentences, cosine of the mean-pooled embedding to fp32
(min / mean): per-token, no smoothing 0.983 / 0.9963; alpha 0.5 0.993 / 0.9986; alpha 0.7 0.996 / 0.9990
(torch.ao's per-tensor dynamic quantization: 0.933 / 0.984; ONNX Runtime's: 0.852 / 0.955).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .kernel_signatures import int8_packed_bytes
from .precision import cpu_flags

# int8 dot-product instructions: with them `_int_mm` is ~4.6x an fp32 matmul here (640x384 @ 384x1536,
# one thread, avx512_vnni); without them torch's CPU `_int_mm` is a plain loop, slower than fp32.
INT8_DOT = ("avx512_vnni", "avx_vnni", "amx_int8")


def int8_product(device: str = "cpu") -> str:
    """Which int8 product is fast here: "int_mm" (`torch._int_mm`: a CPU with VNNI or AMX-INT8, or CUDA),
    "avx2" (csrc/int8_gemm.c: AVX2 without int8 dot products, when the kernel is built), or "" (neither)."""
    if str(device).startswith("cuda") or any(f in cpu_flags() for f in INT8_DOT):
        return "int_mm"
    if str(device).startswith("cpu") and "avx2" in cpu_flags() and kernels.active("int8_gemm"):
        return "avx2"
    return ""


def _int_mm(q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`torch._int_mm` with the weight in row-major strides. A layer of one input feature holds a (1, N) weight
    with strides (1, 1), which torch calls contiguous; on a CPU `_int_mm` then returned sums of memory it should
    not read (torch 2.13). A row-major copy costs nothing at other shapes: they already are."""
    if w.size(0) > 0 and w.stride() != (w.size(1), 1):
        w = torch.empty(w.shape, dtype=w.dtype, device=w.device).copy_(w)
    return torch._int_mm(q, w)


def int8_codes(device: str = "cpu") -> str:
    """The activation codes an int8 layer made here uses: "u7" (7-bit with a zero point) where the AVX2 kernel
    runs the product (it needs them), "s8" (symmetric int8) everywhere else."""
    return "u7" if int8_product(device) == "avx2" else "s8"


def int8_is_fast(device: str = "cpu") -> bool:
    """True where Int8Linear's product has a fast kernel (see `int8_product`)."""
    return bool(int8_product(device))


def _c_ready(t: torch.Tensor | None) -> bool:
    """A buffer C can read as it is: None, or a plain contiguous fp32 CPU tensor (attribute checks only: `.to()`
    or `.half()` on the model may have changed it since construction)."""
    return t is None or (t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous())


def _rows_kernel_takes(x: torch.Tensor, factors: torch.Tensor | None) -> bool:
    """csrc/int8_rows.c can quantize these rows as they are (else torch does, with the same numbers)."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and _c_ready(factors)
            and (factors is None or factors.numel() == x.size(1)) and kernels.active("int8_rows"))


def quantize_rows(x: torch.Tensor, factors: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) fp32 -> (int8 rows, one fp32 scale per row), after multiplying the columns by `factors`."""
    rows, cols = x.shape
    if _rows_kernel_takes(x, factors):
        x = x.contiguous()
        q = torch.empty(rows, cols, dtype=torch.int8)
        scale = torch.empty(rows, 1, dtype=torch.float32)
        kernels.call("int8_quantize_rows", x, factors, rows, cols, q, scale)
        return q, scale
    if factors is not None:
        x = x * factors.float()
    amax = x.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return (x * (1 / scale)).round_().clamp_(-127, 127).to(torch.int8), scale


def quantize_rows_u7(x: torch.Tensor, factors: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, cols) fp32 -> (uint8 codes 0..127, one fp32 scale and one int32 zero point per row), after
    multiplying the columns by `factors`: x ~ (q - zero) * scale, with 0 exact (the zero point is a code)."""
    rows, cols = x.shape
    if _rows_kernel_takes(x, factors):
        x = x.contiguous()
        q = torch.empty(rows, cols, dtype=torch.uint8)
        scale = torch.empty(rows, 1, dtype=torch.float32)
        zero = torch.empty(rows, 1, dtype=torch.int32)
        kernels.call("int8_quantize_rows_u7", x, factors, rows, cols, q, scale, zero)
        return q, scale, zero
    if factors is not None:
        x = x * factors.float()
    lo, hi = x.amin(-1, keepdim=True).clamp(max=0), x.amax(-1, keepdim=True).clamp(min=0)
    scale = torch.where(hi > lo, (hi - lo) / 127, torch.ones_like(hi))
    r = 1 / scale
    zero = (-lo * r).round_().clamp_(max=127)
    q = ((x * r).round_() + zero).nan_to_num_(0.0).clamp_(0, 127).to(torch.uint8)
    return q, scale, zero.to(torch.int32)


class Int8Linear(nn.Module):
    """Inference-only. Holds `weight_q` as (in, out) int8 (the layout `_int_mm` reads), `weight_scale` (out,),
    `bias` (out,) or None and `factors` (in,): the SmoothQuant divisors applied to x, or None. `codes`: how
    activations are quantized, "s8" (`quantize_rows`) or "u7" (`quantize_rows_u7`); None picks what the
    product on this CPU is fastest with (`int8_codes`). Both paths of a layer (C kernels or torch) give the
    same integer sums for the same codes."""

    def __init__(self, weight_q: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None,
                 factors: torch.Tensor | None, codes: str | None = None) -> None:
        super().__init__()
        if weight_q.dim() != 2 or weight_q.dtype != torch.int8:
            raise ValueError(f"Int8Linear: weight_q must be a 2-D int8 (in, out) tensor, got {weight_q.dtype} "
                             f"{tuple(weight_q.shape)}")
        codes = int8_codes(str(weight_q.device)) if codes is None else codes
        if codes not in ("s8", "u7"):
            raise ValueError(f"Int8Linear: codes must be 's8' or 'u7', got {codes!r}")
        self.codes = codes
        self.in_features, self.out_features = weight_q.shape
        # sizes once here (C reads them by these counts); dtype, device and layout, which .to() may change,
        # are checked at each call
        for name, t, n in (("weight_scale", weight_scale, self.out_features), ("bias", bias, self.out_features),
                           ("factors", factors, self.in_features)):
            if t is not None and (not t.is_floating_point() or t.numel() != n):
                raise ValueError(f"Int8Linear: {name} must hold {n} floats, got {t.dtype} {tuple(t.shape)}")
        self.register_buffer("weight_q", weight_q)
        self.register_buffer("weight_scale", weight_scale)
        self.register_buffer("bias", bias)
        self.register_buffer("factors", factors)

    @classmethod
    def from_linear(cls, linear: nn.Linear, smooth: torch.Tensor | None = None,
                    codes: str | None = None) -> "Int8Linear":
        """`smooth` (in,): SmoothQuant's f; W's columns are multiplied by it, x's divided."""
        w = linear.weight.detach().float()
        if smooth is not None:
            w = w * smooth
        scale = w.abs().amax(1).clamp(min=1e-12) / 127
        q = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        return cls(q.t().contiguous(), scale, bias, None if smooth is None else (1 / smooth).float(),
                   codes or int8_codes(str(linear.weight.device)))

    @classmethod
    def stacked(cls, parts: list["Int8Linear"]) -> "Int8Linear | None":
        """One layer computing the parts' outputs side by side (Q, K and V from one product), or None when
        the parts do not see the same input the same way (different smoothing factors)."""
        first = parts[0].factors
        if any((p.factors is None) != (first is None) or (first is not None and not torch.equal(p.factors, first))
               or p.codes != parts[0].codes for p in parts):
            return None
        biases = [p.bias if p.bias is not None else p.weight_scale.new_zeros(p.out_features) for p in parts]
        bias = None if all(p.bias is None for p in parts) else torch.cat(biases)
        return cls(torch.cat([p.weight_q for p in parts], 1).contiguous(),
                   torch.cat([p.weight_scale for p in parts]), bias, first, parts[0].codes)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized (out, in) fp32 matrix the layer multiplies by (smoothing undone): for inspection."""
        w = self.weight_q.t().float() * self.weight_scale[:, None]
        return w if self.factors is None else w * self.factors

    def _amx_ready(self) -> bool:
        """The AMX product can take this call: symmetric codes, whole tiles (K a multiple of 64, N of 16), a CPU
        with AMX-INT8 whose OS grants the tiles, and the scales and bias plain fp32 as the kernel reads them."""
        return (self.codes == "s8" and self.in_features % 64 == 0 and self.out_features % 16 == 0
                and self.weight_q.device.type == "cpu" and "amx_int8" in cpu_flags() and kernels.active("int8_amx")
                and _c_ready(self.weight_scale) and _c_ready(self.bias))

    def _vnni_ready(self) -> bool:
        """The AVX512-VNNI product can take this call (where AMX cannot): symmetric codes, a CPU with
        AVX512-VNNI, the kernel built, and the scales and bias plain fp32 as it reads them."""
        return (self.codes == "s8" and self.weight_q.device.type == "cpu" and "avx512_vnni" in cpu_flags()
                and kernels.active("int8_vnni") and _c_ready(self.weight_scale) and _c_ready(self.bias))

    def _avx2_ready(self) -> bool:
        """The AVX2 product can take this call: 7-bit codes, no VNNI (where `_int_mm` is faster), the kernel
        built, and the scales and bias plain fp32 as it reads them."""
        return (self.codes == "u7" and int8_product("cpu") == "avx2" and self.weight_q.device.type == "cpu"
                and _c_ready(self.weight_scale) and _c_ready(self.bias))

    def _packed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the weights in the AVX2, VNNI and AMX kernels' layout, their column sums), packed on first use and again
        if `weight_q` changed."""
        w = self.weight_q
        # inference tensors keep no version counter; load_state_dict's in-place copy drops the cache itself
        key = (w.data_ptr(), tuple(w.shape), None if w.is_inference() else w._version)
        cached = getattr(self, "_packed_cache", None)
        if cached is None or cached[0] != key:
            out = torch.empty(int8_packed_bytes(*w.shape), dtype=torch.int8)
            colsum = torch.empty(w.size(1), dtype=torch.int32)
            kernels.call("int8_pack_b", w.contiguous(), w.size(0), w.size(1), out, colsum)
            self._packed_cache = cached = (key, (out, colsum))
        return cached[1]

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self._packed_cache = None
        super()._load_from_state_dict(*args, **kwargs)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int8 per-token "
                f"({self.codes} codes)" + (", smoothed" if self.factors is not None else ""))

    def forward(self, x: torch.Tensor, activation: str | None = None) -> torch.Tensor:
        """`activation` "gelu" (erf form) applies GELU to the output: in the AVX2, VNNI or AMX kernel's store, where
        it saves a pass over the output (a feed-forward block's up projection), else with torch after it."""
        if activation not in (None, "gelu"):
            raise ValueError(f"Int8Linear: activation must be None or 'gelu', got {activation!r}")
        if x.size(-1) != self.in_features:
            raise ValueError(f"Int8Linear: input has {x.size(-1)} features, expected {self.in_features}")
        shape, dtype = x.shape, x.dtype
        x2 = x.reshape(-1, self.in_features).float()
        if x2.size(0) == 0:
            return x.new_zeros(*shape[:-1], self.out_features)
        if x2.device.type == "cpu" and self._amx_ready():
            q, scale = quantize_rows(x2, self.factors)
            out = torch.empty(q.size(0), self.out_features, dtype=torch.float32)
            kernels.call("int8_amx_gemm", q, scale, q.size(0), self.in_features, self._packed()[0],
                         self.weight_scale, self.bias, self.out_features, out, int(activation == "gelu"), min_rows=32)
            return out.view(*shape[:-1], self.out_features).to(dtype)
        if x2.device.type == "cpu" and self._vnni_ready():
            q, scale = quantize_rows(x2, self.factors)
            out = torch.empty(q.size(0), self.out_features, dtype=torch.float32)
            packed, colsum = self._packed()
            kernels.call("int8_vnni_gemm", q, scale, q.size(0), self.in_features, packed, colsum, self.weight_scale,
                         self.bias, self.out_features, out, int(activation == "gelu"), min_rows=16)
            return out.view(*shape[:-1], self.out_features).to(dtype)
        if x2.device.type == "cpu" and self._avx2_ready():
            q, scale, zero = quantize_rows_u7(x2, self.factors)
            out = torch.empty(q.size(0), self.out_features, dtype=torch.float32)
            packed, colsum = self._packed()
            kernels.call("int8_gemm", q, scale, zero, q.size(0), self.in_features, packed, colsum,
                         self.weight_scale, self.bias, self.out_features, out, int(activation == "gelu"),
                         min_rows=16)
            return out.view(*shape[:-1], self.out_features).to(dtype)
        if self.codes == "u7":  # the same integer sums as the kernel's: (q - zero) fits int8 exactly
            q, scale, zero = quantize_rows_u7(x2, self.factors)
            q = (q.to(torch.int16) - zero).to(torch.int8)
        else:
            q, scale = quantize_rows(x2, self.factors)
        acc = _int_mm(q, self.weight_q) if q.size(0) > 16 or not q.is_cuda else \
            (q.float() @ self.weight_q.float()).round().to(torch.int32)  # CUDA's kernel wants > 16 rows
        if (acc.device.type == "cpu" and acc.is_contiguous() and _c_ready(self.weight_scale) and _c_ready(self.bias)
                and kernels.active("int8_rows")):
            kernels.call("int8_dequant_rows", acc, scale, self.weight_scale, self.bias, acc.size(0), acc.size(1))
            out = acc.view(torch.float32)  # the kernel wrote the floats over the int32 products
        else:  # (buffers a cast of the model made bf16/fp16 are read in fp32, as the kernel would)
            out = acc.float() * (scale * self.weight_scale.float())
            if self.bias is not None:
                out += self.bias.float()
        if activation == "gelu":
            out = F.gelu(out)
        return out.view(*shape[:-1], self.out_features).to(dtype)


class SmoothedLinear(nn.Module):
    """x -> linear(x * inv) with the linear's weight columns already multiplied by f = 1 / inv: SmoothQuant for
    a linear layer that torch.ao's dynamic quantization then turns int8 (the path for CPUs without VNNI)."""

    def __init__(self, linear: nn.Linear, smooth: torch.Tensor) -> None:
        super().__init__()
        self.linear = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
        with torch.no_grad():
            self.linear.weight.copy_(linear.weight.float() * smooth)
            if linear.bias is not None:
                self.linear.bias.copy_(linear.bias.float())
        self.register_buffer("inv", (1 / smooth).float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x * self.inv)
