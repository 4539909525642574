"""The attention page in a real browser: Debian's chromium driven headless by Playwright (which never
downloads a browser of its own here). The page must load from a file with no console errors and no
network request, and every control must change what is drawn.

Screenshots go to test-artifacts/ (git-ignored). `make test` installs chromium first
(scripts/ensure-chromium.sh); these tests skip, saying why, only where no browser can be installed.
"""
from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.viz.attention import AttentionData, extract
from attnlab.viz.page import render_page, write_page

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
TEXT, TEXT_B = "The cat sat on the mat.", "It was happy."



class Page:
    """A loaded page plus everything it said on the console and every request it made."""

    def __init__(self, browser, path: Path) -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("body[data-ready='1']")

    def pixels(self, selector: str):
        """The element as drawn on screen, as an (H, W, 3) array."""
        from PIL import Image
        import numpy as np
        png = self.page.locator(selector).screenshot()
        return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)

    def check_clean(self) -> None:
        assert self.errors == [], self.errors
        assert all(u.startswith(("file://", "data:", "about:")) for u in self.requests), self.requests

    def close(self) -> None:
        self.page.close()


def differ(a, b, min_pixels: int = 50) -> bool:
    if a.shape != b.shape:
        return True
    return int((abs(a - b).sum(-1) > 30).sum()) >= min_pixels


@pytest.fixture(scope="module")
def pair_page(minilm, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("viz") / "pair.html"
    assert main(["viz", str(minilm), "--text", TEXT, "--text-b", TEXT_B, "--output", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def causal_page(tmp_path_factory):
    torch.manual_seed(0)
    model = attnlab.Encoder(attnlab.preset("bert-tiny", vocab_size=100, causal=True)).eval()
    data = extract(model, torch.arange(1, 13)[None], [f"w{i}" for i in range(12)], title="tiny decoder")
    return write_page(tmp_path_factory.mktemp("viz") / "causal.html", render_page(data, view="model")), data


def test_head_view_controls_change_the_drawing(browser, pair_page):
    pg = Page(browser, pair_page)
    p = pg.page
    assert p.title().endswith("· attnlab")
    assert p.locator("#left .tok").count() == 14 and p.locator("#right-9").inner_text() == "it"
    start = pg.pixels("#lines")
    assert (start < 250).any(), "no lines drawn"
    p.select_option("#layer", "3")
    layer3 = pg.pixels("#lines")
    assert differ(start, layer3), "changing the layer did not change the drawing"
    p.select_option("#head", "5")
    head5 = pg.pixels("#lines")
    assert differ(layer3, head5), "choosing one head did not change the drawing"
    p.hover("#left-2")  # "cat": only its lines remain, and the tokens it attends to are shaded
    hovered = pg.pixels("#lines")
    assert differ(head5, hovered), "hovering a token did not change the drawing"
    assert p.locator("#right-0").evaluate("e => getComputedStyle(e).backgroundColor") != "rgba(0, 0, 0, 0)"
    ARTIFACTS.mkdir(exist_ok=True)
    p.screenshot(path=str(ARTIFACTS / "viz-head-view.png"), full_page=True)
    p.mouse.move(1200, 850)
    p.select_option("#filter", "AB")  # sentence A attending to sentence B only
    assert differ(pg.pixels("#lines"), head5), "the sentence filter did not change the drawing"
    assert "dim" in p.locator("#right-1").get_attribute("class")  # "the" is in A: not a key of A → B
    pg.check_clean()
    pg.close()


def test_model_view_grid_and_click_opens_head(browser, pair_page):
    pg = Page(browser, pair_page)
    p = pg.page
    p.click("button[data-view=model]")
    assert p.locator("#grid canvas").count() == 6 * 12
    assert p.locator("#head-view").is_hidden()
    p.screenshot(path=str(ARTIFACTS / "viz-model-view.png"), full_page=True)
    p.click("#map-4-7")
    assert p.locator("#head-view").is_visible()
    assert p.input_value("#layer") == "4" and p.input_value("#head") == "7"
    pg.check_clean()
    pg.close()


def test_neuron_view_shows_the_models_softmax(browser, pair_page, minilm):
    model, tok = attnlab.load(minilm), attnlab.load_tokenizer(minilm)
    with torch.no_grad():
        ref = model(**tok(TEXT, TEXT_B, return_tensors="pt"), output_attentions=True).attentions
    pg = Page(browser, pair_page)
    p = pg.page
    p.click("button[data-view=neuron]")
    p.select_option("#layer", "2")
    p.select_option("#head", "3")
    p.select_option("#token", "2")
    soft = [float(v) for v in p.locator("td.softmax").evaluate_all("els => els.map(e => e.dataset.value)")]
    assert len(soft) == 14 and sum(soft) == pytest.approx(1, abs=1e-6)
    # computed in the browser from the page's q and k: equal to what the model returned
    assert torch.allclose(torch.tensor(soft), ref[2][0, 3, 2], atol=2e-3)
    before = p.locator("#neuron").inner_text()
    p.select_option("#token", "5")
    assert p.locator("#neuron").inner_text() != before
    p.screenshot(path=str(ARTIFACTS / "viz-neuron-view.png"), full_page=True)
    pg.check_clean()
    pg.close()


def test_decoder_page_upper_triangle_is_empty(browser, causal_page):
    path, data = causal_page
    pg = Page(browser, path)
    p = pg.page
    assert p.locator("#model-view").is_visible()  # written with view="model"
    assert "causal" in p.locator("#summary").inner_text()
    # the map canvases hold one pixel per (query, key): read them back
    cells = p.evaluate("""() => { const c = document.getElementById('map-1-0');
        return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data); }""")
    t = len(data.tokens)
    rgba = torch.tensor(cells).view(t, t, 4)
    upper = torch.ones(t, t, dtype=torch.bool).triu(1)
    assert (rgba[upper][:, :3] == 255).all(), "a causal map has colour above the diagonal"
    assert (rgba[~upper][:, :3] < 255).any(), "the lower triangle is empty"
    p.screenshot(path=str(ARTIFACTS / "viz-decoder-model-view.png"), full_page=True)
    pg.check_clean()
    pg.close()


def test_cross_attention_page(browser, tmp_path):
    torch.manual_seed(0)
    future = torch.ones(3, 3, dtype=torch.bool).triu(1)
    layers = [torch.rand(2, 3, 3).masked_fill(future, float("-inf")).softmax(-1) for _ in range(2)]
    cross = [torch.rand(2, 3, 5).softmax(-1) for _ in range(2)]
    data = AttentionData(tokens=["<s>", "le", "chat"], layers=layers, causal=True, cross=cross,
                         source_tokens=["the", "cat", "sat", "down", "</s>"], title="seq2seq")
    pg = Page(browser, write_page(tmp_path / "cross.html", render_page(data)))
    p = pg.page
    assert p.locator("#kind-label").is_visible()
    self_view = pg.pixels("#lines")
    p.select_option("#kind", "cross")
    assert p.locator("#right .tok").all_inner_texts() == ["the", "cat", "sat", "down", "</s>"]
    assert differ(self_view, pg.pixels("#lines"), min_pixels=10)
    pg.check_clean()
    pg.close()
