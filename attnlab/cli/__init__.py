"""`attnlab …`: every subcommand is a module in this package with NAME, HELP, add_arguments(parser)
and run(args); each is a few lines over a library function a user can call from Python."""
from __future__ import annotations

import argparse
import importlib
import sys

from .paths import check_inputs

# The order here is the order `attnlab --help` lists them in.
COMMANDS = ["info", "embed", "index", "search", "generate", "viz", "plot", "finetune", "soup", "evaluate", "predict", "curve", "tokenizer", "prepare", "pretrain", "distill", "translate", "serve", "sft", "dpo", "prompting", "experiment"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnlab",
        description="The Transformer family from scratch on PyTorch: inspect, embed, train, evaluate, serve.",
        epilog="MODEL is a directory in the Hugging Face layout (config.json + model.safetensors), a preset "
               "name where noted, or the name of a locally installed model package "
               "(e.g. sentence-transformers/all-MiniLM-L6-v2). Nothing is ever downloaded. "
               "Run `attnlab COMMAND --help` for a command's options.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name in COMMANDS:
        module = importlib.import_module(f"{__name__}.{name}")
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        check_inputs(parser, args.command, args)  # a missing or unreadable input: one line, before any work
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
