"""How quickly `attnlab explore` answers, measured in a real browser (headless chromium via Playwright), with
the app served in this process on one torch thread:

(a) an edit of a 64-token text on MiniLM: from the textarea's input event to the last view redrawn (tokens,
    model view, head view, equation); beside it the server's own compute time for the run;
(b) a decoder step on SmolLM2 (the GGUF, kept quantized): from the click on "Step: greedy" to the next-token
    list and the KV cache redrawn, and the server time of the step;
(c) the page's JS heap after opening a 512-token text on SmolLM2 (30 layers x 9 heads), after a garbage
    collection (CDP Performance.getMetrics, JSHeapUsedSize); the page keeps one head's map at a time.

    .venv/bin/python benchmarks/explore_latency.py [--edits 20] [--steps 20]

Median and p95 over the edits; prints the machine and its load average before and after. Not a test: the
numbers depend on the machine and on what else runs on it.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import table  # noqa: E402

WORDS = ("the quick brown fox jumps over a lazy dog while seven small birds watch from an old oak tree "
         "near the quiet river and the farmer counts his sheep before the evening rain begins to fall on "
         "green hills far away from every busy town in the north of the country where winter comes early").split()


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def text_of(tokenizer, n: int, special: int = 0) -> str:
    """A text that encodes to exactly n tokens (counting `special` added ones), cut from WORDS repeated."""
    words = []
    while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) + special < n:
        words.append(WORDS[len(words) % len(WORDS)])
    while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) + special > n:
        words.pop()
    return " ".join(words)


def open_page(browser, base: str, text: str):
    from attnlab.explore.screenshot import page_url
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(page_url(base, text))
    page.wait_for_selector("body[data-ready='1']", timeout=600_000)
    return page


def edits(browser, base: str, text: str, count: int) -> tuple[list[float], list[float], int]:
    page = open_page(browser, base, text)
    words = text.split()
    browser_ms, server_ms = [], []
    for i in range(count + 1):  # the first edit warms up and is not counted
        words[-1] = WORDS[i % len(WORDS)]  # same length, a different last word: a real re-run
        before = int(page.evaluate("document.body.dataset.renders"))
        page.locator("#text").evaluate("(e, t) => { e.value = t; e.dispatchEvent(new Event('input')); }",
                                       " ".join(words))
        page.wait_for_function("n => Number(document.body.dataset.renders) > n", arg=before, timeout=120_000)
        timing = page.evaluate("explore.state.timing")
        if i:
            browser_ms.append(timing["end"] - timing["start"])
            server_ms.append(timing["serverMs"])
    n = timing["tokens"]
    page.close()
    return browser_ms, server_ms, n


def steps(browser, base: str, text: str, count: int) -> tuple[list[float], list[float]]:
    page = open_page(browser, base, text)
    page.click("#tabs button[data-view=next]")
    browser_ms, server_ms = [], []
    for i in range(count + 1):
        page.click("#step-greedy")
        page.wait_for_function("n => Number(document.body.dataset.steps) === n", arg=i + 1, timeout=120_000)
        timing = page.evaluate("explore.state.stepTiming")
        if i:
            browser_ms.append(timing["end"] - timing["start"])
            server_ms.append(timing["serverMs"])
    page.close()
    return browser_ms, server_ms


def heap(browser, base: str, text: str) -> tuple[float, int, dict]:
    page = open_page(browser, base, text)
    page.click("#thumb-29-8")  # open the last head too: one map of 512 x 512 in memory
    page.wait_for_function("() => document.getElementById('head-title').textContent === 'layer 29, head 8'",
                           timeout=120_000)
    cdp = page.context.new_cdp_session(page)
    cdp.send("HeapProfiler.collectGarbage")
    cdp.send("Performance.enable")
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    n = page.evaluate("explore.state.tokens.length")
    shape = page.evaluate("({layers: explore.state.model.num_layers, heads: explore.state.model.num_heads})")
    page.close()
    return metrics["JSHeapUsedSize"] / 2 ** 20, n, shape


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    torch.set_num_threads(1)
    from playwright.sync_api import sync_playwright

    from attnlab.explore.app import create_app
    from attnlab.explore.screenshot import CHROMIUM_ARGS, chromium_path, running, unavailable
    from attnlab.explore.session import Explorer
    reason = unavailable()
    if reason:
        raise SystemExit(f"explore_latency: {reason}")
    load_before = os.getloadavg()
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        minilm = Explorer.load("minilm")
        with running(create_app(minilm)) as base:
            b, s, n = edits(browser, base, text_of(minilm.tokenizer, 64, special=2), args.edits)
        rows.append([f"(a) edit, MiniLM, {n} tokens", len(b), f"{statistics.median(b):.0f}",
                     f"{percentile(b, 0.95):.0f}", f"{statistics.median(s):.0f}", f"{percentile(s, 0.95):.0f}"])
        smol = Explorer.load("smollm2")
        with running(create_app(smol)) as base:
            b, s = steps(browser, base, "The capital of France is", args.steps)
            rows.append(["(b) decoder step, SmolLM2 GGUF", len(b), f"{statistics.median(b):.0f}",
                         f"{percentile(b, 0.95):.0f}", f"{statistics.median(s):.0f}", f"{percentile(s, 0.95):.0f}"])
            mb, n, shape = heap(browser, base, text_of(smol.tokenizer, 512))
        browser.close()
    load_after = os.getloadavg()
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__} on 1 thread, "
          f"{platform.system()} {platform.release()}")
    print(f"load average (1, 5, 15 min): before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}\n")
    print(table(rows, ["what", "runs", "page median ms", "page p95 ms", "server median ms", "server p95 ms"]))
    print(f"\n(c) JS heap after opening {n} tokens on SmolLM2 ({shape['layers']} layers x {shape['heads']} heads) "
          f"and one head's full map: {mb:.1f} MB used (after a garbage collection; budget 50 MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
