"""Fixtures for the capture tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from capture.llama_server import find_llama_server


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
