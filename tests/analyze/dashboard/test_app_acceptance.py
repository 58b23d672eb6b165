"""The dashboard's acceptance section and its server-counters finding, through Streamlit's AppTest (real app.py,
real reader): session folders written the way a capture writes them (tests/analyze/findings/test_counters.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvtrace.analyze.dashboard.launch import OPEN_ENV
from tests.analyze.findings.test_counters import session, step

ROOT = Path(__file__).resolve().parents[3]
APP = str(ROOT / "app.py")
FOURSLOTS = ROOT / "tests" / "fixtures" / "scenarios" / "draft-simple-4slots.log.gz"


def _open(monkeypatch: pytest.MonkeyPatch, path: Path) -> AppTest:
    monkeypatch.setenv(OPEN_ENV, str(path))
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception
    return at


def _titles(at: AppTest) -> list[str]:
    return [json.loads(c.proto.spec)["layout"].get("title", {}).get("text", "") for c in at.get("plotly_chart")]


def test_a_log_that_disagrees_with_the_servers_counters_is_a_finding(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    folder = session(tmp_path, [step(1, 2), step(2, 0)], [(2.0, 10, 6, 4)])
    at = _open(monkeypatch, folder)
    warnings = [w.value for w in at.warning]
    assert ("**Server counters disagree:** the server's /metrics and the log count different drafts (draft tokens: "
            "log 6, server 10; accepted tokens: log 2, server 6; drafts: log 2, server 4). Either the log is "
            "incomplete (cut short, lines lost, captured late) or it holds an acceptance line kvtrace does not "
            "read.") in warnings, warnings


def test_an_agreeing_log_has_no_finding(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    folder = session(tmp_path, [step(1, 2)], [(2.0, 3, 2, 1)])
    at = _open(monkeypatch, folder)
    assert not any("disagree" in w.value for w in at.warning)
    # the counters are drawn beside the log's steps
    over = next(c for c in at.get("plotly_chart") if "over time" in json.loads(c.proto.spec)["layout"]["title"]["text"])
    names = [d.get("name") for d in json.loads(over.proto.spec)["data"]]
    assert names == ["log (verify steps)", "server counters (/metrics)"]


def test_a_real_capture_shows_acceptance_over_time_per_position_and_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    at = _open(monkeypatch, FOURSLOTS)
    titles = _titles(at)
    assert {"draft acceptance over time", "acceptance per draft position",
            "acceptance per request (8 requests)"} <= set(titles), titles
    assert "Acceptance" in [s.value for s in at.subheader]
    frames = [d.value for d in at.dataframe]
    slots = next(f for f in frames if list(f.columns)[:2] == ["slot", "requests"])
    assert slots["slot"].tolist() == [0, 1, 2, 3] and slots["requests"].tolist() == [2, 2, 2, 2]
    listed = [f for f in frames if "first line" in f.columns]
    assert len(listed) == 2 and all(len(f) == 5 for f in listed)  # the worst and the slowest five
    worst = listed[0]["accepted %"].tolist()
    assert worst == sorted(worst)
