"""One picture of `attnlab explore` without opening anything: the app on a free loopback port, a headless
chromium on the page for a given text, one PNG written, everything stopped again.

    from attnlab.explore.screenshot import screenshot, unavailable
    if unavailable() is None:
        screenshot("minilm", "The cat sat on the mat.", "explore.png", view="head")

Needs the `playwright` package and a chromium binary (Debian's /usr/bin/chromium; playwright never downloads
a browser here). `unavailable()` says which is missing, so a caller can explain why it skipped the picture.
"""
from __future__ import annotations

import contextlib
import shutil
import socket
import threading
import time
import urllib.parse
from pathlib import Path

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWS = ("model", "head", "equation", "next", "fill", "similarity", "cross")


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def unavailable() -> str | None:
    """None when a screenshot can be taken here, else the reason it cannot."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright)"
    if chromium_path() is None:
        return "no chromium binary on PATH (apt-get install chromium)"
    return None


@contextlib.contextmanager
def running(app, host: str = "127.0.0.1"):
    """The app served by uvicorn in a thread on a free port of `host`; yields the base URL."""
    import uvicorn
    sock = socket.socket()
    sock.bind((host, 0))  # port 0: the kernel picks a free one, and we keep the socket so nobody takes it
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the explore app did not start on {host}:{port}")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def page_url(base: str, text: str | None = None, api_key: str | None = None) -> str:
    """The page address; the text and the key ride in the fragment, which the browser never sends."""
    fragment = {}
    if api_key:
        fragment["key"] = api_key
    if text is not None:
        fragment["text"] = text
    return base + "/" + ("#" + urllib.parse.urlencode(fragment, quote_via=urllib.parse.quote) if fragment else "")


def screenshot(model, text: str, output: str | Path, *, view: str = "head", width: int = 1280,
               height: int = 800, timeout: float = 120.0) -> Path:
    """Write a PNG of the page for `text` with `view` open. `model`: a name `attnlab info` takes, a loaded
    Explorer or anything `create_app` accepts."""
    if view not in VIEWS:
        raise ValueError(f"view: {view!r} is not one of {', '.join(VIEWS)}")
    reason = unavailable()
    if reason:
        raise RuntimeError(f"cannot take a screenshot: {reason}")
    from playwright.sync_api import sync_playwright
    from .app import create_app
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with running(create_app(model)) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(page_url(base, text))
            page.wait_for_selector("body[data-ready='1']", timeout=timeout * 1e3)
            tab = page.locator(f"#tabs button[data-view={view}]")
            if tab.is_hidden():
                raise ValueError(f"view: this model has no {view!r} view")
            tab.click()
            page.wait_for_selector("body[data-busy='0']", timeout=timeout * 1e3)
            page.screenshot(path=str(output))
        finally:
            browser.close()
    return output
