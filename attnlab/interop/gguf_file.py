"""The GGUF header reader: metadata as Python values and each tensor's byte range, checked against the file.

A GGUF file is a short header (magic, version, counts), key/value metadata, tensor infos (name, shape, GGML
type, offset) and an aligned data section. `interop/gguf.py` builds models and tokenizers from what this
reads; `interop/gguf_write.py` copies metadata types from it.
"""
from __future__ import annotations

import functools
import os
import struct
from collections.abc import Sequence

import numpy as np

from .files import CheckpointError


class GGUFFile:
    """The parts of a GGUF file we need: metadata as Python values and where each tensor's bytes are.

    Parsed here with `struct` (the layout is a short header, key/values, tensor infos, aligned data)
    because `gguf.GGUFReader` builds objects for each of the ~100k tokenizer strings and takes seconds;
    the tensors themselves are dequantized by the `gguf` package.

    Nothing in the header is trusted: every count and length is checked against the bytes left before it
    is used, arrays nest at most MAX_ARRAY_DEPTH deep, and every tensor's byte range (from its shape and
    type) must lie inside the file, aligned, and overlap no other tensor's. Any lie is a CheckpointError
    naming the file and the key or tensor where it was found.
    """

    _SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    _NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
              7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
    MAX_DIMS = 4  # GGML_MAX_DIMS
    MAX_ARRAY_DEPTH = 2  # an array of arrays is legal GGUF but rare; deeper is refused (no recursion blow-up)

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.buf = np.memmap(path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{path}: cannot read ({err})") from None
        self.mv = memoryview(self.buf)
        self.pos = 0
        self.where = "the header"  # what is being read, for the error messages
        try:
            magic, version = self._take("<4sI")
            if magic != b"GGUF" or version not in (2, 3):
                raise CheckpointError(f"{path}: not a GGUF v2/v3 file (magic {magic!r}, version {version})")
            n_tensors, n_kv = self._take("<QQ")
            self.meta = {}
            self.types = {}  # key -> (GGUF value type, element type of an array or None): a writer copies them
            for i in range(n_kv):
                self.where = f"metadata key #{i}"
                key = self._string()
                self.where = f"metadata key {key!r}"
                (kind,) = self._take("<I")
                inner = None
                if kind == 9 and self.pos + 4 <= len(self.buf):
                    inner = struct.unpack_from("<I", self.mv, self.pos)[0]
                self.meta[key] = self._value(kind)
                self.types[key] = (kind, inner)
            self.tensors = []  # (name, dims in ggml order (fastest first), ggml type, offset)
            for i in range(n_tensors):
                self.where = f"tensor info #{i}"
                name = self._string()
                self.where = f"tensor {name!r}"
                (n_dims,) = self._take("<I")
                if not 1 <= n_dims <= self.MAX_DIMS:
                    raise CheckpointError(f"{path}: tensor {name!r} has {n_dims} dimensions (GGUF allows 1 to "
                                          f"{self.MAX_DIMS}): damaged file")
                dims = list(self._take(f"<{n_dims}Q"))
                kind, offset = self._take("<IQ")
                self.tensors.append((name, dims, kind, offset))
        except (struct.error, UnicodeDecodeError, IndexError, ValueError) as err:
            if isinstance(err, CheckpointError):
                raise
            raise CheckpointError(f"{path}: damaged or truncated GGUF header at {self.where} ({err})") from None
        align = self.meta.get("general.alignment", 32)
        if type(align) is not int or align <= 0 or align & (align - 1):
            raise CheckpointError(f"{path}: general.alignment={align!r} is not a power of two")
        self.data_start = (self.pos + align - 1) // align * align
        self._check_ranges(align)

    def _need(self, n: int) -> None:
        """Bounds check: `n` more bytes must lie inside the file."""
        if n < 0 or self.pos + n > len(self.buf):
            raise CheckpointError(f"{self.path}: truncated GGUF file at {self.where} (needs {n} bytes at offset "
                                  f"{self.pos}, the file has {len(self.buf)})")

    def _take(self, fmt: str) -> tuple:
        self._need(struct.calcsize(fmt))
        values = struct.unpack_from(fmt, self.mv, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (n,) = self._take("<Q")
        self._need(n)
        text = bytes(self.mv[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return text

    def _value(self, kind: int, depth: int = 0):
        if kind == 8:
            return self._string()
        if kind in self._SCALARS:
            return self._take(self._SCALARS[kind])[0]
        if kind != 9:
            raise CheckpointError(f"{self.path}: {self.where}: unknown GGUF value type {kind}")
        if depth >= self.MAX_ARRAY_DEPTH:
            raise CheckpointError(f"{self.path}: {self.where}: arrays nested more than {self.MAX_ARRAY_DEPTH} "
                                  "deep: damaged file")
        inner, count = self._take("<IQ")
        if inner in self._NUMPY:  # numeric arrays in one read
            dtype = np.dtype(self._NUMPY[inner])
            self._need(count * dtype.itemsize)
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
            self.pos += count * dtype.itemsize
            return arr.tolist()
        if inner not in (8, 9):
            raise CheckpointError(f"{self.path}: {self.where}: array of unknown GGUF value type {inner}")
        # each string takes at least its 8-byte length, each array its 12-byte header: a count the rest
        # of the file cannot hold is refused before the loop starts
        self._need(count * (8 if inner == 8 else 12))
        if inner == 8:
            return self._strings(count)
        return [self._value(inner, depth + 1) for _ in range(count)]

    def _strings(self, count: int) -> "list[str] | StringArray":
        """An array of `count` strings, read in one loop with the bounds and UTF-8 checked per string (3x
        faster than one `_string` call each: the vocabulary and merges are ~100,000 strings for SmolLM2).
        A long one is kept as a `StringArray`: the parsed metadata stays cached while the file is in use,
        and 100,000 Python strings would hold 8 MB of it for the life of the process."""
        mv, size, pos = self.mv, len(self.buf), self.pos
        unpack = struct.Struct("<Q").unpack_from
        compact = count >= StringArray.MIN
        out, chunks = [], []
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self._need(8)
            (n,) = unpack(mv, pos)
            pos += 8
            if pos + n > size:
                self.pos = pos
                self._need(n)
            text = str(mv[pos:pos + n], "utf-8")  # checks the bytes are UTF-8
            if compact:
                chunks.append(mv[pos:pos + n])
            else:
                out.append(text)
            pos += n
        self.pos = pos
        if not compact:
            return out
        lengths = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=count)
        return StringArray(b"".join(chunks), lengths)

    def _layout(self, name: str, dims: list[int], kind: int) -> tuple[int, int]:
        """(rows, bytes per row) of a tensor of this shape and GGML type."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
        try:
            block, size = GGML_QUANT_SIZES[Q(kind)]
        except (ValueError, KeyError):
            raise CheckpointError(f"{self.path}: tensor {name!r} has unknown GGML tensor type {kind}") from None
        if dims[0] % block:
            raise CheckpointError(f"{self.path}: tensor {name!r}: row length {dims[0]} is not a multiple of the "
                                  f"{Q(kind).name} block size {block}")
        rows = 1
        for d in dims[1:]:
            rows *= int(d)
        return rows, dims[0] // block * size

    def _check_ranges(self, align: int) -> None:
        """Every tensor's bytes (as many as its shape and type need) inside the file, at an aligned offset,
        and no two tensors sharing a byte: a file cannot claim more data than it holds."""
        spans, seen = [], set()
        for name, dims, kind, offset in self.tensors:
            if name in seen:
                raise CheckpointError(f"{self.path}: tensor {name!r} appears twice")
            seen.add(name)
            rows, row_bytes = self._layout(name, dims, kind)
            start = self.data_start + offset
            end = start + rows * row_bytes
            if offset % align:
                raise CheckpointError(f"{self.path}: tensor {name!r} starts at data offset {offset}, not a "
                                      f"multiple of general.alignment={align}: damaged file")
            if end > len(self.buf):
                raise CheckpointError(f"{self.path}: tensor {name!r} (shape {list(reversed(dims))}) needs bytes "
                                      f"{start}..{end}, the file has {len(self.buf)}: truncated or damaged")
            spans.append((start, end, name))
        spans.sort()
        for (s0, e0, a), (s1, e1, b) in zip(spans, spans[1:]):
            if s1 < e0 and s1 < e1:  # an empty tensor overlaps nothing
                raise CheckpointError(f"{self.path}: tensors {a!r} (bytes {s0}..{e0}) and {b!r} (bytes {s1}..{e1}) "
                                      "overlap: damaged file")

    def tensor_bytes(self, name: str, dims: list[int], kind: int, offset: int) -> np.ndarray:
        """Raw bytes of a tensor as (rows, bytes per row), after checking they lie inside the file."""
        rows, row_bytes = self._layout(name, dims, kind)
        start = self.data_start + offset
        end = start + rows * row_bytes
        if end > len(self.buf):
            raise CheckpointError(f"{self.path}: tensor {name!r} (shape {list(reversed(dims))}) needs bytes "
                                  f"{start}..{end}, the file has {len(self.buf)}: truncated or damaged")
        return self.buf[start:end].reshape(rows, row_bytes)


class StringArray(Sequence):
    """A long GGUF string array held as one UTF-8 blob and its offsets (1.4 MB for SmolLM2's vocabulary and
    merges, where a list of Python strings takes 8 MB). Reads like a list of str; equal to one."""
    MIN = 1024  # shorter arrays stay plain lists

    def __init__(self, blob: bytes, lengths: np.ndarray) -> None:
        self._blob = blob
        self._ends = np.cumsum(lengths)
        self._starts = self._ends - lengths

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("StringArray index out of range")
        return self._blob[self._starts[i]:self._ends[i]].decode("utf-8")

    def __iter__(self):
        blob = self._blob
        for a, b in zip(self._starts.tolist(), self._ends.tolist()):
            yield blob[a:b].decode("utf-8")

    def __eq__(self, other) -> bool:
        return isinstance(other, (list, StringArray)) and len(other) == len(self) and list(self) == list(other)

    __hash__ = None

    def __repr__(self) -> str:
        return f"StringArray({len(self)} strings)"


def _reader(path: str) -> GGUFFile:
    """The parsed header of `path`, cached by (path, size, mtime, inode): a file replaced at the same path
    (os.replace, a new download) is parsed again, never answered with the old one's metadata and offsets."""
    try:
        import gguf  # noqa: F401  (dequantization and type sizes)
    except ImportError:
        raise ImportError("reading .gguf files needs the gguf package: pip install gguf") from None
    try:
        st = os.stat(path)
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read ({err.strerror or err})") from None
    return _cached_reader(path, st.st_size, st.st_mtime_ns, st.st_ino)


@functools.lru_cache(maxsize=4)
def _cached_reader(path: str, size: int, mtime_ns: int, inode: int) -> GGUFFile:
    return GGUFFile(path)


_reader.cache_clear = _cached_reader.cache_clear
