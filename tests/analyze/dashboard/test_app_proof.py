"""The dashboard says what a verdict stands on (issue 36): a verdict only a sentence shows opens with it, and a
GitHub thread names the comment its evidence came from."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvtrace.analyze.dashboard.launch import OPEN_ENV
from kvtrace.analyze.reader.proof import PROSE_HEADLINE
from tests.analyze.reader.test_thread import gh_json, report

APP = str(Path(__file__).resolve().parents[3] / "app.py")


@pytest.fixture(autouse=True)
def _no_open_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OPEN_ENV, raising=False)


def _opened(name: str, data: bytes) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.sidebar.file_uploader[0].set_value([(name, data, "text/plain")])
    at.run()
    assert not at.exception
    return at


def test_a_prose_verdict_opens_the_page_with_it() -> None:
    at = _opened("report.txt", b"The model crashes after a few requests.\n")
    assert at.subheader[0].value == PROSE_HEADLINE
    assert not any("side" in m.value for m in at.metric if m.value not in ("unknown", "none"))


def test_a_thread_names_the_comment_its_evidence_came_from() -> None:
    thread = gh_json("DFlash stops drafting after a few turns.",
                     [("helper", "Which build?"), ("reporter", report("01_beellama-27-dflash-drafter-consecutive.log"))])
    at = _opened("thread.json", thread)
    captions = [c.value for c in at.caption]
    assert any("the evidence is from comment 2 by @reporter" in c for c in captions), captions
