"""`make demo`: the five jobs attnlab is for, on the packaged models and the files in examples/data, offline,
in about two minutes.

  1. embed and search      sentence vectors with all-MiniLM-L6-v2, nearest neighbours from an index
  2. fine-tune, predict    a classifier trained on your own CSV file, then labels for new lines
  3. chat and serve        SmolLM2 answers a question; the classifier from step 2 answers over HTTP
  4. see attention         one self-contained HTML page of every layer and head
  5. walk through a layer  a layer's steps with real shapes, parameters and FLOPs

Each step prints the command a user types (from the repository root) before running it, so everything shown
can be copied. The commands run in this one process, so torch loads once; everything is written to out/demo/.
Run it with `make demo`, or `.venv/bin/python examples/demo.py` once `.venv` exists.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = "examples/data"  # paths relative to ROOT, as a user at the repository root would type them
OUT = "out/demo"
DOCS = ["docs/getting-started.md", "docs/guides/embeddings.md", "docs/guides/fine-tuning.md",
        "docs/guides/generation-and-serving.md", "docs/guides/inspection.md", "docs/research/index.md"]


def attnlab(*argv: str) -> None:
    """Print the command as a user would type it, then run it."""
    print(f"\n$ attnlab {shlex.join(argv)}", flush=True)
    execute(list(argv))


def execute(argv: list[str]) -> None:
    """One `attnlab` command in this process; a failing step stops the demo instead of scrolling past."""
    from attnlab.cli import main
    if main(argv) != 0:
        raise SystemExit(f"demo: `attnlab {shlex.join(argv)}` failed")


def show(path: str, limit: int = 5) -> None:
    """The first `limit` lines of a file the demo reads or wrote, as `head` would show them."""
    print(f"\n$ head -n {limit} {path}")
    with open(path, encoding="utf-8") as f:
        for line in list(f)[:limit]:
            print(line.rstrip("\n"))


def embed_and_search() -> None:
    attnlab("embed", "minilm", "--input", f"{DATA}/sentences.txt", "--output", f"{OUT}/sentences.npy")
    attnlab("index", f"{DATA}/sentences.txt", "--model", "minilm", "--output", f"{OUT}/index")
    for query in ("Which animal was chasing something indoors?", "Will it rain this weekend?"):
        attnlab("search", f"{OUT}/index", query, "-k", "3")


def finetune_and_predict() -> None:
    show(f"{DATA}/reviews-train.csv")  # your own file: a header, then text and any label names
    # ~15 s of CPU: 30 steps at a learning rate for so few examples. Scored once, at the end: the 10 validation
    # lines reach 100% within a few steps, and on ties the first (barely trained) checkpoint would be kept
    attnlab("finetune", "text-classification", "--model", "minilm", "--train", f"{DATA}/reviews-train.csv",
            "--valid", f"{DATA}/reviews-valid.csv", "--output", f"{OUT}/reviews", "--epochs", "6", "--lr", "2e-4",
            "--batch-size", "8", "--eval-every", "30")
    attnlab("predict", "text-classification", "--model", f"{OUT}/reviews", "--input", f"{DATA}/reviews-new.txt",
            "--output", f"{OUT}/predictions.txt")
    side_by_side(f"{OUT}/predictions.txt", f"{DATA}/reviews-new.txt")


def side_by_side(labels: str, texts: str) -> None:
    """Each predicted label beside the line it labels."""
    with open(labels, encoding="utf-8") as left, open(texts, encoding="utf-8") as right:
        for label, text in zip(left, right):
            print(f"  {label.strip():10} {text.strip()}")


def chat_and_serve() -> None:
    attnlab("generate", "smollm2", "--chat", "--prompt", "What is the capital of France?", "--max-new-tokens", "24")
    with socket.socket() as s:  # a free loopback port, so a second demo or another server never collides
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve(["serve", f"{OUT}/reviews", "--port", str(port)], port, "/v1/classify",
          {"input": ["I would watch it again tomorrow.", "Never again, what a letdown."]})


def serve(argv: list[str], port: int, path: str, body: dict) -> None:
    """`attnlab serve` in the background, one request as curl would send it, then stopped as Ctrl-C would."""
    print(f"\n$ attnlab {shlex.join(argv)}", flush=True)
    log = Path(OUT) / "serve.log"  # the server's own lines, kept out of the tour's output
    with open(log, "w", encoding="utf-8") as sink:
        server = subprocess.Popen([sys.executable, "-m", "attnlab", *argv], stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    print(f"(running in the background, its log in {log}; in a second terminal:)", flush=True)
    try:
        wait_until_up(server, url, log)
        data = json.dumps(body)
        print(f"$ curl -s {url}{path} -H 'Content-Type: application/json' -d {shlex.quote(data)}", flush=True)
        request = urllib.request.Request(url + path, data.encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
        for item in answer["data"]:  # the full answer also carries every label's score and the token usage
            print(f"  {body['input'][item['index']]!r} -> {item['label']} (score {item['score']:.2f})")
    finally:
        server.terminate()  # SIGTERM: requests in flight finish, then the port closes
        server.wait(30)


def wait_until_up(server: subprocess.Popen, url: str, log: Path, seconds: float = 120) -> None:
    """Poll GET /health until the server answers; a server that exits first stops the demo with its error."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return
        except OSError:
            if server.poll() is not None:
                raise SystemExit(f"demo: attnlab serve exited early:\n{log.read_text(encoding='utf-8')[-2000:]}")
            time.sleep(0.2)
    raise SystemExit(f"demo: attnlab serve did not answer {url}/health within {seconds:.0f}s")


def see_attention() -> None:
    attnlab("viz", "minilm", "--text", "The cat sat on the mat.", "--text-b", "It was happy.",
            "--output", f"{OUT}/attention.html")
    print("(the page opens on the head view; the model and neuron views are one click away, and it works offline)")
    # the same views, live: the explorer re-runs the model as you type; here one picture of it, taken headless
    print("\nto type your own text and see every number behind a head: attnlab explore minilm  "
          "(prints http://127.0.0.1:8765/ to open)", flush=True)
    explore_picture(f"{OUT}/explore.png")


def explore_picture(path: str) -> None:
    """One screenshot of `attnlab explore minilm` (its head view) when chromium and playwright are here."""
    from attnlab.explore.screenshot import screenshot, unavailable
    reason = unavailable()
    if reason:
        print(f"(no picture of the explorer: {reason})")
        return
    screenshot("minilm", "The cat sat on the mat because it was tired.", path, view="head")
    print(f"(a picture of its head view: {path})")


def walk_through_a_layer() -> None:
    attnlab("info", "minilm", "--explain")


STEPS = [
    ("embed and search: sentence vectors with all-MiniLM-L6-v2, nearest neighbours from an index", embed_and_search),
    ("fine-tune on your own file, then predict: a classifier on MiniLM from 40 labeled lines", finetune_and_predict),
    ("chat and serve: SmolLM2-135M-Instruct answers; the step-2 classifier answers over HTTP", chat_and_serve),
    ("see attention: every layer and head of MiniLM on a sentence pair, one HTML page", see_attention),
    ("walk through a layer: MiniLM's encoder layer step by step with shapes, parameters and FLOPs",
     walk_through_a_layer),
]

OUTPUTS = {"sentences.npy": "one 384-number vector per line of sentences.txt",
           "index/": "the search index (vectors + passages)",
           "reviews/": "the fine-tuned classifier (Hugging Face layout: config.json, model.safetensors)",
           "predictions.txt": "its labels for reviews-new.txt",
           "attention.html": "the attention page: open it in any browser",
           "explore.png": "a picture of `attnlab explore minilm` (when chromium is installed)",
           "serve.log": "what the server printed while it ran"}


def main() -> int:
    os.chdir(ROOT)  # the printed commands use paths from the repository root
    Path(OUT).mkdir(parents=True, exist_ok=True)
    print(f"attnlab in {len(STEPS)} steps. Each command is shown as you would type it at the repository root, "
          f"then run; everything is written to {OUT}/.", flush=True)
    start = time.perf_counter()
    for number, (title, step) in enumerate(STEPS, 1):
        began = time.perf_counter()
        print(f"\n{'=' * 100}\n{number}/{len(STEPS)}  {title}\n{'=' * 100}", flush=True)
        step()
        print(f"\n(step {number}: {time.perf_counter() - began:.1f}s)", flush=True)
    print(f"\ndemo finished in {time.perf_counter() - start:.1f}s. Outputs, in {OUT}/:")
    for name, what in OUTPUTS.items():
        print(f"  {name:16} {what}")
    print("Next: " + "\n      ".join(DOCS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
