"""`attnlab …`: every subcommand is a module in this package with NAME, HELP, add_arguments(parser)
and run(args); each is a few lines over a library function a user can call from Python.

`attnlab --help` and `attnlab COMMAND --help` answer at once: the top-level help comes from the table
below, and only the command named on the command line has its module imported (a module imports torch
and the rest of the library inside run(), never at import or in add_arguments)."""
from __future__ import annotations

import argparse
import importlib
import sys

from .. import __version__

# name -> (module in this package, group, one-line help). The order is the order `attnlab --help` lists them
# in; tests/test_cli_help.py holds each line equal to its module's NAME and HELP.
TABLE: dict[str, tuple[str, str, str]] = {
    "embed": ("embed", "use", "embed each line of a text file into one vector (.npy)"),
    "index": ("index", "use", "build a dense or ColBERT-style retrieval index over passages"),
    "search": ("search", "use", "query a retrieval index; --squad scores recall@k"),
    "generate": ("generate", "use", "continue a prompt with a decoder (GPT-2, LLaMA-style, .gguf), streaming"),
    "translate": ("translate", "use", "translate a file line by line with an encoder-decoder"),
    "predict": ("predict", "use", "predict labels, tags or answers with a fine-tuned model"),
    "finetune": ("finetune", "train", "fine-tune an encoder on a task; writes the model and metrics.json"),
    "pretrain": ("pretrain", "train", "pretrain a model (MLM, MLM+NSP/SOP or causal LM) from a YAML recipe"),
    "distill": ("distill", "train", "distil a teacher into a smaller student (DistilBERT, TinyBERT, MiniLM)"),
    "sft": ("sft", "train", "instruction-tune a decoder on chat data (optional LoRA)"),
    "dpo": ("dpo", "train", "preference-tune a decoder with DPO (optional LoRA)"),
    "soup": ("soup", "train", "average the weights of fine-tuned runs into one model (a model soup)"),
    "tokenizer": ("tokenizer", "train", "train a WordPiece, BPE, Unigram or character tokenizer"),
    "prepare": ("prepare", "train", "tokenize text files into token shards for pretraining"),
    "evaluate": ("evaluate", "evaluate", "score a fine-tuned model on labelled data, or an LM's perplexity"),
    "curve": ("curve", "evaluate", "accuracy against number of labeled examples, pretrained vs scratch"),
    "evaluate-prompting": ("prompting", "evaluate", "zero/k-shot prompting of a decoder, scored without training"),
    "info": ("info", "inspect", "a model's config, parameters and a per-layer shape/FLOP walkthrough"),
    "viz": ("viz", "inspect", "attention views of a model on a text, as one self-contained HTML page"),
    "explore": ("explore", "inspect", "explore a model's attention and predictions interactively in the browser"),
    "plot": ("plot", "inspect", "training curves (PNG) and a summary from a run's metrics.jsonl"),
    "env": ("env", "inspect", "what a bug report needs: versions, CPU, precisions, kernels, paths"),
    "serve": ("serve", "serve", "serve a model over HTTP (OpenAI-shaped embeddings, completions, chat)"),
    "experiment": ("experiment", "research", "rerun one of the notes' claims as a measurement"),
    "completion": ("completion", "shell", "print a bash or zsh completion script"),
}
GROUPS = ("use", "train", "evaluate", "inspect", "serve", "research", "shell")
COMMANDS = [module for module, _, _ in TABLE.values()]  # the modules, in that order

EPILOG = """\
MODEL is a model directory in the Hugging Face layout (config.json + weights), a .gguf file, an
installed model package (minilm: all-MiniLM-L6-v2, smollm2: SmolLM2-135M-Instruct), or a hub name
(ORG/NAME) found in the Hugging Face cache. A hub name found nowhere local is downloaded only when
huggingface_hub is installed and HF_HUB_OFFLINE is not set.

examples:
  attnlab info minilm
  attnlab embed minilm --input sentences.txt --output vectors.npy
  attnlab generate smollm2 --chat --prompt "What is attention?"

Run `attnlab COMMAND --help` for a command's options and examples. Guides: docs/guides/"""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """A command's help: its description and examples printed as written, and each option's help starting
    at column 32, so that most options take one line."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 32, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, width)


def short_usage(parser: argparse.ArgumentParser) -> str:
    """"%(prog)s TASK --output DIR [options]": the positionals and required options only (the options
    follow in the help); argparse's own usage lists every option, a dozen lines for the larger commands."""
    words = []
    for action in parser._actions:  # noqa: SLF001
        if action.help is argparse.SUPPRESS or (action.option_strings and not action.required):
            continue
        name = action.metavar or action.dest.upper()
        if action.option_strings:
            words.append(f"{max(action.option_strings, key=len)} {name}")
        elif action.nargs in ("+", argparse.PARSER):
            words.append(f"{name} ...")
        else:
            words.append(f"[{name} ...]" if action.nargs == "*" else f"[{name}]" if action.nargs == "?" else name)
    return " ".join(["%(prog)s", *words, "[options]"])


def _overview() -> str:
    lines = ["The Transformer family from scratch on PyTorch: inspect, embed, train, evaluate, serve.", ""]
    width = max(map(len, TABLE)) + 2
    for group in GROUPS:
        lines.append(f"{group}:")
        lines += [f"  {name:<{width}}{text}" for name, (_, g, text) in TABLE.items() if g == group]
    return "\n".join(lines)


def command_module(name: str):
    """The module of command `name` (imports it: cheap, the library loads in its run())."""
    return importlib.import_module(f"{__name__}.{TABLE[name][0]}")


def build_parser(only: str | None = None, *, names: bool = True) -> argparse.ArgumentParser:
    """The `attnlab` parser. Without `only`, every command with its options (documentation, tests).
    With only=NAME, that command alone: what `main` builds when the command line names it, so that one
    command's --help or run imports one module. With only="", every command's name (names=False: none) and
    none of their options: enough for argparse to list the choices when the command line names no command."""
    parser = argparse.ArgumentParser(prog="attnlab", description=_overview(), epilog=EPILOG,
                                     usage="attnlab [-h] [--version] [--debug] COMMAND ...",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    if only == "":  # the grouped overview above lists the commands: argparse's own list would repeat it
        sub = parser.add_subparsers(dest="command", metavar="COMMAND", help=argparse.SUPPRESS)
        for name in TABLE if names else ():
            sub.add_parser(name, prog=f"attnlab {name}", add_help=False)
        return parser
    # listed with their help here: shell completion (shtab) and the generated reference read them
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help="the command (see the groups above)")
    for name in [only] if only else TABLE:
        module = command_module(name)
        p = sub.add_parser(module.NAME, prog=f"attnlab {module.NAME}", description=module.__doc__,
                           help=module.HELP, formatter_class=HelpFormatter)
        p.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
        module.add_arguments(p)
        p.usage = short_usage(p)
        p.set_defaults(run=module.run)
    return parser


def _parser_for(argv: list[str]) -> argparse.ArgumentParser:
    """The least parser that reads argv alike: the command named by its first word that is not an option
    (the top-level options take no value); when that word names no command, the names argparse lists in
    its error; with no such word (`attnlab --help`), no command at all."""
    word = next((a for a in argv if not a.startswith("-")), None)
    if word in TABLE:
        return build_parser(only=word)
    return build_parser(only="", names=word is not None)


# commands that need no torch: the rest import it before their work starts anyway
NO_TORCH = frozenset({"completion", "plot", "prepare", "tokenizer"})
# commands that import torch only on some paths, and settle then (generate: not for a greedy .gguf)
SETTLE_LATER = frozenset({"generate"})
# OpenMP threads that sleep between parallel regions instead of spinning: the server's decode steps run many
# small products, between which spinning OpenMP threads kept a 2-core CPU from attnlab's own kernel threads
# (serving benchmark, 2 threads: 42.0 -> 47.5 tok/s). Training's large products lose by it (-20% a step), so
# only here (and for `generate` on a quantized .gguf, which asks for it), and only where the user has not set it.
PASSIVE_OPENMP = frozenset({"serve"})
_settled = False


def settle_imports(command: str, passive_openmp: bool = False) -> None:
    """Import torch now and move every object the imports made (about a million for torch) into the garbage
    collector's permanent generation, once per process. Otherwise the full collections that building a model
    and a tokenizer triggers walk them all again: 0.15-0.3 s of a `generate` cold start. Objects made
    afterwards are collected as usual; only cycles among the frozen ones would never be."""
    global _settled
    if _settled or command in NO_TORCH:
        return
    import gc
    import os
    if (command in PASSIVE_OPENMP or passive_openmp) and "torch" not in sys.modules:  # read once, when OpenMP starts
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    import torch  # noqa: F401
    gc.freeze()
    _settled = True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser_for(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        from .paths import check_inputs
        check_inputs(parser, args.command, args)  # a missing or unreadable input: one line, before any work
        if args.command not in SETTLE_LATER:
            settle_imports(args.command)
        if getattr(args, "dtype", None) == "bf16" or getattr(args, "precision", None) == "bf16":
            from ..nn.precision import bf16_warning
            warning = bf16_warning()
            if warning:
                print(f"attnlab {args.command}: {warning}", file=sys.stderr)
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # one clear line for the user; --debug shows where it came from
        if args.debug:
            raise
        kind = "" if isinstance(err, (OSError, ValueError)) else f"{type(err).__name__}: "
        message = " ".join(line.strip() for line in str(err).splitlines() if line.strip())  # exactly one line
        print(f"attnlab {args.command}: error: {kind}{message}", file=sys.stderr)
        return getattr(err, "exit_status", 1)  # usage errors (a bad direction, unscorable text) say 2


if __name__ == "__main__":
    sys.exit(main())
