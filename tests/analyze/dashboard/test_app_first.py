"""Uploads and followed logs drawn chart first in a browser, as a path opened on the command line is: the run
that first shows a log sends its position chart and no other kind of element in the main area; the run the
browser's timer asks for (a plain rerun here: AppTest has no timer) draws the whole page around it.

Through Streamlit's AppTest with the page told a browser is on the other end (AppTest sends no headers)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvtrace.analyze.dashboard.launch import FOLLOW_ENV, OPEN_ENV

ROOT = Path(__file__).resolve().parents[3]
APP = str(ROOT / "app.py")
STALE = ROOT / "samples" / "stale-drafter"


@pytest.fixture(autouse=True)
def _in_a_browser(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvtrace.analyze.dashboard import page

    monkeypatch.delenv(OPEN_ENV, raising=False)
    monkeypatch.delenv(FOLLOW_ENV, raising=False)
    monkeypatch.setattr(page, "_in_a_browser", lambda: True)


def _names(at: AppTest, index: int = 0) -> set[str]:
    return {d.get("name") for d in json.loads(at.get("plotly_chart")[index].proto.spec)["data"]}


def _texts(at: AppTest) -> str:
    return "\n".join([m.value for m in at.markdown] + [s.value for s in at.subheader] + [c.value for c in at.caption])


def test_an_upload_is_drawn_chart_first_then_the_whole_page() -> None:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception
    # Nothing open yet: the chart's empty frame, so the browser loads the chart library while the user picks.
    assert len(at.get("plotly_chart")) == 1 and not _names(at) - {None}
    at.sidebar.file_uploader[0].set_value([("raw.log", (STALE / "raw.log").read_bytes(), "text/plain")])
    at.run()
    assert not at.exception
    assert len(at.get("plotly_chart")) == 1 and {"target", "drafter"} <= _names(at)
    assert not at.metric and not at.main.selectbox and not at.slider and not at.get("dataframe") and not at.code
    assert at.sidebar.file_uploader and at.sidebar.selectbox(key="session")  # the upload lives in the sidebar
    first = at.get("plotly_chart")[0]
    assert "Verdict: inconsistent positions" not in _texts(at)
    at.run()
    assert not at.exception
    assert "Verdict: inconsistent positions" in _texts(at)
    assert at.metric and at.get("dataframe") and at.slider
    chart = at.get("plotly_chart")[0]
    assert chart.proto.spec == first.proto.spec and chart.proto.id == first.proto.id  # the same chart, kept
    at.run()  # later runs are whole pages
    assert at.metric and "Verdict: inconsistent positions" in _texts(at)


def _title(at: AppTest) -> str:
    return str((json.loads(at.get("plotly_chart")[0].proto.spec)["layout"].get("title") or {}).get("text") or "")


def _last_x(at: AppTest) -> float:
    """The largest x the chart's target and drafter lines reach (Plotly sends them packed: base64 float64)."""
    import base64

    import numpy as np

    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    xs = [np.frombuffer(base64.b64decode(t["x"]["bdata"]), dtype=t["x"]["dtype"]) if isinstance(t["x"], dict)
          else np.asarray(t["x"], dtype=float) for t in spec["data"] if t.get("name") in ("target", "drafter")]
    return float(max(np.nanmax(x) for x in xs))


def test_a_big_upload_is_drawn_from_its_head_first_labelled_partial_then_whole() -> None:
    import gzip

    from kvtrace import analyze
    from kvtrace.analyze.dashboard import page, preload

    raw = (STALE / "raw.log").read_bytes() * 40  # real engine output, 7 MB: over the head's 4 MB
    assert len(raw) > page.HEAD_BYTES
    data = gzip.compress(raw, mtime=0)
    whole = analyze.parse(data, name="big.log.gz")
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.sidebar.file_uploader[0].set_value([("big.log.gz", data, "application/gzip")])
    at.run()
    assert not at.exception
    # the head's chart alone, labelled as partial (how much of the upload it shows), nothing from a verdict
    assert len(at.get("plotly_chart")) == 1 and {"target", "drafter"} <= _names(at)
    assert _title(at).startswith("Read 4.") and f"of {len(raw) / 1e6:,.1f} MB so far" in _title(at)
    assert not at.metric and not at.get("dataframe") and "Verdict" not in _texts(at)
    head_end = _last_x(at)
    assert any(k.startswith("upload:") for k in preload._jobs)  # noqa: SLF001 - the whole is parsed meanwhile
    at.run()  # the browser's timer: the rest of the page, the whole chart among it, from the whole parse
    assert not at.exception
    assert not _title(at) and _last_x(at) > head_end * 1.3  # the whole log's chart: it reaches further
    errors = [m for m in at.metric if m.label == "Position errors"]
    assert errors and errors[0].value == f"{whole.verdict.n_position_errors:,}"
    assert not any(k.startswith("upload:") for k in preload._jobs)  # noqa: SLF001 - taken, its bytes removed
    # the same bytes opened again (another tab): the parse held already draws the whole chart at once, no child
    again = AppTest.from_file(APP, default_timeout=120)
    again.run()
    again.sidebar.file_uploader[0].set_value([("copy.log.gz", data, "application/gzip")])
    again.run()
    assert not again.exception and not _title(again) and _last_x(again) == _last_x(at)
    assert not any(k.startswith("upload:") for k in preload._jobs)  # noqa: SLF001


def test_a_followed_finished_capture_is_drawn_chart_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPEN_ENV, str(STALE))
    monkeypatch.setenv(FOLLOW_ENV, "1")
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception
    assert len(at.get("plotly_chart")) == 1 and {"target", "drafter"} <= _names(at)
    assert not at.metric and not at.selectbox and not at.slider and not at.get("dataframe") and not at.code
    assert not at.sidebar.file_uploader and not at.sidebar.text_area
    at.run()
    assert not at.exception
    assert "The capture has ended" in "\n".join(s.value for s in at.success)
    assert at.metric and at.get("dataframe") and at.sidebar.file_uploader


def test_a_followed_live_log_is_drawn_chart_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    lines = (STALE / "raw.log").read_bytes().splitlines(keepends=True)
    log = tmp_path / "live.log"  # a plain log still written: it never ends
    log.write_bytes(b"".join(lines[: len(lines) // 2]))
    monkeypatch.setenv(OPEN_ENV, str(log))
    monkeypatch.setenv(FOLLOW_ENV, "1")
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception
    assert len(at.get("plotly_chart")) == 1 and {"target", "drafter"} <= _names(at)
    assert not at.metric and not at.selectbox and not at.get("dataframe")
    at.run()
    assert not at.exception
    assert "while it is written" in _texts(at)  # the live view, with its counters
    assert at.metric and at.sidebar.file_uploader


def test_a_followed_log_with_nothing_yet_gives_the_whole_page(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    session = tmp_path / "session"
    session.mkdir()  # a capture that has not written raw.log yet
    monkeypatch.setenv(OPEN_ENV, str(session))
    monkeypatch.setenv(FOLLOW_ENV, "1")
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception
    assert any("waiting for the capture to write raw.log" in i.value for i in at.info)
    assert not at.get("plotly_chart") and at.sidebar.file_uploader


def test_a_range_chosen_under_follow_stays_as_the_log_grows(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    """The range slider's bounds grow with a followed log (a new slider each time): the range chosen stays, on the
    slider and on the chart (a range dragged across the chart: test_browser_zoom.py)."""
    from kvtrace.analyze.dashboard import page

    monkeypatch.setattr(page, "_in_a_browser", lambda: False)  # the whole page on every run
    monkeypatch.setattr(page, "LIVE_INTERVAL_S", 0.1)
    lines = (STALE / "raw.log").read_bytes().splitlines(keepends=True)
    log = tmp_path / "grows.log"
    log.write_bytes(b"".join(lines[: len(lines) // 2]))
    monkeypatch.setenv(OPEN_ENV, str(log))
    monkeypatch.setenv(FOLLOW_ENV, "1")
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception
    slider = next(s for s in at.slider if s.key and s.key.startswith("range-"))
    lo, hi = slider.min, slider.max
    chosen = (lo + (hi - lo) * 0.25, lo + (hi - lo) * 0.5)
    slider.set_value(chosen)
    at.run()

    def shown() -> tuple[tuple[float, float], list[float]]:
        s = next(s for s in at.slider if s.key and s.key.startswith("range-"))
        spec = json.loads(at.get("plotly_chart")[0].proto.spec)
        return (float(s.value[0]), float(s.value[1])), [float(x) for x in spec["layout"]["xaxis"]["range"]]

    first_value, _ = shown()
    with log.open("ab") as fh:
        fh.write(b"".join(lines[len(lines) // 2:]))
    time.sleep(1.5)  # the follower's next snapshot is due
    at.run()
    assert not at.exception
    grown = next(s for s in at.slider if s.key and s.key.startswith("range-"))
    assert grown.max > hi  # the log grew: a new slider with new bounds
    value, drawn = shown()
    assert value == first_value and drawn == pytest.approx(list(first_value))


def test_the_sequence_chosen_under_follow_stays_as_the_log_grows(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    """A real two-slot llama-server capture followed while it is written: the slot picked stays picked, and
    charted, after the log grows."""
    import gzip

    from kvtrace.analyze.dashboard import page

    monkeypatch.setattr(page, "_in_a_browser", lambda: False)
    monkeypatch.setattr(page, "LIVE_INTERVAL_S", 0.1)
    capture = ROOT / "tests" / "fixtures" / "server" / "b11434-draft-simple-2slots-head.log.gz"
    raw = gzip.decompress(capture.read_bytes())
    cut = raw.index(b"\n", len(raw) // 2) + 1
    log = tmp_path / "two-slots.log"
    log.write_bytes(raw[:cut])
    monkeypatch.setenv(OPEN_ENV, str(log))
    monkeypatch.setenv(FOLLOW_ENV, "1")
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception
    picker = next(s for s in at.selectbox if s.key and s.key.startswith("seq-"))
    other = next(o for o in picker.options if not o.startswith(str(picker.value)))
    picker.set_value(int(other.split()[0]))
    at.run()
    chosen = next(s for s in at.selectbox if s.key and s.key.startswith("seq-")).value
    assert str(chosen) == other.split()[0]
    batches = next(s for s in at.selectbox if s.key and s.key.startswith("seq-")).options
    with log.open("ab") as fh:
        fh.write(raw[cut:])
    time.sleep(1.5)  # the follower's next snapshot is due
    at.run()
    assert not at.exception
    picker = next(s for s in at.selectbox if s.key and s.key.startswith("seq-"))
    assert picker.value == chosen and picker.options != batches  # the same slot, with more batches now
    # the chart is of that slot (its view's revision names the sequence it was drawn for)
    assert json.loads(at.get("plotly_chart")[0].proto.spec)["layout"]["uirevision"].endswith(f"-{chosen}")
