"""The docs site builds with `mkdocs build --strict` (a broken link or a missing page fails it), and the
reference pages generated at build time (docs/hooks.py) cover the whole CLI, every ModelConfig field, every
registered family and every HTTP endpoint."""
from __future__ import annotations

import dataclasses
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MKDOCS_ENV = dict(os.environ, NO_MKDOCS_2_WARNING="1", OMP_NUM_THREADS="1")


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=REPO, env=MKDOCS_ENV, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = mkdocs_build(REPO / "mkdocs.yml", out)
    warnings = [ln for ln in result.stderr.splitlines() if ln.startswith(("WARNING", "ERROR"))]
    shown = warnings or result.stderr.splitlines()[-30:]  # the warnings that failed it, else the traceback
    assert result.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(shown)
    return out


def page_text(site: Path, page: str) -> str:
    """The visible text of a built page (tags dropped, entities decoded)."""
    raw = (site / page / "index.html").read_text(encoding="utf-8")
    return html.unescape(re.sub(r"<[^>]+>", "", raw))


def test_every_nav_page_is_built(site):
    import yaml

    def pages(nav):
        for item in nav:
            if isinstance(item, str):
                yield item
            else:
                for value in item.values():
                    yield from ([value] if isinstance(value, str) else pages(value))

    built = list(pages(yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]))
    assert "reference/cli.md" in built and "index.md" in built
    for md in built:
        target = site / ("" if md == "index.md" else md.removesuffix(".md").removesuffix("/index")) / "index.html"
        assert target.exists(), f"nav page {md} was not built"


def test_cli_reference_covers_every_command_and_option(site):
    from attnlab.cli import build_parser
    import argparse

    text = page_text(site, "reference/cli")
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert len(subs.choices) >= 10
    for name, sub in subs.choices.items():
        assert f"attnlab {name}" in text, f"CLI page has no section for `attnlab {name}`"
        for action in sub._actions:
            for flag in action.option_strings:
                assert flag in text, f"CLI page misses {flag} of `attnlab {name}`"


def test_config_reference_has_one_documented_row_per_field(site):
    from attnlab.config import FIELD_DOCS, ModelConfig

    names = [f.name for f in dataclasses.fields(ModelConfig)]
    assert sorted(FIELD_DOCS) == sorted(names), "attnlab.config.FIELD_DOCS must describe exactly the fields"
    for name, doc in FIELD_DOCS.items():
        assert doc.strip() and "\n" not in doc and len(doc) <= 160, f"FIELD_DOCS[{name!r}]: one short line"
    raw = (site / "reference/config/index.html").read_text(encoding="utf-8")
    rows = re.findall(r"<tr>\s*<td><code>(\w+)</code></td>", raw)
    assert rows == names  # every field, in the dataclass's order, once
    assert "hidden_size" in page_text(site, "reference/config") and "30522" in raw


def test_families_reference_lists_every_family_with_its_classes(site):
    import attnlab.interop  # noqa: F401
    from attnlab.interop.registry import FAMILIES

    text = page_text(site, "reference/families")
    for model_type, family in FAMILIES.items():
        assert model_type in text
        for cls in family.architectures:
            assert cls in text
    assert "≤ 1e-5 (fp32)" in text and "test_bert_parity.py" in text


def test_http_reference_lists_every_endpoint_and_request_field(site):
    from attnlab.serve import schemas

    text = page_text(site, "reference/http-api")
    for path in ("/v1/embeddings", "/v1/classify", "/v1/completions", "/v1/chat/completions", "/health",
                 "/metrics", "/viz"):
        assert path in text
    for model in (schemas.CompletionRequest, schemas.ChatRequest, schemas.EmbeddingRequest):
        for field in model.model_fields:
            assert field in text, f"HTTP page misses {model.__name__}.{field}"


def test_python_reference_renders_the_facade_docstrings(site):
    text = page_text(site, "reference/python")
    for name in ("load", "save", "load_tokenizer", "from_config", "preset", "ModelConfig", "generate", "Trainer"):
        assert re.search(rf"\b{name}\b", text), name
    import attnlab
    first_line = attnlab.load.__doc__.strip().splitlines()[0]
    assert " ".join(first_line.split()[:4]) in " ".join(text.split())


def test_strict_build_fails_on_a_broken_link(tmp_path):
    # the project's settings (strict, link validation), one page with a link to nothing: the build must fail
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the guide](guides/missing.md).\n", encoding="utf-8")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"INHERIT: {REPO / 'mkdocs.yml'}\ndocs_dir: {docs}\nhooks: []\nplugins: [search]\n"
                      "nav:\n  - Home: index.md\n", encoding="utf-8")
    result = mkdocs_build(config, tmp_path / "site")
    assert result.returncode != 0
    assert "guides/missing.md" in result.stderr
