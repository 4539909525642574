"""Sentence embeddings from an encoder: run the backbone, pool the token vectors into one vector per text.

Texts are sorted by length and batched so that a batch holds similar lengths (little padding work),
then put back in the input order.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

POOLINGS = ("mean", "cls")


def pad_batch(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[row, : len(s)] = 1
    return ids, mask


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    if pooling == "cls":
        return hidden[:, 0]
    m = mask.unsqueeze(-1).to(hidden.dtype)  # mean over real tokens only, never over padding
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


def hidden_batches(model, tokenizer, texts: list[str], *, batch_size: int = 32, max_length: int | None = None,
                   progress: bool | None = None, desc: str = "embed"):
    """Yield (row indices into `texts`, last hidden states (b, T, d), attention mask (b, T)) over length-sorted
    batches; the caller pools or keeps the token vectors. Runs without autograd unless the caller enables it."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    backbone = getattr(model, "backbone", model)
    limit = max_length or backbone.config.max_position_embeddings
    enc = tokenizer(list(texts), max_length=limit, truncation=True)
    ids = enc["input_ids"]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    show = progress if progress is not None else len(texts) >= 256
    if show:
        from tqdm import tqdm
        batches = tqdm(batches, desc=desc, unit="batch")
    device = next(backbone.parameters()).device
    pad_id = backbone.config.pad_token_id or 0
    for batch in batches:
        input_ids, mask = pad_batch([ids[i] for i in batch], pad_id)
        input_ids, mask = input_ids.to(device), mask.to(device)
        yield batch, backbone(input_ids=input_ids, attention_mask=mask).last_hidden_state, mask


@torch.inference_mode()
def embed(model, tokenizer, texts: list[str], *, pooling: str = "mean", normalize: bool = True,
          batch_size: int = 32, max_length: int | None = None, progress: bool | None = None) -> np.ndarray:
    """One float32 vector per text, shape (len(texts), hidden_size)."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling={pooling!r} is not one of {', '.join(POOLINGS)}")
    backbone = getattr(model, "backbone", model)
    out = np.zeros((len(texts), backbone.config.hidden_size), dtype=np.float32)
    for batch, hidden, mask in hidden_batches(model, tokenizer, texts, batch_size=batch_size,
                                              max_length=max_length, progress=progress):
        vec = pool(hidden, mask, pooling).float()
        if normalize:
            vec = torch.nn.functional.normalize(vec, dim=-1)
        out[batch] = vec.cpu().numpy()
    return out


def read_lines(path: str | Path) -> list[str]:
    """Lines of a UTF-8 text file; a line that is not UTF-8 is an error naming its number."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: is a directory, expected a text file with one input per line")
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    texts = []
    for number, raw in enumerate(lines, 1):
        try:
            texts.append(raw.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}: line {number} is not valid UTF-8 (byte {err.start} of the line)") from None
    return texts
