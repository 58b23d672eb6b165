"""Fixtures shared by every test folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
CORPUS = FIXTURES / "corpus"


def corpus_labels() -> dict[str, dict[str, str]]:
    """The corpus reports' hand-made labels (LABELS.md), keyed by log file name."""
    return {name: entry["expected"] for name, entry in json.loads((CORPUS / "labels.json").read_text()).items()}


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    return CORPUS


@pytest.fixture(scope="session")
def seed_report() -> Path:
    """The report this project exists for (beellama.cpp #28), as pasted, header stripped."""
    return CORPUS / "00_beellama-28-multigpu-dflash-seed.log"
