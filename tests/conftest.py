"""Fixtures shared by every test folder."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kvtrace.capture.llama_server import find_llama_server

# Tests send SIGINT to the commands they start, as a terminal's Ctrl-C would. A run started as a background
# job or under `nohup ... &` has SIGINT ignored, which its children inherit and would keep: run as from a
# terminal instead.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

FIXTURES = Path(__file__).parent / "fixtures"
CORPUS = FIXTURES / "corpus"


def corpus_labels() -> dict[str, dict[str, str]]:
    """The corpus reports' hand-made labels (labels.json's `expected`), keyed by log file name."""
    return {name: entry["expected"] for name, entry in json.loads((CORPUS / "labels.json").read_text()).items()}


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    return CORPUS


@pytest.fixture(scope="session")
def seed_report() -> Path:
    """The report this project exists for (beellama.cpp #28), as pasted, header stripped."""
    return CORPUS / "00_beellama-28-multigpu-dflash-seed.log"


def wait_for_dashboard(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    """Until the dashboard on 127.0.0.1:port answers its health check; fails if `proc` ends first or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        assert proc.poll() is None, "the command ended before its dashboard answered"
        assert time.monotonic() < deadline, f"the dashboard did not answer within {timeout_s:g} s"
        time.sleep(0.3)


@pytest.fixture
def py() -> str:
    """The Python that runs the small child programs the tests write."""
    return sys.executable


@pytest.fixture(scope="session")
def llama_server() -> Path:
    """The real llama-server built from PyPI; missing it fails (the NEEDS_SERVER marks skip first off CI)."""
    path = find_llama_server()
    if path is None:
        pytest.fail("llama-server is not built: `make server` builds it (CI must run it)")
    return path
