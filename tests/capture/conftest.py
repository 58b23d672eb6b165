"""Fixtures for the capture tests."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture
def py() -> str:
    """The Python that runs the small child programs the tests write."""
    return sys.executable
