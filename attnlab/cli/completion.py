"""Print a shell completion script for attnlab, generated from its parsers (commands, options,
choices). It needs the optional package shtab (pip install shtab). Load it from the shell's
startup file, e.g. add `eval "$(attnlab completion bash)"` to ~/.bashrc; for zsh write it to a
file named _attnlab in a folder of $fpath.

examples:
  attnlab completion bash
  attnlab completion zsh
"""
from __future__ import annotations

import argparse
import sys

NAME = "completion"
HELP = "print a bash or zsh completion script"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")


def run(args: argparse.Namespace) -> int:
    try:
        import shtab  # optional: only this command needs it
    except ImportError:
        print("attnlab completion: error: the shtab package is not installed (pip install shtab)", file=sys.stderr)
        return 1
    from . import build_parser
    print(shtab.complete(build_parser(), shell=args.shell))
    return 0
