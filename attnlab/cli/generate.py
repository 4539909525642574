"""Continue a prompt with a causal language model, streaming the text to the terminal as it is
decoded. Greedy by default; --temperature > 0 samples (optionally within --top-k / --top-p);
--num-beams N runs beam search. --chat wraps the prompt in the model's chat template as a user
message. Greedy decoding of a quantized .gguf starts without loading torch
(ATTNLAB_GENERATE_TORCH=1: the torch path).

examples:
  attnlab generate smollm2 --chat --prompt "What is the capital of France?"
  attnlab generate smollm2 --prompt "Once upon a time" --temperature 0.8 --top-p 0.95 --seed 1
  attnlab generate smollm2 --prompt "Attention is" --num-beams 4 --max-new-tokens 20
  attnlab generate smollm2 --adapter runs/smol-sft --chat --prompt "Classify: a dull film."

Guide: docs/guides/generation-and-serving.md (--compile, .gguf speed:
docs/guides/command-details.md)
"""
from __future__ import annotations

import argparse
import os
import sys

NAME = "generate"
# Longest prompt the torch-free path takes: its prompt pass runs on the block kernels (~165 tokens/s on one
# Zen 3 core against ~270 through torch's GEMM), which ~2 s of torch import pay back only past ~800 tokens.
LEAN_MAX_PROMPT = 768
HELP = "continue a prompt with a decoder (GPT-2, LLaMA-style, .gguf), streaming"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a causal LM directory, a .gguf file or a packaged name (smollm2)")
    p.add_argument("--prompt", required=True, help="the text to continue (with --chat: the user's message)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="most tokens to generate (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=None, help="sample only among the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="sample from the smallest set with this much "
                                                             "probability, in (0, 1]")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats (default 1.0)")
    p.add_argument("--num-beams", type=int, default=1, help="beam search with this many beams (default 1: off)")
    p.add_argument("--seed", type=int, default=None, help="random seed for reproducible sampling")
    p.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="stop when this text appears (repeatable); it is not printed")
    p.add_argument("--adapter", metavar="DIR", help="a LoRA adapter in peft's layout (adapter_config.json + "
                                                    "adapter_model.safetensors), merged into MODEL before decoding")
    p.add_argument("--chat", action="store_true", help="format the prompt with the model's chat template")
    p.add_argument("--system", default=None, help="with --chat: a system message")
    p.add_argument("--compile", action="store_true",
                   help="decode through a compiled step with a static KV cache; the first run for a model and "
                        "batch size compiles for minutes and keeps the step under $ATTNLAB_CACHE/compiled, later "
                        "runs load it. A .gguf decodes faster without it (--compile dequantizes to fp32)")
    p.add_argument("--dequantize", action="store_true",
                   help=".gguf: dequantize the weights to fp32 (default: Q4_0/Q4_1/Q8_0 stay quantized: "
                        "faster, less memory, the same greedy text)")
    p.add_argument("--exact", action="store_true",
                   help=".gguf kept quantized: fp32 activations, greedy text equal to --dequantize's (default: "
                        "int8 activations where the CPU has AVX512-VNNI or AVX2, as llama.cpp; near-ties can flip)")
    p.add_argument("--truncate-left", action="store_true",
                   help="drop the oldest prompt tokens when prompt + max-new-tokens exceeds the context "
                        "(default: error)")


def _keep_quantized(args: argparse.Namespace) -> bool:
    """A .gguf file runs on its quantized blocks unless --dequantize or --compile (inductor compiles the
    fp32 model) asks otherwise, or the block kernels cannot be built here (then fp32, with a note)."""
    from ..interop.api import keeps_quantized
    note = lambda s: print(s, file=sys.stderr)  # noqa: E731
    quantized = keeps_quantized(args.model, args.dequantize, note=note)
    if quantized and args.compile:  # inductor compiles the fp32 model
        note("note: --compile dequantizes this .gguf to fp32; its default quantized path decodes about 2x "
             "faster at batch 1 (benchmarks/compile_start.py)")
        return False
    return quantized


def _messages(args: argparse.Namespace) -> list[dict]:
    return ([{"role": "system", "content": args.system}] if args.system else []) + \
        [{"role": "user", "content": args.prompt}]


def _gguf(model: str):
    """The .gguf file MODEL names, else None."""
    from ..locate import resolve
    path = resolve(model)
    return path if path.suffix.lower() == ".gguf" else None


def _run_lean(args: argparse.Namespace) -> bool:
    """Greedy decoding of a .gguf kept quantized runs on the C kernels with no torch import
    (inference/lean.py): the first token comes ~2 s sooner. False (nothing printed) when it does not apply."""
    if (args.temperature != 0 or args.num_beams != 1 or args.repetition_penalty != 1.0 or args.adapter
            or args.compile or args.dequantize or os.environ.get("ATTNLAB_GENERATE_TORCH") == "1"):
        return False
    path = _gguf(args.model)
    if path is None:
        return False
    from ..gguf_meta import tokenizer_from_gguf
    from ..inference.chat import apply_chat_template
    from ..inference.lean import LeanDecoder
    from ..inference.text_stream import prompt_tokens_kept, text_pieces
    decoder, _ = LeanDecoder.open(path)
    if decoder is None:
        return False  # (the torch path says why, if it matters: no kernels, another tensor type)
    tokenizer = tokenizer_from_gguf(path)
    prompt = apply_chat_template(tokenizer, _messages(args), add_generation_prompt=True) if args.chat else args.prompt
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    if not ids:
        raise ValueError("a prompt encodes to no tokens; generation needs at least one")
    keep = prompt_tokens_kept(len(ids), args.max_new_tokens, decoder.cfg.max_position_embeddings,
                              "left" if args.truncate_left else "error")
    if keep > LEAN_MAX_PROMPT:
        return False
    before = decoder.exact(True) if args.exact else None
    try:
        tokens = decoder.greedy(ids[len(ids) - keep:], args.max_new_tokens)
        for piece in text_pieces(tokens, tokenizer, decoder.eos, args.stop or ()):
            sys.stdout.write(piece)
            sys.stdout.flush()
    finally:
        if before is not None:
            decoder.exact(before)  # (a process that goes on, as a test's, keeps its own setting)
    sys.stdout.write("\n")
    return True


def run(args: argparse.Namespace) -> int:
    from ..inference.text_stream import check_sampling
    check_sampling(args.temperature, args.top_k, args.top_p, args.repetition_penalty, args.num_beams,
                   args.max_new_tokens)
    if _run_lean(args):
        return 0
    from . import settle_imports
    # a quantized .gguf: its step's products run on attnlab's C threads, between torch's small ops whose OpenMP
    # threads would otherwise spin on the same cores (200 sampled SmolLM2 tokens on 2 cores: 5.8-6.2 s, 3.6-4.6 s)
    settle_imports(NAME, passive_openmp=_gguf(args.model) is not None and not (args.dequantize or args.compile))
    import attnlab
    from ..inference.chat import apply_chat_template
    from ..inference.generate import stream
    model = attnlab.load(args.model, quantized=_keep_quantized(args))
    if not model.config.causal or not hasattr(model, "lm_head"):
        raise ValueError(f"{args.model}: {model.hf_architecture or type(model).__name__} is not a causal LM "
                         "(generation needs a decoder with an LM head)")
    if args.adapter:
        from ..interop.peft import attach_adapter
        attach_adapter(model, args.adapter)
    tokenizer = attnlab.load_tokenizer(args.model)
    prompt = args.prompt
    if args.chat:
        prompt = apply_chat_template(tokenizer, _messages(args), add_generation_prompt=True)
    if args.compile:
        if args.num_beams > 1:
            raise ValueError("--compile covers greedy and sampled decoding, not beam search (--num-beams > 1)")
        # (inference/aot.py says whether it compiles, minutes once per model and batch size, or loads)
    pieces = stream(model, tokenizer, prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                    top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty,
                    seed=args.seed, num_beams=args.num_beams, stop_strings=args.stop,
                    truncation="left" if args.truncate_left else "error",
                    **({"compile": True} if args.compile else {}))
    import contextlib

    from ..nn.quantized import exact_products
    with exact_products() if args.exact else contextlib.nullcontext():
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
    sys.stdout.write("\n")
    return 0
