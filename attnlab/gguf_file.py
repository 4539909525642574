"""The GGUF header reader: metadata as Python values and each tensor's byte range, checked against the file.

A GGUF file is a short header (magic, version, counts), key/value metadata, tensor infos (name, shape, GGML
type, offset) and an aligned data section. `gguf_meta.py` reads the model config and the tokenizer from
it, `interop/gguf.py` builds models, `inference/lean.py` decodes on the blocks it maps, and
`interop/gguf_write.py` copies metadata types from it. No torch here (see `inference/lean.py`).
"""
from __future__ import annotations

import functools
import os
import struct
from collections.abc import Sequence

import numpy as np

from .config import CheckpointError

# GGML tensor types: id -> (name, weights per block, bytes per block), as ggml.h defines them (a test holds
# this table equal to the gguf package's GGML_QUANT_SIZES). Kept here so that reading a header does not
# import the gguf package (0.15 s with its sentencepiece and yaml imports), which only dequantization needs.
GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
              7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84),
              11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
              15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
              19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
              23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
              28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54),
              35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18)}


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
        """An array of `count` strings. A long one (the vocabulary and merges: ~100,000 strings for SmolLM2)
        is kept as a `StringArray`: the parsed metadata stays cached while the file is in use, and 100,000
        Python strings would hold 8 MB of it for the life of the process. Its bytes are checked and copied
        at once (`_string_blob`); short arrays, and any array that check refuses, go string by string, which
        names the string at fault."""
        if count >= StringArray.MIN:
            found = self._string_blob(count)
            if found is not None:
                return found
        mv, size, pos = self.mv, len(self.buf), self.pos
        unpack = struct.Struct("<Q").unpack_from
        out = []
        for i in range(count):
            if pos + 8 > size:
                self.pos = pos
                self._need(8)
            (n,) = unpack(mv, pos)
            pos += 8
            if pos + n > size:
                self.pos = pos
                self._need(n)
            try:
                out.append(str(mv[pos:pos + n], "utf-8"))
            except UnicodeDecodeError as err:
                raise CheckpointError(f"{self.path}: {self.where}: string {i} of the array is not UTF-8 "
                                      f"({err.reason} at byte {err.start})") from None
            pos += n
        self.pos = pos
        return out if count < StringArray.MIN else StringArray.of(out)

    def _string_blob(self, count: int) -> "StringArray | None":
        """The array as one blob, or None when a length runs past the file or a string is not UTF-8 on its
        own (the caller then finds which). One Python pass reads the lengths; numpy drops the 8-byte length
        fields; one decode checks the whole blob; a string starting with a UTF-8 continuation byte would be
        valid only joined to its neighbour, so those starts are refused too."""
        mv, size, pos = self.mv, len(self.buf), self.pos
        unpack = struct.Struct("<Q").unpack_from
        lengths = [0] * count
        start = pos
        for i in range(count):
            if pos + 8 > size:
                return None
            (n,) = unpack(mv, pos)
            pos += 8 + n
            if pos > size:
                return None
            lengths[i] = n
        lens = np.array(lengths, dtype=np.int64)
        region = np.frombuffer(self.buf, dtype=np.uint8, count=pos - start, offset=start)
        keep = np.ones(pos - start, dtype=bool)
        fields = np.cumsum(lens + 8) - lens - 8  # where each length field starts, from `start`
        keep[(fields[:, None] + np.arange(8)).ravel()] = False
        blob = region[keep].tobytes()
        try:
            blob.decode("utf-8")
        except UnicodeDecodeError:
            return None
        starts = np.cumsum(lens) - lens
        first = np.frombuffer(blob, dtype=np.uint8)[starts[lens > 0]] if len(blob) else np.zeros(0, np.uint8)
        if ((first & 0xC0) == 0x80).any():
            return None
        self.pos = pos
        return StringArray(blob, lens)

    def _layout(self, name: str, dims: list[int], kind: int) -> tuple[int, int]:
        """(rows, bytes per row) of a tensor of this shape and GGML type."""
        try:
            type_name, block, size = GGML_TYPES[kind]
        except KeyError:
            raise CheckpointError(f"{self.path}: tensor {name!r} has unknown GGML tensor type {kind}") from None
        if dims[0] % block:
            raise CheckpointError(f"{self.path}: tensor {name!r}: row length {dims[0]} is not a multiple of the "
                                  f"{type_name} block size {block}")
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
        self._offsets = np.zeros(len(lengths) + 1, dtype=np.int64)  # string i is blob[offsets[i]:offsets[i + 1]]
        np.cumsum(lengths, out=self._offsets[1:])

    @classmethod
    def of(cls, strings: list[str]) -> "StringArray":
        parts = [t.encode("utf-8") for t in strings]
        return cls(b"".join(parts), np.fromiter((len(b) for b in parts), dtype=np.int64, count=len(parts)))

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("StringArray index out of range")
        return self._blob[self._offsets[i]:self._offsets[i + 1]].decode("utf-8")

    def tolist(self) -> list[str]:
        """Every string, in one decode: the blob with a NUL before each string, split at the NULs (where the
        strings hold no NUL themselves; else one decode per string). 4x faster than iterating."""
        if b"\x00" in self._blob:
            return list(self)
        lengths = np.diff(self._offsets)
        data = np.frombuffer(self._blob, dtype=np.uint8)
        joined = np.zeros(len(data) + len(lengths), dtype=np.uint8)
        # byte k of the blob, in string i, moves past the i + 1 separators before it
        joined[np.arange(len(data)) + np.repeat(np.arange(1, len(lengths) + 1), lengths)] = data
        return joined.tobytes().decode("utf-8").split("\x00")[1:]

    def __iter__(self):
        blob, offsets = self._blob, self._offsets.tolist()
        for a, b in zip(offsets, offsets[1:]):
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
        st = os.stat(path)
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read ({err.strerror or err})") from None
    return _cached_reader(path, st.st_size, st.st_mtime_ns, st.st_ino)


@functools.lru_cache(maxsize=4)
def _cached_reader(path: str, size: int, mtime_ns: int, inode: int) -> GGUFFile:
    return GGUFFile(path)


_reader.cache_clear = _cached_reader.cache_clear
