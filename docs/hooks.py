"""MkDocs hook: the reference pages that are generated from the code at build time.

`mkdocs build` alone makes the whole site; these pages are never written into docs/, so they cannot go
stale: the CLI page comes from the argparse parsers, the ModelConfig page from the dataclass and
`attnlab.config.FIELD_DOCS`, the families page from the interop registry, the HTTP page from the FastAPI
app's OpenAPI schema. Each generator is a plain function returning markdown (tests/test_docs_build.py
checks the built pages against the code).
"""
from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]


def cell(text: object) -> str:
    """One markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code(text: object) -> str:
    """Inline code in a table cell; backticks inside the value would end the span, so they become quotes."""
    return f"`{cell(text).replace('`', chr(39))}`"


# ----------------------------------------------------------------------------------------- CLI
def _options_table(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        name = ", ".join(action.option_strings) or (action.metavar or action.dest)
        if action.option_strings and action.nargs != 0:
            name += " " + (action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices
                                              else action.dest.upper()))
        default = action.default
        hidden = default is None or default is False or default == argparse.SUPPRESS or action.nargs == 0
        shown = "" if hidden else code(repr(default))  # 0 is a default worth showing; False of a flag is not
        help_text = formatter._expand_help(action) if action.help else ""
        rows.append(f"| {code(name)} | {shown} | {cell(help_text)} |")
    if not rows:
        return []
    return ["| option | default | meaning |", "| --- | --- | --- |", *rows, ""]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """{name: (one-line help, parser)} of the parser's subcommands, in the order `--help` lists them."""
    from attnlab import cli

    table = getattr(cli, "TABLE", {})  # name -> (module, group, one-line help) where the CLI keeps one
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                if sub not in [p for _, p in out.values()]:  # aliases point at the same parser
                    row = table.get(name)
                    out[name] = (row[-1] if row and parser.prog == "attnlab" else helps.get(name, ""), sub)
    return out


def _command_section(path: str, help_line: str, parser: argparse.ArgumentParser, depth: int) -> list[str]:
    lines = [f"{'#' * depth} {path}", ""]
    if help_line:
        lines += [help_line[0].upper() + help_line[1:] + ("" if help_line.endswith(".") else "."), ""]
    if parser.description:  # kept verbatim: the --help text is laid out for a terminal
        lines += ["````text", parser.description.strip("\n"), "````", ""]  # four: a ``` inside stays text
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    lines += _options_table(parser)
    for name, (sub_help, sub) in _subparsers(parser).items():
        lines += _command_section(f"{path} {name}", sub_help, sub, min(depth + 1, 4))
    return lines


def cli_page() -> str:
    import os

    from attnlab import cli
    from attnlab.cli import build_parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps usage to the terminal: the page must not depend on it
    try:
        return _cli_markdown(cli, build_parser())
    finally:
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns


def _cli_markdown(cli, parser: argparse.ArgumentParser) -> str:
    commands = _subparsers(parser)
    lines = ["# CLI reference", "",
             "Generated from the `attnlab` argument parsers when the site is built: the same text as "
             "`attnlab --help` and `attnlab COMMAND --help`.", "",
             "```text", parser.format_usage().strip(), "```", "",
             "| command | group | what it does |", "| --- | --- | --- |"]
    table = getattr(cli, "TABLE", {})  # name -> (module, group, help) where the CLI groups its commands
    lines += [f"| [`{name}`](#attnlab-{name}) | {table[name][1] if name in table else ''} | {cell(help_line)} |"
              for name, (help_line, _) in commands.items()]
    lines += [""] + _options_table(parser)
    if parser.epilog:  # laid out for a terminal, with examples
        lines += ["````text", parser.epilog.strip("\n"), "````", ""]
    for name, (help_line, sub) in commands.items():
        lines += _command_section(f"attnlab {name}", help_line, sub, 2)
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- ModelConfig
def config_page() -> str:
    from attnlab.config import FIELD_DOCS, ModelConfig

    lines = ["# ModelConfig fields", "",
             "Every architectural switch is a field of `attnlab.ModelConfig` (generated from the dataclass when "
             "the site is built). `ModelConfig.from_dict` and `ModelConfig.save` use these keys, and so does "
             "`attnlab info MODEL --set KEY=VALUE`; an unknown key is an error that names it. Presets are named "
             "sets of values: `attnlab.preset(\"bert-base\")`.", "",
             "| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    for f in dataclasses.fields(ModelConfig):
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "(required)"
        lines.append(f"| `{f.name}` | {code(f.type)} | {code(default)} | {cell(FIELD_DOCS.get(f.name, ''))} |")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------- families
# families with no transformers class to hold them against: what they are instead
NO_HF_CLASS = {"transformer": "none: the original Transformer has no transformers class (attnlab's own config.json)"}


def _parity_tests(names: list[str]) -> list[str]:
    """Test files that build one of these classes from transformers (`transformers.X` or the name as a string)."""
    found = []
    for test in sorted((REPO / "tests").glob("test_*.py")):
        text = test.read_text(encoding="utf-8")
        if "import transformers" in text or 'importorskip("transformers")' in text or "from transformers" in text:
            if any(re.search(rf"transformers\.{n}\b|[\"']{n}[\"']|import [^\n]*\b{n}\b", text) for n in names):
                found.append(test.name)
    return found


def families_page() -> str:
    import attnlab.interop  # noqa: F401  (importing the package registers every family)
    from attnlab.interop.registry import FAMILIES

    lines = ["# Families", "",
             "The checkpoint families attnlab reads and writes (generated from the interop registry when the site "
             "is built). `model_type` is the key in a Hugging Face `config.json`; the classes are the "
             "`architectures` names a checkpoint may carry. Parity: the largest difference from `transformers` "
             "on the same weights and inputs, in fp32, that the tests listed allow (hidden states and logits, "
             "loading and saving back).", "",
             "| `model_type` | Hugging Face classes | default class | parity | tested in |",
             "| --- | --- | --- | --- | --- |"]
    for model_type, family in sorted(FAMILIES.items()):
        names = list(family.architectures)
        tests = [] if model_type in NO_HF_CLASS else _parity_tests(names)
        parity = NO_HF_CLASS.get(model_type) or ("≤ 1e-5 (fp32)" if tests else "not tested against transformers")
        lines.append(f"| `{model_type}` | {', '.join(f'`{n}`' for n in names)} | `{family.default_architecture}` | "
                     f"{parity} | {', '.join(f'`{t}`' for t in tests) or '-'} |")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------- HTTP API
def _schema_type(schema: dict) -> str:
    if "anyOf" in schema:
        return " or ".join(_schema_type(s) for s in schema["anyOf"])
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if schema.get("type") == "array":
        return f"array of {_schema_type(schema.get('items', {}))}"
    if "enum" in schema:
        return " / ".join(map(repr, schema["enum"]))
    return schema.get("type", "any")


def _limits(schema: dict) -> str:
    words = {"minimum": "≥", "maximum": "≤", "exclusiveMinimum": ">", "exclusiveMaximum": "<",
             "minLength": "length ≥", "maxLength": "length ≤", "minItems": "items ≥", "maxItems": "items ≤"}
    parts = [f"{w} {schema[k]:g}" if isinstance(schema[k], float) else f"{w} {schema[k]}"
             for k, w in words.items() if k in schema]
    for sub in schema.get("anyOf", []):
        parts.append(_limits(sub))
    return ", ".join(p for p in parts if p)


def _fields_table(schema: dict, schemas: dict) -> list[str]:
    if "$ref" in schema:
        schema = schemas[schema["$ref"].rsplit("/", 1)[-1]]
    required = set(schema.get("required", []))
    props = schema.get("properties", {})
    described = any(p.get("description") for p in props.values())  # no empty column when no field says more
    rows = ["| field | type | required | default | limits |" + (" meaning |" if described else ""),
            "| --- | --- | --- | --- | --- |" + (" --- |" if described else "")]
    for name, prop in props.items():
        default = code(repr(prop["default"])) if "default" in prop else ""
        rows.append(f"| `{name}` | {cell(_schema_type(prop))} | {'yes' if name in required else ''} | {default} | "
                    f"{cell(_limits(prop))} |" + (f" {cell(prop.get('description', ''))} |" if described else ""))
    return rows + [""]


def _tiny_apps():
    """A random 1-layer classifier and decoder on the byte tokenizer: together they expose every endpoint."""
    import torch

    import attnlab
    from attnlab.serve import create_app

    torch.manual_seed(0)
    tok = attnlab.load_tokenizer("byte")
    cfg = attnlab.preset("bert-tiny", vocab_size=len(tok), num_layers=1, hidden_size=32, num_heads=2,
                         intermediate_size=64)
    cfg.extra.update(id2label={"0": "negative", "1": "positive"}, num_labels=2)
    clf = attnlab.from_config(cfg, architecture="BertForSequenceClassification").eval()
    dec = attnlab.from_config(attnlab.ModelConfig(
        model_type="llama", vocab_size=len(tok), hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
        position="rope", norm="rmsnorm", activation="swiglu", bias=False, causal=True, norm_placement="pre",
        embedding_norm=False, pooler=False, type_vocab_size=0, pad_token_id=None, eos_token_id=2)).eval()
    return {"encoder with a classification head": create_app(clf, tok, start_engine=False).openapi(),
            "decoder": create_app(dec, tok, start_engine=False).openapi()}


def http_page() -> str:
    specs = _tiny_apps()
    ops: dict[tuple[str, str], dict] = {}
    served: dict[tuple[str, str], list[str]] = {}
    schemas: dict = {}
    for kind, spec in specs.items():
        schemas.update(spec.get("components", {}).get("schemas", {}))
        for path, methods in spec["paths"].items():
            for method, op in methods.items():
                if op.get("summary") == "Handler":  # the stub that answers 404 "needs a decoder/classifier"
                    continue
                ops.setdefault((path, method), op)
                served.setdefault((path, method), []).append(kind)
    lines = ["# HTTP API", "",
             "`attnlab serve MODEL` answers these requests (generated from the server's OpenAPI schema when the "
             "site is built; a running server also serves it at `/openapi.json`). Which endpoints exist depends on "
             "the model; the others answer 404 with a JSON error that says what they need. Every rejection is a "
             "4xx with a body `{\"error\": {\"message\", \"type\", \"param\", \"code\"}}`.", "",
             "| method | path | served for | summary |", "| --- | --- | --- | --- |"]
    order = sorted(ops, key=lambda k: (not k[0].startswith("/v1"), k[0], k[1]))
    for path, method in order:
        kinds = served[(path, method)]
        who = "every model" if len(kinds) == len(specs) else " / ".join(kinds)
        lines.append(f"| {method.upper()} | `{path}` | {who} | {cell(ops[(path, method)].get('summary', ''))} |")
    lines.append("")
    for path, method in order:
        op = ops[(path, method)]
        lines += [f"## {method.upper()} {path}", ""]
        if op.get("description"):
            lines += [op["description"].strip(), ""]
        params = op.get("parameters", [])
        if params:
            lines += ["| query parameter | type | required | default |", "| --- | --- | --- | --- |"]
            for p in params:
                s = p.get("schema", {})
                default = code(repr(s["default"])) if "default" in s else ""
                lines.append(f"| `{p['name']}` | {cell(_schema_type(s))} | {'yes' if p.get('required') else ''} | "
                             f"{default} |")
            lines.append("")
        body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        if body:
            lines += ["Request body (JSON):", ""] + _fields_table(body, schemas)
    for name in sorted(schemas):  # nested objects the bodies refer to (chat messages)
        if name.endswith("Request") or "ValidationError" in name:
            continue
        lines += [f"## {name}", ""] + _fields_table(schemas[name], schemas)
    return "\n".join(lines) + "\n"


GENERATORS = {"reference/cli.md": cli_page, "reference/config.md": config_page,
              "reference/families.md": families_page, "reference/http-api.md": http_page}


def on_files(files, config, **kwargs):
    for uri, make in GENERATORS.items():
        if files.get_file_from_path(uri) is not None:  # a stray hand-written copy would hide the generated page
            raise ValueError(f"docs/{uri} is generated at build time by docs/hooks.py; delete the file")
        files.append(File.generated(config, uri, content=make()))
    return files
