"""The page reads one chart model: positions.py's computations run once per (parse, axis, sequence) on every
kind of run, the overview reads the chart's axis, and one list of panels sets the page's order.

Real app.py through Streamlit's AppTest, real logs (a real llama-server capture with two slots, the bundled
stale-drafter session, a session captured here); positions.py's functions are wrapped to count their calls.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from kvtrace import analyze
from kvtrace.analyze.dashboard import page
from kvtrace.analyze.dashboard.launch import FOLLOW_ENV, OPEN_ENV
from kvtrace.analyze.findings import positions
from kvtrace.analyze.findings.positions import XAxis

ROOT = Path(__file__).resolve().parents[3]
APP = str(ROOT / "app.py")
TWO_SLOTS = ROOT / "tests" / "fixtures" / "server" / "b11434-draft-simple-2slots-head.log.gz"
STALE = ROOT / "samples" / "stale-drafter"
# what positions.py works out from the tables (the private ones are the workers behind its kept results)
COUNTED = ("choose_axis", "sequences", "batches_per_sequence", "opening_sequence", "default_tolerance",
           "first_divergence", "_apart", "_stored_positions")


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OPEN_ENV, raising=False)
    monkeypatch.delenv(FOLLOW_ENV, raising=False)


def _part(value: Any) -> Any:
    """What an argument contributes to a call's key: an axis its kind, a plain value itself."""
    if isinstance(value, XAxis):
        return value.kind
    if value is None or isinstance(value, int | float | str):
        return value
    return type(value).__name__  # the sequences or counts of the same parse: not another computation


def _from_health() -> bool:
    """Whether the health findings (not the page) asked: they are worked out once per parse on their own axis."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__") == "kvtrace.analyze.findings.health":
            return True
        frame = frame.f_back
    return False


class Calls:
    """positions.py's computations as the page asks for them: one key per function, parse, axis kind,
    sequence (and context, tolerance) asked for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.keys: Counter[tuple[Any, ...]] = Counter()
        self.results: list[Any] = []  # kept alive, so no two parses share an id
        for name in COUNTED:
            monkeypatch.setattr(positions, name, self._wrap(name, getattr(positions, name)))

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def counting(*args: Any, **kw: Any) -> Any:
            if _from_health():  # the health findings read positions by log line on purpose: an onset is a line
                return real(*args, **kw)
            self.results.append(args[0])
            self.keys[(name, id(args[0]), *map(_part, args[1:]), *map(_part, kw.values()))] += 1
            return real(*args, **kw)

        return counting

    def repeated(self) -> dict[tuple[Any, ...], int]:
        return {k: n for k, n in self.keys.items() if n > 1}

    def called(self, name: str) -> list[tuple[Any, ...]]:
        return [k for k in self.keys if k[0] == name]

    def axis_kinds(self) -> set[str]:
        return {part for key in self.keys for part in key[2:] if part in ("log_time", "capture_time", "line")}


def _run(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, at.exception
    return at


def test_a_full_page_works_out_each_position_table_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real two-slot capture: the page, another sequence picked, another tolerance typed; on every run each
    computation runs once for its (parse, axis, sequence), the overview's included."""
    calls = Calls(monkeypatch)
    at = _run(AppTest.from_file(APP, default_timeout=120))
    at.sidebar.file_uploader[0].set_value([(TWO_SLOTS.name, TWO_SLOTS.read_bytes(), "application/gzip")])
    _run(at)
    picker = at.selectbox(key=next(s.key for s in at.selectbox if s.key and s.key.startswith("seq-")))
    assert len(picker.options) == 2  # two slots
    assert calls.repeated() == {}
    opened = picker.value
    other = next(i for i in (0, 1) if i != opened)
    first_run = set(calls.keys)
    assert {k[2:] for k in calls.called("_apart")} >= {(opened, "log_time")}
    assert calls.called("first_divergence") and calls.called("choose_axis")
    picker.set_value(other)
    _run(at)
    assert calls.repeated() == {}
    assert any(k[2:] == (other, "log_time") for k in set(calls.keys) - first_run if k[0] == "_apart")
    at.number_input(key=next(w.key for w in at.number_input if w.key and w.key.startswith("tol-"))).set_value(50.0)
    _run(at)
    assert calls.repeated() == {}
    assert calls.axis_kinds() == {"log_time"}


def test_a_first_open_draws_from_the_same_model_and_works_out_only_the_chart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A browser's first open draws the chart alone, asking for nothing the chart does not show (the first
    divergence waits for the verdict); the next run draws the rest, each computation once."""
    calls = Calls(monkeypatch)
    monkeypatch.setenv(OPEN_ENV, str(STALE))
    monkeypatch.setattr(page, "_in_a_browser", lambda: True)
    at = _run(AppTest.from_file(APP, default_timeout=120))
    assert len(at.get("plotly_chart")) == 1
    assert calls.repeated() == {}
    assert calls.called("_apart") and not calls.called("first_divergence")
    _run(at)
    assert "Verdict: inconsistent positions" in "\n".join(s.value for s in at.subheader)
    assert calls.repeated() == {}
    assert calls.called("first_divergence")


def test_the_overview_reads_the_charts_axis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log without timestamps captured here: the chart's x is when each line arrived, and the verdict's
    first divergence is worked out on that axis too (never on log lines beside it)."""
    raw = (ROOT / "samples" / "no-rollback" / "raw.log").read_bytes()
    first, rest = tmp_path / "first.log", tmp_path / "rest.log"
    cut = raw.index(b"\n", len(raw) // 2) + 1
    first.write_bytes(raw[:cut])
    rest.write_bytes(raw[cut:])
    session = tmp_path / "session"
    cmd = [sys.executable, "-m", "kvtrace.analyze", "capture", "run", "--quiet", "--out", str(session), "--",
           "sh", "-c", f"cat '{first}'; sleep 1; cat '{rest}'"]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=120)
    calls = Calls(monkeypatch)
    monkeypatch.setenv(OPEN_ENV, str(session))
    at = _run(AppTest.from_file(APP, default_timeout=120))
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert spec["layout"]["xaxis"]["title"]["text"] == "capture time (s)"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["First divergence"].startswith("line ")
    assert calls.called("first_divergence")
    assert calls.axis_kinds() == {"capture_time"}
    assert calls.repeated() == {}


def test_a_followed_capture_works_out_each_snapshot_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--follow: the live view, the status line and the tables of one snapshot share its model."""
    session = tmp_path / "live"
    session.mkdir()
    (session / "manifest.json").write_text(json.dumps({"kind": "engine", "kvtrace_pid": 1}))
    monkeypatch.setenv(OPEN_ENV, str(session))
    monkeypatch.setenv(FOLLOW_ENV, "1")
    calls = Calls(monkeypatch)
    at = _run(AppTest.from_file(APP, default_timeout=120))
    raw = (STALE / "raw.log").read_bytes()
    lines = raw.splitlines(keepends=True)
    first_error = int(analyze.parse(raw).errors["line"].iloc[0])
    (session / "raw.log").write_bytes(b"".join(lines[: first_error + 2]))
    time.sleep(1.0)  # the follower takes a snapshot at most about once a second
    _run(at)
    assert any(f"Position error logged at line {first_error}" in e.value for e in at.error)
    assert calls.called("_apart") and calls.called("first_divergence")
    _run(at)  # the same snapshot again: its model is kept
    assert calls.repeated() == {}


def _order(at: AppTest) -> list[str]:
    """The page's parts, as they stand: the verdict's headline, the chart, the sections with a title."""
    shown = {"Tables": "tables", "Raw log": "raw log", "Take it away": "downloads"}
    out = []
    for node in _walk(at.main):
        if node.type == "subheader" and node.value.startswith("Verdict"):
            out.append("verdict")
        elif node.type == "subheader" and node.value in shown:
            out.append(shown[node.value])
        elif node.type == "plotly_chart" and not out.count("chart"):
            out.append("chart")
    return out


def _walk(node: Any) -> list[Any]:
    children = getattr(node, "children", None)
    if not children:
        return [node]
    return [leaf for key in sorted(children) for leaf in _walk(children[key])]


@pytest.mark.parametrize("reverse", [False, True])
def test_one_list_of_panels_sets_the_order(reverse: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page stands in PANELS' order, and only there: reversed, the page is reversed."""
    if reverse:
        monkeypatch.setattr(page, "PANELS", tuple(reversed(page.PANELS)))
    at = _run(AppTest.from_file(APP, default_timeout=120))
    at.sidebar.selectbox(key="session").set_value("sample: stale-drafter")
    _run(at)
    order = _order(at)
    expected = [p.name for p in page.PANELS if p.name in ("verdict", "chart", "tables", "raw log", "downloads")]
    assert order == expected, order
