"""Lower-precision inference: bf16 weights/activations, or int8 dynamic quantization of linear layers.

int8 "dynamic" quantization (Jacob et al. 2018; PyTorch's `quantize_dynamic`): each nn.Linear's weight is
stored as int8 with one scale per output row, and at run time each input batch is quantized with a
scale computed from its own range, the matmul runs in int8 with int32 accumulation (fbgemm/oneDNN
kernels), and the result is rescaled to fp32. Embeddings, norms, softmax and the residual stream stay
fp32, which is where the precision matters; the linear layers are where the FLOPs are.

Weights get one scale per output row (per-channel), and the FFN's down projection stays fp32 by default:
its input (after GELU) has a long-tailed range, and one per-tensor activation scale there costs the most
accuracy. On all-MiniLM-L6-v2 embeddings of SST-2/CoNLL sentences, cosine to fp32 (mean / min over 96):
per-tensor everything 0.933 / 0.814, per-channel everything 0.972 / 0.934, per-channel without
`ffn.down` 0.985 / 0.952 (the default). Activation outliers are the limit (SmoothQuant would move them
into the weights; not done here).

Measured on this machine (AMD EPYC, AVX2, no AVX512-BF16/AMX; 2048×384 @ 384×1536, under load):
fp32 210 ms, torch.ao dynamic int8 100 ms, bf16 1456 ms (emulated: no native bf16 dot products),
`torch._int_mm` 4200 ms (no fast CPU kernel). So int8 goes through torch.ao, and bf16 is offered for
machines that have the instructions, not as a speed-up here.

    >>> fast = quantize(model, "int8")   # a copy; `model` is unchanged
"""
from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

DTYPES = ("fp32", "bf16", "int8")


def quantize(model: nn.Module, dtype: str, *, inplace: bool = False, keep_fp32: tuple[str, ...] = ("ffn.down",)
             ) -> nn.Module:
    """Return the model in `dtype` ("fp32", "bf16" or "int8"), a copy unless inplace=True. With int8, linear
    layers whose name ends with one of `keep_fp32` stay fp32."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    model = model if inplace else copy.deepcopy(model)
    model.eval()
    if dtype == "fp32":
        return model.float()
    if dtype == "bf16":
        return model.to(torch.bfloat16)
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao
        warnings.simplefilter("ignore")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
        names = {n: per_channel_dynamic_qconfig for n, m in model.named_modules()
                 if isinstance(m, nn.Linear) and not n.endswith(tuple(keep_fp32))}
        return quantize_dynamic(model.float(), names, dtype=torch.qint8, inplace=True)


def linear_precision(model: nn.Module) -> str:
    """What the linear layers run in: "int8", "bf16" or "fp32" (for /health and benchmark tables)."""
    from ..nn.quantized import BlockLinear
    for m in model.modules():
        if type(m).__module__.startswith("torch.ao.nn.quantized"):
            return "int8"
        if isinstance(m, nn.Linear):
            return "bf16" if m.weight.dtype == torch.bfloat16 else "fp32"
        if isinstance(m, BlockLinear):  # GGUF blocks: products run in the dtype of the activations, which
            # follow the model's float parameters (norms)
            p = next((p for p in model.parameters() if p.is_floating_point()), None)
            return "bf16" if p is not None and p.dtype == torch.bfloat16 else "fp32"
    return "fp32"
