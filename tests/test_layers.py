"""The package's architecture, kept: imports only look down the layers, and nothing imports in a circle.

Every `import` / `from ... import` in attnlab/ counts, at module level or inside a function (a lazy
import is still a dependency). The layer order below is the one place it is written down; see
CONTRIBUTING.md ("Where things live") for what lives in each layer.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "attnlab"

# Bottom to top. A module may import from its own layer or any layer below, never from one above.
# Names are the first component under attnlab/ ("" is attnlab/__init__.py, the public façade).
LAYERS = [
    # what a model is; text -> ids; finding a model and reading a GGUF file (no torch in this layer)
    {"config", "tokenizers", "tokenizer_core", "tokenizer_unigram", "locate", "gguf_file", "gguf_meta",
     "lazy", "atomic"},
    {"nn"},                                        # attention, positions, norms, feed-forward, block
    {"models", "heads"},                           # backbones, and the heads that wrap them
    {"interop"},                                   # every checkpoint format + the family registry
    {"data", "objectives", "training", "inference"},
    {"tasks", "serve", "viz", "explore"},
    {"experiments"},                               # the notes' claims as measurements (use any layer below)
    {"cli", "__main__", ""},                       # the command line and the public façade
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(["attnlab", *parts])] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the attnlab modules it imports (a package's __init__ is the package's own name)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                for alias in node.names:  # `from . import x` names a module when x is one
                    sub = f"{origin}.{alias.name}"
                    targets.add(sub if sub in modules else origin)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def layer_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module}: its package {top!r} is in no layer of LAYERS; add it where it belongs")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each a circle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_sits_in_a_layer():
    for module in _modules():
        layer_of(module)


def test_imports_only_look_down_the_layers():
    upward = [f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
              for a, targets in sorted(import_graph().items()) for b in sorted(targets) if layer_of(b) > layer_of(a)]
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def test_no_module_imports_in_a_circle():
    found = cycles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_two_packages_import_each_other():
    """Coarser than modules: `training` may use `objectives`, but then nothing in `objectives` may use
    `training` (a loader knows nothing of the trainer, a model nothing of file formats)."""
    packages: dict[str, set[str]] = {}
    for a, targets in import_graph().items():
        pa = a.split(".")[1] if "." in a else ""
        packages.setdefault(pa, set()).update(
            pb for b in targets if (pb := b.split(".")[1] if "." in b else "") != pa)
    found = cycles(packages)
    assert not found, "package circles:\n" + "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("source, want", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_the_circle_finder_finds_circles(source, want):
    assert cycles(source) == want


def test_the_graph_sees_function_level_and_relative_imports():
    """The checks above are only as good as the graph: a lazy relative import must show up in it."""
    graph = import_graph()
    assert "attnlab.interop.hf" in graph["attnlab.interop.native"]               # module level, relative
    assert "attnlab.interop.gguf" in graph["attnlab.interop.api"]                # inside a function
    assert "attnlab.interop.bert" in graph["attnlab.interop"]                    # `from . import bert`
