"""Every file or directory a command reads, checked before the command starts: a missing path, a directory
where a file belongs (or the reverse) or an unreadable one stops it with one line naming the option and
the path, e.g. `attnlab embed: error: --input /x/y.txt: no such file`.

`INPUTS` is the one table of which arguments name inputs, per command as typed on the command line
(outputs are not checked: they are created). Kinds:
  file             an existing, readable regular file
  files            a list of those (nargs), or one string of comma-separated files
  dir              an existing, readable directory
  run_dir          a directory holding a readable metrics.jsonl (named in the message when missing)
  model            a model directory (config.json or attnlab_config.json), a .gguf file or a packaged name
  models           a list of those (a repeated option)
  model_or_preset  a preset name (bert-base, ...) or a model
  tokenizer        "char", or an existing readable tokenizer directory or file
  adapters         a list (a repeated option) of directories, each possibly named: NAME=DIR
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

INPUTS: dict[str, dict[str, str]] = {
    "info": {"model": "model_or_preset"},
    "embed": {"model": "model", "input": "file"},
    "index": {"passages": "file", "model": "model"},
    "search": {"index": "dir", "model": "model", "squad": "file"},
    "generate": {"model": "model", "adapter": "dir"},
    "viz": {"model": "model"},
    "plot": {"run_dir": "run_dir"},
    "finetune": {"model": "model_or_preset", "train": "files", "valid": "file", "test": "files", "train_src": "file",
                 "train_tgt": "file", "valid_src": "file", "valid_tgt": "file"},
    "soup": {"models": "models"},
    "evaluate": {"model": "model", "data": "file", "source": "file", "reference": "file"},
    "predict": {"model": "model", "input": "file"},
    "tokenizer": {"files": "files"},
    "prepare": {"files": "files", "tokenizer": "tokenizer"},
    "pretrain": {"config": "file"},
    "experiment": {"data": "dir"},
    "distill": {"teacher": "model", "corpus": "dir"},
    "translate": {"model": "model", "input": "file"},
    "serve": {"model": "model", "api_key_file": "file", "ssl_certfile": "file", "ssl_keyfile": "file",
              "adapter": "adapters"},
    "curve": {"model": "models", "scratch": "models", "train": "file", "valid": "file"},
    "sft": {"model": "model", "data": "file", "valid": "file"},
    "dpo": {"model": "model", "data": "file"},
    "evaluate-prompting": {"model": "model", "data": "file", "pool": "file"},
    "explore": {"model": "model", "api_key_file": "file"},
    "env": {},
    "completion": {},
}


class PathError(OSError):
    """An input path that cannot be read as the option needs; the message names the option and the path."""


def _unreadable(path: Path) -> bool:
    need = os.R_OK | (os.X_OK if path.is_dir() else 0)
    if not os.access(path, need):
        return True
    try:  # root passes os.access for anything; an open still fails on some file systems
        if path.is_dir():
            os.listdir(path)
        else:
            with open(path, "rb"):
                pass
    except PermissionError:
        return True
    return False


def _why_not_file(path: Path) -> str | None:
    if not path.exists():
        return "no such file"
    if path.is_dir():
        return "is a directory, expected a file"
    if _unreadable(path):
        return "permission denied"
    return None


def _why_not_dir(path: Path) -> str | None:
    if not path.exists():
        return "no such directory"
    if not path.is_dir():
        return "is a file, expected a directory"
    if _unreadable(path):
        return "permission denied"
    return None


def _why_not_model(value: str) -> tuple[Path, str | None]:
    from ..locate import resolve  # (no torch: `generate` on a .gguf may not need it at all)
    try:
        path = resolve(value)
    except FileNotFoundError as err:
        return Path(value), str(err).removeprefix(f"{value}: ")
    if not path.exists():
        return path, "no such file or directory"
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            return path, "is a file, expected a model directory (config.json + weights) or a .gguf file"
        return path, "permission denied" if _unreadable(path) else None
    if _unreadable(path):
        return path, "permission denied"
    if not (path / "config.json").exists() and not (path / "attnlab_config.json").exists():
        return path, "not a model directory (no config.json)"
    return path, None


def check(kind: str, value) -> list[tuple[str, str]]:
    """(path, reason) for each problem with `value` as an input of this kind; [] when it is fine."""
    if value is None:
        return []
    if kind == "files":
        items = value if isinstance(value, (list, tuple)) else [v for v in str(value).split(",") if v]
        return [p for item in items for p in check("file", item)]
    if kind == "models":
        return [p for item in value for p in check("model", item)]
    if kind == "adapters":
        return [p for item in value for p in check("dir", split_named(item)[1])]
    if kind == "model_or_preset":
        from ..config import PRESETS
        return [] if str(value) in PRESETS else check("model", value)
    if kind == "tokenizer":
        if str(value) == "char":
            return []
        path = Path(value)
        why = "no such file or directory" if not path.exists() else "permission denied" if _unreadable(path) else None
        return [(str(path), why)] if why else []
    if kind == "model":
        path, why = _why_not_model(str(value))
        return [(str(value), why)] if why else []
    if kind == "run_dir":
        path = Path(value)
        if path.is_dir() and not _unreadable(path):
            return check("file", path / "metrics.jsonl")
        if not path.exists():
            return [(str(path / "metrics.jsonl"), "no such file")]
    why = {"file": _why_not_file, "dir": _why_not_dir, "run_dir": _why_not_dir}[kind](Path(value))
    return [(str(value), why)] if why else []


def split_named(value: str) -> tuple[str | None, str]:
    """"NAME=DIR" -> (NAME, DIR); a plain DIR (also one whose own name holds "=") -> (None, DIR)."""
    name, sep, path = str(value).partition("=")
    if not sep or Path(value).exists() or not name or "/" in name:
        return None, str(value)
    return name, path


def option_name(parser: argparse.ArgumentParser, dest: str) -> str:
    """How the user spelled the argument: "--input", or the metavar of a positional ("MODEL")."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                name = option_name(sub, dest)
                if name != dest.upper():
                    return name
        elif action.dest == dest:
            longs = [o for o in action.option_strings if o.startswith("--")]
            return (longs or action.option_strings or [action.metavar or dest.upper()])[0]
    return dest.upper()


def check_inputs(parser: argparse.ArgumentParser, command: str, args: argparse.Namespace) -> None:
    """Raise PathError for the first unusable input of `command` (`parser`: the top-level parser)."""
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parser = subs.choices[command]
    for dest, kind in INPUTS.get(command, {}).items():
        problems = check(kind, getattr(args, dest, None))
        if problems:
            path, why = problems[0]
            raise PathError(f"{option_name(parser, dest)} {path}: {why}")
