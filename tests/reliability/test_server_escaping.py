"""The server's /viz page, the one page that echoes its input, opened in a real browser (Debian's chromium via
Playwright, as tests/test_viz_browser.py does) with text that tries to break out of the page: `<script>`,
`</script>`, an `<img onerror>`, an HTML comment opener. Nothing of it runs or becomes an element; the
page is drawn, with the text shown as text. The JSON error answers echo no HTML either (they are
application/json, never text/html).

The page shows tokens, and a byte-level BPE splits `</script>` into `</`, `script`, `>`, which would let an
unescaped page pass by luck; so the model here has a word-level vocabulary in which each attack string is
one token (any vocabulary may hold any string), and the page must carry it whole, as text."""
from __future__ import annotations

import httpx
import pytest
import tokenizers as tk
import torch
from test_serve import Server

import attnlab
from attnlab.config import ModelConfig
from attnlab.serve import Limits, create_app
from attnlab.tokenizers import Tokenizer

ATTACKS = [  # one word each (no spaces): one token of the word-level vocabulary
    '<script>window.__pwned="a"</script>',
    '</script><script>window.__pwned="b"</script><!--',
    '"><img/src=x/onerror=window.__pwned="c">',
]


@pytest.fixture(scope="module")
def viz_server():
    words = ["[PAD]", "[UNK]", "cat", "sat", *ATTACKS]
    backend = tk.Tokenizer(tk.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
    tokenizer = Tokenizer(backend, specials={"pad_token": "[PAD]", "unk_token": "[UNK]"})
    torch.manual_seed(0)
    cfg = ModelConfig(model_type="llama", vocab_size=len(words), hidden_size=16, num_layers=1, num_heads=2,
                      num_kv_heads=2, intermediate_size=32, position="rope", norm="rmsnorm", activation="swiglu",
                      bias=False, causal=True, norm_placement="pre", embedding_norm=False, pooler=False,
                      type_vocab_size=0, pad_token_id=0, dropout=0.0, attention_dropout=0.0,
                      max_position_embeddings=64, tie_word_embeddings=True)
    model = attnlab.from_config(cfg).eval()
    s = Server(create_app(model, tokenizer, name="<b>tiny</b>", limits=Limits(num_blocks=16, block_size=8)))
    yield s
    s.close()


@pytest.mark.parametrize("attack", ATTACKS)
def test_viz_shows_hostile_text_as_text(browser, viz_server, attack):  # browser: tests/conftest.py
    page = browser.new_page()
    errors, requests = [], []
    # chromium asks a server (never a file) for /favicon.ico by itself; that 404 is not the page's doing
    page.on("console", lambda m: errors.append(m.text) if m.type == "error"
            and not m.location.get("url", "").endswith("/favicon.ico") else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    try:
        url = str(httpx.URL(viz_server.url + "/viz", params={"text": f"{attack} cat", "text_b": f"sat {attack}"}))
        response = page.goto(url)
        assert response.status == 200 and response.headers["content-type"].startswith("text/html")
        page.wait_for_selector("body[data-ready='1']")
        assert page.evaluate("window.__pwned") is None  # no injected script ran
        assert page.evaluate("document.querySelectorAll('img').length") == 0  # no injected element exists
        assert page.evaluate("document.scripts.length") == 1  # only the page's own script
        assert errors == [] and requests == [url], (errors, requests)
        shown = page.evaluate("Array.from(document.querySelectorAll('.tok')).map(e => e.textContent).join('')")
        assert shown.count(attack) >= 2, shown  # both texts are there, whole, as text
        assert page.title().startswith("<b>tiny</b>")  # the server's name is text in the title too
    finally:
        page.close()


def test_error_answers_are_json_not_html(viz_server):
    r = httpx.get(viz_server.url + "/viz", params={"text": ATTACKS[0], "layer": 99}, timeout=30)
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    r = httpx.get(viz_server.url + "/" + ATTACKS[0].replace(" ", "%20"), timeout=30)
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"
