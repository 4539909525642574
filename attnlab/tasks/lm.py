"""Language-model evaluation: how well does a decoder predict *this* text?

Two conventions, because the numbers users compare against come from two tools:

- ``hf`` — transformers' sliding-window recipe (docs: "Perplexity of fixed-length models"). The text is
  tokenized as the model's tokenizer does by default; windows of at most ``context`` tokens start every
  ``stride`` tokens; each window scores only the tokens the previous window did not reach, so every token
  after the first is scored once, with up to ``context - 1`` tokens before it. A window's first token has
  no prediction inside it, so with ``stride == context`` (non-overlapping windows) those go unscored, as
  in the recipe.
- ``llama.cpp`` — ``llama-perplexity`` (tools/perplexity/perplexity.cpp): ``len // n_ctx`` non-overlapping
  chunks, the first token of each chunk replaced by BOS when the tokenizer adds one, and only the second
  half of each chunk scored (targets ``n_ctx/2 + 1 .. n_ctx - 1``), so every scored token sees at least
  half a context. It needs at least ``2 * n_ctx`` tokens, as llama-perplexity does.

Perplexity is exp(total NLL / scored tokens). Bits per byte and word perplexity divide the same total NLL
by the text's UTF-8 bytes and whitespace words instead, as lm-evaluation-harness does for wikitext.

Masked-LM encoders get pseudo-perplexity instead (Salazar et al. 2020, "Masked Language Model Scoring"):
each token masked in turn, in chunks of ``context - 2`` tokens between [CLS] and [SEP], the masked copies
of a chunk batched; exp(sum of -log p(token | rest) / tokens). It is not comparable with a decoder's.

Windows of equal length are batched; logits are computed only at scored positions and in row chunks,
because a (batch, 1024, 49152) fp32 logit tensor would be 200 MB per row; log-softmax runs in fp32 on
those rows only.

A GGUF model loaded kept-quantized (``BlockLinear``, the default of ``attnlab evaluate lm`` for .gguf)
scores windows through torch's GEMM on weight tiles dequantized as they are needed (fp32, or bf16 with
``dtype="bf16"``): the same numbers as the dequantized model (to rounding), without an fp32 copy of it.

``dtype="bf16"`` runs the model in bfloat16 (``inference.quantize``). Where the CPU has native bf16 dot
products (AVX512-BF16 / AMX) its matmuls run ~2.4x faster than fp32 (measured: 185 vs 76 GFLOP/s on one
core, 2048x576 @ 576x1536); the perplexity moves by about +0.1% (SmolLM2-135M on WikiText-2). The NLL is
still accumulated in fp32/float64. Without those instructions bf16 is emulated and slower.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..inference.quantize import linear_precision, quantize
from ..nn.fused import lse_tile
from ..nn.quantized import BlockLinear

CONVENTIONS = ("hf", "llama.cpp")
DTYPES = ("fp32", "bf16")  # int8 dynamic quantization is not offered: +25.7% perplexity on SmolLM2 (docs/research/perplexity.md)
MAX_DEFAULT_CONTEXT = 1024  # the cap on the default context (the model's maximum may be 8k+)
_LOGIT_ROWS = 64  # positions projected onto the vocabulary at a time: 64 x 49,152 fp32 logits stay in the L3
# cache for the cast and log-softmax (measured ~10% less logit time than 512 rows, one thread, SmolLM2)
_VOCAB_TILE = 2048  # vocabulary rows per step of `_head_nll`: 2.4 MB of bf16 weights, reused by every row


class LMInputError(ValueError):
    """Input the evaluation cannot score (empty text, bad UTF-8, too few tokens, bad window sizes, no LM
    head). The CLI reports it on one line with exit status 2."""
    exit_status = 2


@dataclass(frozen=True)
class Window:
    """``ids`` are fed to the model; ``ids[score_from:]`` are scored (each from the logits one before)."""
    ids: tuple[int, ...]
    score_from: int

    @property
    def scored(self) -> int:
        return len(self.ids) - self.score_from


def hf_windows(ids: list[int], context: int, stride: int) -> list[Window]:
    """transformers' sliding window: begin every `stride` tokens, score tokens past the previous end."""
    check_windows(context, stride)
    windows, prev_end = [], 0
    for begin in range(0, len(ids), stride):
        end = min(begin + context, len(ids))
        windows.append(Window(tuple(ids[begin:end]), max(prev_end - begin, 1)))
        prev_end = end
        if end == len(ids):
            break
    return windows


def llama_cpp_windows(ids: list[int], n_ctx: int, bos_id: int | None) -> list[Window]:
    """llama-perplexity's chunks: non-overlapping n_ctx tokens, BOS first when the model adds one, second
    half scored."""
    if n_ctx < 2:
        raise LMInputError(f"--context {n_ctx}: llama.cpp convention needs a context of at least 2 tokens")
    if len(ids) < 2 * n_ctx:
        raise LMInputError(f"llama.cpp convention: the text has {len(ids)} tokens; a context of {n_ctx} needs "
                           f"at least {2 * n_ctx} (as llama-perplexity requires)")
    windows = []
    for i in range(len(ids) // n_ctx):
        chunk = list(ids[i * n_ctx:(i + 1) * n_ctx])
        if bos_id is not None:
            chunk[0] = bos_id
        windows.append(Window(tuple(chunk), n_ctx // 2 + 1))
    return windows


def check_windows(context: int, stride: int) -> None:
    if context < 2:
        raise LMInputError(f"--context {context}: a window needs at least 2 tokens")
    if stride < 1:
        raise LMInputError(f"--stride {stride}: must be at least 1")
    if stride > context:
        raise LMInputError(f"--stride {stride} is larger than --context {context}: tokens between windows "
                           f"would never be scored")


def _head_nll(head, rows: torch.Tensor, targets: torch.Tensor) -> float:
    """Summed NLL of `targets` under the LM head's logits of `rows`, one tile of vocabulary rows at a time with
    a running log-sum-exp (the online softmax of Milakov & Gimelshein 2018). Each weight tile (dequantized
    once, for a head kept quantized) then serves every row of the batch while it sits in cache, where row
    chunks would stream SmolLM2's whole 49,152 x 576 matrix once per chunk. Logits are fp32 from here on."""
    n = rows.size(0)
    run_max = torch.full((n,), float("-inf"), device=rows.device)
    run_sum = torch.zeros(n, device=rows.device)
    picked = torch.zeros(n, device=rows.device)
    vocab = head.out_features
    for v0 in range(0, vocab, _VOCAB_TILE):
        v1 = min(v0 + _VOCAB_TILE, vocab)
        weight = (head.dequantized(v0, v1, rows.dtype) if isinstance(head, BlockLinear)
                  else head.weight[v0:v1].to(rows.dtype))
        bias = None if head.bias is None else head.bias[v0:v1].to(rows.dtype)
        logits = F.linear(rows, weight, bias)
        if lse_tile(logits, targets, v0, run_max, run_sum, picked):  # one C pass over the tile (nn/fused.py)
            continue
        logits = logits.float()
        tile_lse = torch.logsumexp(logits, 1)
        new_max = torch.maximum(run_max, tile_lse)
        run_sum = run_sum * torch.exp(run_max - new_max) + torch.exp(tile_lse - new_max)
        run_max = new_max
        inside = (targets >= v0) & (targets < v1)
        picked[inside] = logits[inside, targets[inside] - v0]
    return (run_max + torch.log(run_sum) - picked).double().sum().item()


@torch.no_grad()
def window_nll(model, windows: list[Window], batch_size: int = 4, progress: bool = False) -> tuple[float, int]:
    """Sum of next-token NLL (nats, accumulated in float64) over every window's scored tokens, and their
    count. Windows of equal length run as one batch (no padding, so no mask can change a number)."""
    from tqdm import tqdm
    device = next(model.parameters()).device
    by_length: dict[int, list[Window]] = {}
    for w in windows:
        by_length.setdefault(len(w.ids), []).append(w)
    batches = [group[i:i + batch_size] for group in by_length.values() for i in range(0, len(group), batch_size)]
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    bar = tqdm(total=len(windows), desc="evaluate lm", unit="window", disable=not progress, leave=False)
    for batch in batches:
        ids = torch.tensor([w.ids for w in batch], device=device)
        hidden = model.backbone(input_ids=ids).last_hidden_state
        # position t predicts token t+1: the hidden states one before each scored token
        rows = torch.cat([hidden[r, w.score_from - 1:-1] for r, w in enumerate(batch)])
        targets = torch.cat([ids[r, w.score_from:] for r, w in enumerate(batch)])
        if isinstance(model.lm_head, (BlockLinear, torch.nn.Linear)) and len(rows) > _LOGIT_ROWS:
            total += _head_nll(model.lm_head, rows, targets)
        else:
            for i in range(0, len(rows), _LOGIT_ROWS):
                logits = model.lm_head(rows[i:i + _LOGIT_ROWS]).float()
                total += F.cross_entropy(logits, targets[i:i + _LOGIT_ROWS], reduction="sum").double().item()
        count += len(targets)
        bar.update(len(batch))
    bar.close()
    model.train(was_training)
    return total, count


@torch.no_grad()
def pseudo_nll(model, ids: list[int], *, cls_id: int, sep_id: int, mask_id: int, context: int,
               batch_size: int = 32, progress: bool = False) -> tuple[float, int]:
    """Sum of -log p(token | every other token of its chunk) with the token masked, and the count."""
    from tqdm import tqdm
    device = next(model.parameters()).device
    body = context - 2
    was_training = model.training
    model.eval()
    total = 0.0
    bar = tqdm(total=len(ids), desc="evaluate lm (pseudo)", unit="token", disable=not progress, leave=False)
    for start in range(0, len(ids), body):
        chunk = torch.tensor([cls_id, *ids[start:start + body], sep_id], device=device)
        for first in range(1, len(chunk) - 1, batch_size):
            pos = torch.arange(first, min(first + batch_size, len(chunk) - 1), device=device)
            rows = torch.arange(len(pos), device=device)
            batch = chunk.repeat(len(pos), 1)
            batch[rows, pos] = mask_id  # row r masks position pos[r] only
            logits = model(input_ids=batch).logits[rows, pos].float()
            total += F.cross_entropy(logits, chunk[pos], reduction="sum").double().item()
            bar.update(len(pos))
    bar.close()
    model.train(was_training)
    return total, len(ids)


def adds_bos(tokenizer) -> bool:
    """Whether the tokenizer puts BOS in front by default (LLaMA's does, GPT-2's and SmolLM2's do not)."""
    bos = tokenizer.bos_token_id
    with_special = tokenizer.encode("a")
    return bos is not None and len(with_special) > len(tokenizer.encode("a", add_special_tokens=False)) \
        and with_special[0] == bos


def read_text(path: str | Path) -> str:
    """The file as text; an empty file or invalid UTF-8 is an LMInputError naming the file (and byte)."""
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise LMInputError(f"{path}: invalid UTF-8 at byte {err.start} ({raw[err.start:err.start + 1]!r})") from None
    if not text.strip():
        raise LMInputError(f"{path}: the file is empty; there is no text to score")
    return text


def perplexity(model, tokenizer, text: str, *, context: int | None = None, stride: int | None = None,
               batch_size: int | None = None, convention: str = "hf", progress: bool = False,
               source: str = "text", dtype: str = "fp32") -> dict:
    """Score `text` with a causal LM (or a masked LM: pseudo-perplexity); returns the metrics `attnlab
    evaluate lm` prints. `batch_size` counts windows for a decoder (default 4), masked copies for a masked
    LM (default 32: each copy is one short row). `dtype`: "fp32" (default: the model as given) or "bf16" (a bf16
    copy of the model scores; the caller's model is left as it is)."""
    if convention not in CONVENTIONS:
        raise LMInputError(f"--convention {convention!r}: choose one of {', '.join(CONVENTIONS)}")
    masked = type(model).__name__ == "MaskedLM"
    if not masked and not (hasattr(model, "lm_head") and getattr(model.config, "causal", False)):
        raise LMInputError(f"{source}: a {type(model).__name__} ({model.config.model_type}) has no causal "
                           f"language-model head to score text with")
    if dtype not in DTYPES:
        raise LMInputError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    batch_size = batch_size or (32 if masked else 4)
    if batch_size < 1:
        raise LMInputError(f"--batch-size {batch_size}: must be at least 1")
    limit = model.config.max_position_embeddings - model.config.extra.get("position_offset", 0)
    context = context or min(limit, MAX_DEFAULT_CONTEXT)
    if context > limit:
        raise LMInputError(f"--context {context} is longer than the model's maximum ({limit} positions)")
    if dtype == "bf16" and linear_precision(model) != "bf16":
        model = quantize(model, "bf16")
    dtype = linear_precision(model)  # what actually ran (a model handed in already quantized stays so)
    if masked:
        return {**_pseudo_perplexity(model, tokenizer, text, context, batch_size, progress, source), "dtype": dtype}
    stride = stride or max(context // 2, 1)
    ids = tokenizer.encode(text)
    if len(ids) < 2:
        raise LMInputError(f"{source}: the text is {len(ids)} token(s); scoring needs at least 2")
    if convention == "hf":
        windows = hf_windows(ids, context, stride)
    else:
        windows = llama_cpp_windows(ids, context, tokenizer.bos_token_id if adds_bos(tokenizer) else None)
    start = time.perf_counter()
    nll, scored = window_nll(model, windows, batch_size=batch_size, progress=progress)
    seconds = time.perf_counter() - start
    n_bytes, n_words = len(text.encode("utf-8")), len(text.split())
    return {
        "convention": convention, "dtype": dtype, "quantized": kept_quantized(model), "context": context, "stride": stride if convention == "hf" else context,
        "tokens": len(ids), "scored_tokens": scored, "windows": len(windows),
        "mean_nll": nll / scored, "perplexity": math.exp(nll / scored),
        # bits per byte and word perplexity spread the same NLL over bytes / words (lm-evaluation-harness)
        "bits_per_byte": nll / (n_bytes * math.log(2)), "word_perplexity": math.exp(nll / n_words),
        "bytes": n_bytes, "words": n_words,
        # tokens fed through the model per second (overlapping windows feed a token more than once)
        "tokens_per_s": sum(len(w.ids) for w in windows) / seconds, "seconds": seconds,
    }


def _pseudo_perplexity(model, tokenizer, text: str, context: int, batch_size: int, progress: bool,
                       source: str) -> dict:
    specials = {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id, "mask": tokenizer.mask_token_id}
    missing = [name for name, i in specials.items() if i is None]
    if missing:
        raise LMInputError(f"{source}: pseudo-perplexity needs the tokenizer's {', '.join(missing)} token(s)")
    if context < 3:
        raise LMInputError(f"--context {context}: a masked-LM chunk needs [CLS], a token and [SEP]")
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) < 2:
        raise LMInputError(f"{source}: the text is {len(ids)} token(s); scoring needs at least 2")
    start = time.perf_counter()
    nll, scored = pseudo_nll(model, ids, cls_id=specials["cls"], sep_id=specials["sep"], mask_id=specials["mask"],
                             context=context, batch_size=batch_size, progress=progress)
    seconds = time.perf_counter() - start
    n_bytes, n_words = len(text.encode("utf-8")), len(text.split())
    return {"convention": "pseudo-perplexity (masked LM)", "context": context, "tokens": len(ids),
            "scored_tokens": scored, "mean_nll": nll / scored, "perplexity": math.exp(nll / scored),
            "bits_per_byte": nll / (n_bytes * math.log(2)), "word_perplexity": math.exp(nll / n_words),
            "bytes": n_bytes, "words": n_words, "tokens_per_s": scored / seconds, "seconds": seconds}


def kept_quantized(model) -> str | None:
    """The GGML block types the model's weights stay in ("Q4_1+Q8_0"), or None for a dense model."""
    from ..nn.quantized import BLOCK_TYPES, BlockEmbedding, BlockLinear
    kinds = {BLOCK_TYPES[m.kind][0] for m in model.modules() if isinstance(m, (BlockLinear, BlockEmbedding))}
    return "+".join(sorted(kinds)) or None


def evaluate_lm(model_path: str | Path, data_path: str | Path, dequantize: bool = False, note=None,
                **kwargs) -> dict:
    """`attnlab evaluate lm`: load the model and its tokenizer (any format attnlab loads), score the file.
    A .gguf keeps its Q4_0/Q4_1/Q8_0 weights quantized (`nn/quantized.py`) unless `dequantize`."""
    from ..interop.api import keeps_quantized, load, load_tokenizer
    text = read_text(data_path)
    model = load(model_path, quantized=keeps_quantized(model_path, dequantize, note=note))
    if kwargs.get("dtype") == "bf16":
        quantize(model, "bf16", inplace=True)  # no fp32 copy kept beside it
    tokenizer = load_tokenizer(model_path)
    return {"model": str(model_path), "data": str(data_path),
            **perplexity(model, tokenizer, text, source=str(model_path), **kwargs)}
