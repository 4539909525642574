"""The tokenizer every attnlab model uses: `Tokenizer`, a readable wrapper around a Rust `tokenizers.Tokenizer`
with a transformers-like call API (padding, truncation, pairs, offsets, batches, decode, save), and the
`Encoding` a call returns. How a tokenizer is built, trained or read from disk is `attnlab/tokenizers.py`.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Iterable, Sequence

import tokenizers as tk

from . import tokenizer_unigram as unigram

# Role -> token for BERT; tokenizer_config.json / special_tokens_map.json may rename them.
BERT_SPECIALS = {"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                 "pad_token": "[PAD]", "mask_token": "[MASK]"}
DEFAULT_MAX_LENGTH = 512


class Encoding(dict):
    """The result of `Tokenizer.__call__`: input_ids, token_type_ids, attention_mask (+ offset_mapping).

    A plain dict (so `model(**batch)` works) that also allows `batch.input_ids`. The raw
    `tokenizers.Encoding` objects stay in `.encodings` for `tokens(i)` and `word_ids(i)`
    (word_ids align sub-word tokens with words, e.g. for NER labels).
    """

    encodings: list

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def tokens(self, i: int = 0) -> list[str]:
        return self.encodings[i].tokens

    def word_ids(self, i: int = 0) -> list[int | None]:
        return self.encodings[i].word_ids


class Tokenizer:
    """Thin, readable wrapper around a `tokenizers.Tokenizer` with a transformers-like call API."""

    def __init__(self, backend: tk.Tokenizer, *, specials: dict[str, str] | None = None,
                 model_max_length: int = DEFAULT_MAX_LENGTH, name: str = ""):
        self.backend = backend
        self.special_tokens = dict(BERT_SPECIALS if specials is None else specials)  # role -> token
        self.model_max_length = model_max_length
        self.name = name
        self.chat_template: str | None = None
        self.sentencepiece: unigram.SentencePieceModel | None = None  # a Unigram's pieces, for spiece.model
        # Truncation/padding are per call, so wipe whatever a tokenizer.json baked in (MiniLM's pads
        # everything to 128). The backend holds them as state, hence the lock around each call.
        backend.no_truncation()
        backend.no_padding()
        self._lock = threading.Lock()

    # ---- special tokens and vocab ----
    def _special_id(self, role: str) -> int | None:
        token = self.special_tokens.get(role)
        return None if token is None else self.backend.token_to_id(token)

    pad_token_id = property(lambda self: self._special_id("pad_token"))
    cls_token_id = property(lambda self: self._special_id("cls_token"))
    sep_token_id = property(lambda self: self._special_id("sep_token"))
    mask_token_id = property(lambda self: self._special_id("mask_token"))
    unk_token_id = property(lambda self: self._special_id("unk_token"))
    bos_token_id = property(lambda self: self._special_id("bos_token"))
    eos_token_id = property(lambda self: self._special_id("eos_token"))

    @property
    def special_ids(self) -> set[int]:
        ids = {self._special_id(role) for role in self.special_tokens}
        ids |= {i for i, t in self.backend.get_added_tokens_decoder().items() if t.special}
        return ids - {None}

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> str | list[str | None] | None:
        if isinstance(ids, int):
            return self.backend.id_to_token(ids)
        return [self.backend.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        def one(token: str) -> int:
            i = self.backend.token_to_id(token)
            return self.unk_token_id if i is None else i
        return one(tokens) if isinstance(tokens, str) else [one(t) for t in tokens]

    # ---- encoding ----
    def __call__(self, text: str | Sequence, text_pair: str | Sequence | None = None, *,
                 max_length: int | None = None, truncation: bool | str = True,
                 padding: bool | str = False, return_tensors: str | None = None,
                 return_offsets: bool = False, add_special_tokens: bool = True,
                 is_split_into_words: bool = False) -> Encoding:
        """Encode one text, a pair, or a batch of either.

        text: str | list[str] | list[(a, b)] pairs; with is_split_into_words=True, a list of words
        (or a batch of them) whose offsets are then relative to each word.
        truncation: True = "longest_first" (drop tokens from the longer of a pair, as BERT did),
        or "only_first" / "only_second"; the limit is max_length or else model_max_length.
        padding: False, True / "longest" (to the batch's longest), or "max_length".
        Single inputs give flat lists; return_tensors="pt" always gives (batch, seq) torch.long.
        """
        if is_split_into_words:
            batched = len(text) > 0 and not isinstance(text[0], str)
        else:
            batched = not isinstance(text, str)
        texts = list(text) if batched else [text]
        if text_pair is not None:
            pairs = list(text_pair) if batched else [text_pair]
            if len(pairs) != len(texts):
                raise ValueError(f"got {len(texts)} texts but {len(pairs)} text_pairs")
            inputs = list(zip(texts, pairs))
        else:  # a batch may itself hold (a, b) pairs
            inputs = [tuple(t) if isinstance(t, (tuple, list)) and not is_split_into_words else t
                      for t in texts]
        length = max_length or self.model_max_length
        strategy = "longest_first" if truncation is True else truncation
        if padding is True:
            padding = "longest"
        if padding not in (False, "do_not_pad", "longest", "max_length"):
            raise ValueError(f"padding must be False, True, 'longest' or 'max_length', not {padding!r}")

        with self._lock:
            try:
                if strategy:
                    self.backend.enable_truncation(length, strategy=strategy)
                if padding in ("longest", "max_length"):
                    if self.pad_token_id is None:
                        raise ValueError(f"{self.name or 'tokenizer'} has no pad token; cannot pad")
                    self.backend.enable_padding(pad_id=self.pad_token_id, pad_token=self.special_tokens["pad_token"],
                                                length=length if padding == "max_length" else None)
                # encode_batch runs in parallel threads in Rust, even for a batch of one.
                encodings = self.backend.encode_batch(inputs, is_pretokenized=is_split_into_words,
                                                      add_special_tokens=add_special_tokens)
            finally:
                self.backend.no_truncation()
                self.backend.no_padding()

        out = Encoding(input_ids=[e.ids for e in encodings],
                       token_type_ids=[e.type_ids for e in encodings],
                       attention_mask=[e.attention_mask for e in encodings])
        if return_offsets:
            out["offset_mapping"] = [e.offsets for e in encodings]
        if return_tensors == "pt":
            import torch  # lazy: tokenizing needs no torch
            if len({len(ids) for ids in out["input_ids"]}) > 1:
                raise ValueError("sequences have different lengths; pass padding=True (or 'max_length') "
                                 "to get tensors")
            for key, value in out.items():
                out[key] = torch.tensor(value, dtype=torch.long)
        elif return_tensors is not None:
            raise ValueError(f"return_tensors must be None or 'pt', not {return_tensors!r}")
        elif not batched:
            for key, value in out.items():
                out[key] = value[0]
        out.encodings = encodings
        return out

    def encode(self, text: str | Sequence[str], text_pair: str | Sequence[str] | None = None, *,
               add_special_tokens: bool = True, truncation: bool | str = False,
               max_length: int | None = None) -> list[int]:
        """Ids of one text (or pair). Unlike __call__, no truncation unless asked: for long documents."""
        return self(text, text_pair, truncation=truncation, max_length=max_length,
                    add_special_tokens=add_special_tokens,
                    is_split_into_words=not isinstance(text, str))["input_ids"]

    def decode(self, ids: Sequence[int] | Any, skip_special_tokens: bool = True) -> str:
        if hasattr(ids, "tolist"):  # torch / numpy
            ids = ids.tolist()
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, batch: Sequence[Sequence[int]] | Any, skip_special_tokens: bool = True) -> list[str]:
        if hasattr(batch, "tolist"):
            batch = batch.tolist()
        return self.backend.decode_batch([list(ids) for ids in batch], skip_special_tokens=skip_special_tokens)

    # ---- saving ----
    def save(self, directory: str | Path) -> Path:
        """Write tokenizer.json, tokenizer_config.json and (for WordPiece) vocab.txt.

        transformers' AutoTokenizer / BertTokenizerFast `.from_pretrained(directory)` loads the result.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with self._lock:  # truncation/padding are off between calls, so the JSON carries neither
            self.backend.save(str(directory / "tokenizer.json"))
            spec = json.loads(self.backend.to_str())
        config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                                  "model_max_length": self.model_max_length, **self.special_tokens}
        if self.chat_template:
            config["chat_template"] = self.chat_template
        if isinstance(self.backend.model, tk.models.WordPiece):
            config["tokenizer_class"] = "BertTokenizer"
            vocab = self.backend.get_vocab(with_added_tokens=False)
            tokens = sorted(vocab, key=vocab.get)
            (directory / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
        if isinstance(self.backend.model, tk.models.BPE):  # vocab.json + merges.txt, as GPT-2 ships them
            self.backend.model.save(str(directory))
        if self.sentencepiece is not None:  # the sentencepiece library (and T5Tokenizer & co.) read this one
            unigram.write_model(self.sentencepiece, directory / "spiece.model")
        normalizer = spec.get("normalizer") or {}
        if normalizer.get("type") == "BertNormalizer":  # so a vocab.txt-only reload behaves the same
            config.update(do_lower_case=normalizer["lowercase"], strip_accents=normalizer["strip_accents"],
                          tokenize_chinese_chars=normalizer["handle_chinese_chars"])
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        return directory

    def __repr__(self) -> str:
        model = type(self.backend.model).__name__
        return (f"Tokenizer({model}, vocab_size={self.vocab_size}, model_max_length={self.model_max_length}, "
                f"name={self.name!r})")
