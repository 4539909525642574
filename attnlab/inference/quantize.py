"""Lower-precision inference: bf16 weights/activations, or int8 linear layers.

int8, on a CPU with int8 dot products (VNNI / AMX-INT8; CUDA too) or with AVX2: every nn.Linear becomes an
`nn.int8.Int8Linear`: weights int8 with one scale per output row, activations quantized per token at run
time, and SmoothQuant factors (Xiao et al. 2023) from a pass over calibration text, which move the few
outlier input channels' range into the weights. `calibration_batches(tokenizer)` gives the bundled text
(128 public-domain sentences); without calibration the layers are per-token only. Embeddings, norms,
softmax and the residual stream stay fp32.

On all-MiniLM-L6-v2 embeddings of 1,024 SST-2/CoNLL sentences (cosine to fp32, min / mean): per-token +
SmoothQuant alpha 0.7, every linear in int8: 0.994-0.996 / 0.9988-0.9990 at ~2x fp32 speed on one thread
with VNNI; with AVX2 alone the activations are 7-bit codes with a zero point per token (csrc/int8_gemm.c:
the byte product, exact on them), 0.991 / 0.9982 at 1.6-1.8x fp32 speed.

Without AVX2 (or without the C kernels) int8 is torch.ao's dynamic quantization (one activation scale per
batch), per-channel weights, `ffn.down` kept fp32, and the same SmoothQuant factors folded in when
calibrated: 0.983 / 0.9962 on the sentences above (0.952 / 0.985 without the factors): below the 0.99 bar,
which its per-batch activation scale cannot reach.

bf16: native with AVX512-BF16 / AMX (~2.4x fp32 matmuls here), emulated and ~10x slower without
(nn/precision.py).

    >>> fast = quantize(model, "int8", calibration=calibration_batches(tokenizer))   # a copy
"""
from __future__ import annotations

import copy
import warnings
from pathlib import Path

import torch
from torch import nn

from ..nn.int8 import Int8Linear, SmoothedLinear, int8_is_fast

DTYPES = ("fp32", "bf16", "int8")
CALIBRATION_TEXT = Path(__file__).with_name("calibration.txt")
# SmoothQuant's migration strength: 0.3 / 0.5 / 0.7 gave min cosine 0.987 / 0.993 / 0.996 on MiniLM
SMOOTH_ALPHA = 0.7


def calibration_texts() -> list[str]:
    """The bundled calibration sentences (128 public-domain lines)."""
    return [t for t in CALIBRATION_TEXT.read_text(encoding="utf-8").splitlines() if t and not t.startswith("#")]


def calibration_batches(tokenizer, texts: list[str] | None = None, *, batch_size: int = 32,
                        max_length: int = 128) -> list[dict[str, torch.Tensor]]:
    """Model inputs for `quantize(..., calibration=)`: `texts`, or the bundled calibration sentences."""
    from .embed import pad_batch
    if texts is None:
        texts = calibration_texts()
    ids = tokenizer(list(texts), max_length=max_length, truncation=True)["input_ids"]
    pad = getattr(tokenizer, "pad_token_id", None) or 0
    out = []
    for i in range(0, len(ids), batch_size):
        input_ids, mask = pad_batch(ids[i:i + batch_size], pad)
        out.append({"input_ids": input_ids, "attention_mask": mask})
    return out


@torch.inference_mode()
def activation_maxima(model: nn.Module, batches) -> dict[str, torch.Tensor]:
    """max |x_k| per input channel k of every nn.Linear, over the real tokens of `batches`."""
    maxima: dict[str, torch.Tensor] = {}
    device = next(model.parameters()).device

    def hook(name):
        def record(_module, args):
            x = args[0].detach().reshape(-1, args[0].size(-1)).abs().amax(0).float()
            maxima[name] = x if name not in maxima else torch.maximum(maxima[name], x)
        return record

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    try:
        for batch in batches:
            model(**{k: v.to(device) for k, v in batch.items()})
    finally:
        for h in handles:
            h.remove()
    return maxima


def _swap_linears(model: nn.Module, keep_fp32: tuple[str, ...], make) -> None:
    """Replace each plain nn.Linear whose name does not end with one of `keep_fp32` by `make(name, linear)`
    (None leaves it)."""
    for name, m in list(model.named_modules()):
        for child_name, child in list(m.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and not full.endswith(keep_fp32):
                new = make(full, child)
                if new is not None:
                    setattr(m, child_name, new.to(child.weight.device))


def _int8_linears(model: nn.Module, keep_fp32: tuple[str, ...], calibration, alpha: float) -> nn.Module:
    maxima = activation_maxima(model, calibration) if calibration is not None else {}
    # Q, K and V read the same input: one set of factors (from their weights together) keeps them one product
    shared: dict[str, torch.Tensor] = {}
    for name, m in model.named_modules():
        if all(isinstance(getattr(m, p, None), nn.Linear) for p in "qkv"):
            group = [f"{name}.{p}" if name else p for p in "qkv"]
            if all(g in maxima for g in group):
                w = torch.cat([getattr(m, p).weight.detach().float() for p in "qkv"])
                factors = _smooth_factors(maxima[group[0]], w, alpha)
                shared.update({g: factors for g in group})

    def make(full: str, child: nn.Linear) -> Int8Linear:
        factors = shared.get(full)
        if factors is None and full in maxima:
            factors = _smooth_factors(maxima[full], child.weight.detach().float(), alpha)
        return Int8Linear.from_linear(child, factors)

    _swap_linears(model, keep_fp32, make)
    return model


def _smooth_factors(act_max: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's f_k = max|X_k|^alpha / max|W_k|^(1-alpha) (§4, eq. 4), clamped away from 0."""
    w_max = weight.abs().amax(0).clamp(min=1e-5)
    return (act_max.clamp(min=1e-5) ** alpha / w_max ** (1 - alpha)).clamp(min=1e-5)


def quantize(model: nn.Module, dtype: str, *, inplace: bool = False, keep_fp32: tuple[str, ...] | None = None,
             calibration=None, alpha: float = SMOOTH_ALPHA) -> nn.Module:
    """Return the model in `dtype` ("fp32", "bf16" or "int8"), a copy unless inplace=True. With int8, linear
    layers whose name ends with one of `keep_fp32` stay fp32 (default: none where Int8Linear has a fast
    product, `ffn.down` otherwise); `calibration` (e.g. `calibration_batches(tokenizer)`) turns on SmoothQuant."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    model = model if inplace else copy.deepcopy(model)
    model.eval()
    if dtype == "fp32":
        return model.float()
    if dtype == "bf16":
        return model.to(torch.bfloat16)
    model = model.float()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    if int8_is_fast(str(device)):
        return _int8_linears(model, tuple(keep_fp32 or ()), calibration, alpha)
    keep = ("ffn.down",) if keep_fp32 is None else tuple(keep_fp32)
    if calibration is not None:  # SmoothQuant before torch.ao: prescale inputs, fold the factors into weights
        maxima = activation_maxima(model, calibration)
        _swap_linears(model, keep, lambda full, child: None if full not in maxima else SmoothedLinear(
            child, _smooth_factors(maxima[full], child.weight.detach().float(), alpha)))
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
        warnings.simplefilter("ignore")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
        names = {n: per_channel_dynamic_qconfig for n, m in model.named_modules()
                 if isinstance(m, nn.Linear) and not n.endswith(keep)}
        return quantize_dynamic(model, names, dtype=torch.qint8, inplace=True)


def fastest_dtype(device: str = "cpu") -> str:
    """The fastest precision that can keep cosine >= 0.99 to fp32 on this device, by its flags alone: int8
    where Int8Linear has a fast product (VNNI / AMX / CUDA, or the AVX2 kernel), else bf16 where it is native
    (AVX512-BF16 / AMX / CUDA), else fp32 (torch.ao's int8 is faster there but misses the bar).
    `auto_precision` measures it on a model."""
    return candidate_dtypes(device)[0]


# --dtype auto's bar: sentence-embedding cosine to fp32, (min, mean) over the calibration sentences
COSINE_BAR = (0.99, 0.998)


def candidate_dtypes(device: str = "cpu") -> list[str]:
    """The precisions worth trying here, fastest first (see `fastest_dtype`); fp32 last, always."""
    from ..nn.precision import bf16_is_native
    return (["int8"] if int8_is_fast(device) else []) + (["bf16"] if bf16_is_native(device) else []) + ["fp32"]


def auto_precision(model: nn.Module, tokenizer, *, pooling: str = "mean",
                   bar: tuple[float, float] = COSINE_BAR) -> tuple[nn.Module, str, list[dict]]:
    """(model, dtype, checks): the fastest precision on this device whose sentence embeddings of the bundled
    calibration sentences keep `bar` (min, mean cosine to fp32), by measuring each candidate rather than
    trusting the CPU's flags: a model whose activations int8 cannot hold falls back to bf16 or fp32. The check
    is on the sentences the SmoothQuant factors came from, so it is optimistic (MiniLM with AVX2's 7-bit codes:
    min 0.996 there, 0.991 on 1,024 unseen sentences): it catches a model that int8 breaks, not a near miss.
    A lower precision is a copy (`model` stays fp32); checks: one dict per candidate tried."""
    from .embed import embed
    texts = calibration_texts()
    device = str(next((p.device for p in model.parameters()), torch.device("cpu")))
    reference = None
    checks = []
    for dtype in candidate_dtypes(device)[:-1]:  # fp32 is the answer when none of them keeps the bar
        reference = embed(model, tokenizer, texts, pooling=pooling, progress=False) if reference is None else reference
        trial = quantize(model, dtype, calibration=calibration_batches(tokenizer) if dtype == "int8" else None)
        cos = (embed(trial, tokenizer, texts, pooling=pooling, progress=False) * reference).sum(-1)
        checks.append({"dtype": dtype, "min": float(cos.min()), "mean": float(cos.mean()),
                       "kept": bool(cos.min() >= bar[0] and cos.mean() >= bar[1])})
        if checks[-1]["kept"]:
            return trial, dtype, checks
    return model.float(), "fp32", checks


def linear_precision(model: nn.Module) -> str:
    """What the linear layers run in: "int8", "bf16" or "fp32" (for /health and benchmark tables)."""
    from ..nn.quantized import BlockLinear
    for m in model.modules():
        if type(m).__module__.startswith("torch.ao.nn.quantized") or isinstance(m, Int8Linear):
            return "int8"
        if isinstance(m, nn.Linear):
            return "bf16" if m.weight.dtype == torch.bfloat16 else "fp32"
        if isinstance(m, BlockLinear):  # GGUF blocks: products run in the dtype of the activations, which
            # follow the model's float parameters (norms)
            p = next((p for p in model.parameters() if p.is_floating_point()), None)
            return "bf16" if p is not None and p.dtype == torch.bfloat16 else "fp32"
    return "fp32"
