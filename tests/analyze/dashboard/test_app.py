"""The dashboard through Streamlit's own test runner (AppTest): real app.py, real reader, no browser.

Charts are read back from the Plotly JSON Streamlit would send to the browser.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from kvtrace import analyze
from kvtrace.analyze.dashboard.launch import OPEN_ENV

ROOT = Path(__file__).resolve().parents[3]
APP = str(ROOT / "app.py")
SEED = ROOT / "tests" / "fixtures" / "corpus" / "00_beellama-28-multigpu-dflash-seed.log"
STALE = ROOT / "samples" / "stale-drafter"
CORPUS_LABELS = json.loads((ROOT / "tests" / "fixtures" / "corpus" / "labels.json").read_text(encoding="utf-8"))


@pytest.fixture(autouse=True)
def _no_open_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OPEN_ENV, raising=False)


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception
    return at


def _upload(at: AppTest, *files: tuple[str, bytes]) -> AppTest:
    at.sidebar.file_uploader[0].set_value([(name, data, "text/plain") for name, data in files])
    at.run()
    return at


def _array(value: Any) -> np.ndarray:
    """A Plotly array from figure JSON: a list, or numpy's binary form {dtype, bdata}."""
    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
    return np.array([np.nan if v is None else v for v in (value or [])], dtype=float)


def _traces(at: AppTest, index: int = 0) -> dict[str, dict[str, np.ndarray]]:
    spec = json.loads(at.get("plotly_chart")[index].proto.spec)
    return {d["name"]: {"x": _array(d.get("x")), "y": _array(d.get("y"))} for d in spec["data"] if "name" in d}


def _segments(trace: dict[str, np.ndarray]) -> set[tuple[float, float]]:
    """(X, Y) pairs of a segment trace laid out as x, x, NaN / y0, y1, NaN."""
    y = trace["y"]
    return {(float(y[i]), float(y[i + 1])) for i in range(0, y.size - 1, 3)}


def _texts(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [s.value for s in at.subheader] + [w.value for w in at.warning]
    parts += [e.value for e in at.error] + [i.value for i in at.info]
    return "\n".join(parts)


def test_seed_report_upload_shows_verdict_and_error_segment() -> None:
    at = _upload(_app(), (SEED.name, SEED.read_bytes()))
    assert not at.exception
    text = _texts(at)
    assert "Verdict: inconsistent positions" in text
    assert "X = 259" in text and "Y = 1361" in text
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Failing side"] == "drafter"
    assert metrics["Position errors"] == "3"
    traces = _traces(at)
    assert {"target", "drafter"} <= set(traces)
    # The error is drawn from what the drafter stored (X) to where the batch started (Y).
    assert (259.0, 1361.0) in _segments(traces["position error (X to Y)"])
    assert (259.0, 1362.0) in _segments(traces["position error (X to Y)"])
    # The block whose X line fell outside the paste is still marked, at its Y.
    assert 1360.0 in traces["position error, X cut off"]["y"]
    # The drafter's stored position at the error is X, at the error's own line.
    assert 259.0 in traces["drafter"]["y"]


def test_engine_session_matches_its_ground_truth() -> None:
    at = _app()
    at.sidebar.selectbox(key="session").set_value("sample: stale-drafter")
    at.run()
    assert not at.exception
    assert "Verdict: inconsistent positions" in _texts(at)
    traces = _traces(at)
    assert traces["target"]["y"].size > 5 and traces["drafter"]["y"].size > 5
    truth = pd.read_parquet(STALE / "ground_truth.parquet")
    failed = truth[truth["ret"] != 0]
    assert len(failed), "the stale-drafter sample must hold failing decodes"
    # Every failed drafter decode: X = the drafter's stored max (from the API), Y = the batch's first position.
    want = {(float(r.drafter_kv_max), float(r.pos_min)) for r in failed.itertuples()}
    assert _segments(traces["position error (X to Y)"]) == want
    # Divergence is shaded (the drafter stayed behind over several observations) and resets are drawn.
    assert any(name.startswith("drafter and target apart") for name in traces)
    assert "reset" in traces
    # Second chart: drafter minus target, and an acceptance chart.
    assert len(at.get("plotly_chart")) >= 3


def test_healthy_sample_is_not_shaded_as_divergence() -> None:
    at = _app()
    at.sidebar.selectbox(key="session").set_value("sample: healthy")
    at.run()
    assert not at.exception
    assert "Healthy" in _texts(at)
    traces = _traces(at)
    assert not any(name.startswith("drafter and target apart") for name in traces)
    assert "position error (X to Y)" not in traces


def test_not_a_log_gives_a_clear_message() -> None:
    prose = b"Dear diary,\nToday I baked bread. Nothing about language models here.\n" * 20
    at = _upload(_app(), ("notes.txt", prose))
    assert not at.exception
    assert any("no llama.cpp log lines" in w.value for w in at.warning)
    assert not at.get("plotly_chart")


def test_binary_and_broken_gzip_give_messages_not_tracebacks() -> None:
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40
    broken = gzip.compress(SEED.read_bytes())[:300]
    at = _upload(_app(), ("picture.log", png), ("cut.gz", broken))
    assert not at.exception
    assert at.sidebar.selectbox(key="show").options == ["picture.log", "cut.gz"]
    for choice in (0, 1):
        at.sidebar.selectbox(key="show").set_value(choice)
        at.run()
        assert not at.exception
        warnings = [w.value for w in at.warning]
        if choice == 0:  # picture.log: no log line in it, so a message and no chart
            assert any("picture.log: no llama.cpp log lines" in w for w in warnings), warnings
            assert not at.get("plotly_chart")
        else:  # cut.gz: what was there is read and judged, and the page says the file ends early
            assert any("cut.gz: compressed data ends early" in w for w in warnings), warnings
            assert _headlines(at) == [_headline(analyze.parse(broken, name="cut.gz"))]


def test_log_text_is_never_rendered_as_markdown_or_html() -> None:
    hostile = (
        "<script>alert(1)</script> **bold** [link](http://example.invalid) $x^2$\n"
        + SEED.read_text(encoding="utf-8")
    ).encode()
    at = _upload(_app(), ("hostile.log", hostile))
    assert not at.exception
    rendered = "\n".join(m.value for m in at.markdown)
    assert "<script>" not in rendered and "**bold**" not in rendered and "](http" not in rendered
    # The raw view shows it as plain text, line numbered, around the chosen line.
    at.number_input(key=next(k for k in _keys(at) if k.startswith("line-"))).set_value(1)
    at.run()
    raw = "\n".join(c.value for c in at.code)
    assert "<script>alert(1)</script> **bold**" in raw
    assert re.search(r"^>> +1 \| <script>", raw, re.M), "line 1 is marked as the chosen one"


def _keys(at: AppTest) -> list[str]:
    return [w.key for w in at.number_input if w.key]


def test_pasted_text_and_markdown_report() -> None:
    at = _app()
    at.sidebar.text_area(key="paste").set_value(SEED.read_text(encoding="utf-8"))
    at.run()
    assert not at.exception
    assert "Verdict: inconsistent positions" in _texts(at)
    report = next(c.value for c in at.code if c.value.startswith("### kvtrace triage"))
    assert "X = 259" in report and "Y = 1361" in report
    assert "dflash: drafter decode failed with -1" in report


def test_open_from_the_command_line_and_compare(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPEN_ENV, str(STALE))
    at = _app()
    assert "Verdict: inconsistent positions" in _texts(at)
    at.sidebar.selectbox(key="session").set_value("sample: healthy")
    at.run()
    assert "Healthy" in _texts(at)  # the sample picked is the one shown
    at.sidebar.selectbox(key="compare-with").set_value(0)  # the path opened from the command line
    at.run()
    assert not at.exception
    names = {d.get("name") for d in json.loads(at.get("plotly_chart")[-1].proto.spec)["data"]}
    assert {"target (A)", "drafter (A)", "target (B)", "drafter (B)"} <= names


def test_missing_command_line_path_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(OPEN_ENV, str(tmp_path / "nope.log"))
    at = _app()
    assert any("no such log file" in e.value for e in at.error)


def test_jump_to_first_divergence_narrows_the_range() -> None:
    at = _app()
    at.sidebar.selectbox(key="session").set_value("sample: stale-drafter")
    at.run()
    slider = next(s for s in at.slider if s.key and s.key.startswith("range-"))
    full = slider.value
    at.button(key=next(b.key for b in at.button if b.key and b.key.startswith("jump-"))).click()
    at.run()
    assert not at.exception
    slider = next(s for s in at.slider if s.key and s.key.startswith("range-"))
    lo, hi = slider.value
    assert full[0] <= lo < hi <= full[1] and (hi - lo) < (full[1] - full[0])
    # The first error (line 1205's timestamp) is inside the new range.
    x = _traces(at)["position error (X to Y)"]["x"]
    assert np.nanmin(x) >= lo and np.nanmin(x) <= hi


def test_capture_time_axis_for_a_log_without_timestamps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log with no timestamps, captured by `kvtrace capture run`: x is when each line arrived."""
    raw = (ROOT / "samples" / "no-rollback" / "raw.log").read_bytes()
    first, rest = tmp_path / "first.log", tmp_path / "rest.log"
    cut = raw.index(b"\n", len(raw) // 2) + 1
    first.write_bytes(raw[:cut])
    rest.write_bytes(raw[cut:])
    session = tmp_path / "session"
    # The program prints half the log, pauses, then the rest: two chunks about a second apart.
    cmd = [sys.executable, "-m", "kvtrace.analyze", "capture", "run", "--quiet", "--out", str(session), "--",
           "sh", "-c", f"cat '{first}'; sleep 1; cat '{rest}'"]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=120)
    assert (session / "chunks.parquet").is_file()
    monkeypatch.setenv(OPEN_ENV, str(session))
    at = _app()
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert spec["layout"]["xaxis"]["title"]["text"] == "capture time (s)"
    x = np.concatenate([_array(d.get("x")) for d in spec["data"] if d.get("name") in ("target", "drafter")])
    x = x[~np.isnan(x)]
    # Lines of the first half arrived at once (x = 0), the second half after the pause.
    assert x.min() == 0.0 and 0.8 <= x.max() <= 30


def test_same_bytes_are_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reruns (any widget change) and the same bytes under another name reuse the cached parse."""
    from kvtrace import analyze

    calls: list[int] = []
    real = analyze.parse

    def counting(source: Any, **kw: Any) -> Any:
        calls.append(1)
        return real(source, **kw)

    monkeypatch.setattr(analyze, "parse", counting)
    # Bytes no other test uploaded (the cache lives as long as the process).
    data = SEED.read_bytes() + f"\nunique {id(calls)} {np.random.default_rng().integers(1 << 62)}\n".encode()
    at = _upload(_app(), ("a.log", data))
    assert len(calls) == 1
    at.number_input(key=next(k for k in _keys(at) if k.startswith("tol-"))).set_value(7.0)
    at.run()
    _upload(at, ("a.log", data), ("same-bytes-other-name.txt", data))
    assert not at.exception
    assert len(calls) == 1


def test_upload_limit_names_the_command_line_way_in() -> None:
    at = _app()
    captions = "\n".join(c.value for c in at.sidebar.caption)
    assert "kvtrace dashboard PATH" in captions and "MB" in captions


def test_table_filters_narrow_the_rows() -> None:
    at = _app()
    at.sidebar.selectbox(key="session").set_value("sample: stale-drafter")
    at.run()
    assert not any(m.key and m.key.endswith("-events-kind") for m in at.multiselect)  # only the open tab is drawn
    tabs = "tabs-" + next(k for k in _keys(at) if k.startswith("line-"))[len("line-"):]
    at.session_state[tabs] = next(t.label for t in at.tabs if t.label.startswith("Events"))
    at.run()
    key = next(m.key for m in at.multiselect if m.key and m.key.endswith("-events-kind"))
    before = next(len(d.value) for d in at.dataframe if "detail" in d.value.columns)
    at.multiselect(key=key).set_value(["reset"])
    at.run()
    after = next(d.value for d in at.dataframe if "detail" in d.value.columns)
    assert 0 < len(after) < before and set(after["kind"]) == {"reset"}


HEADLINES = ("Healthy", "No failure found")


def _headline(result: analyze.ParseResult) -> str:
    """The page's headline for a parse, as the page promises it: a log with no failure reads as healthy (with
    draft statistics) or as no failure found, anything else as its verdict's kind."""
    if not len(result.errors) and result.verdict.kind == "draft_stats_only":
        return "Healthy"
    if not len(result.errors) and result.verdict.kind == "other":
        return "No failure found"
    return f"Verdict: {result.verdict.kind.replace('_', ' ')}"


def _headlines(at: AppTest) -> list[str]:
    return [s.value for s in at.subheader if s.value in HEADLINES or s.value.startswith("Verdict: ")]


@pytest.mark.parametrize("report", sorted((ROOT / "tests" / "fixtures" / "corpus").glob("*.log")), ids=lambda p: p.stem[:24])
def test_every_corpus_report_opens_cleanly(report: Path) -> None:
    at = _upload(_app(), (report.name, report.read_bytes()))
    assert not at.exception, report.name
    # every labelled report holds llama.cpp lines: the page opens on the headline of its labelled kind, no warning
    result = analyze.parse(report)
    assert result.verdict.kind == CORPUS_LABELS[report.name]["expected"]["error_kind"]
    assert _headlines(at) == [_headline(result)]
    assert [w.value for w in at.warning] == []


def test_a_log_without_positions_says_how_to_get_them() -> None:
    report = ROOT / "tests" / "fixtures" / "corpus" / "16_club3090-1106-deepseek-draft-acceptance-OK.log"
    at = _upload(_app(), (report.name, report.read_bytes()))
    assert not at.exception
    assert "Healthy" in _texts(at)
    assert any("no KV positions to draw" in i.value and "LLAMA_BATCH_DEBUG=1" in i.value for i in at.info)
    assert not any(s.key and s.key.startswith("range-") for s in at.slider)


def test_follow_a_capture_while_it_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--follow: each page run reads only what was added; counters grow, the first position error shows as
    soon as it is written, a zoom stays, and once the manifest says the capture ended it is a finished log."""
    from kvtrace.analyze.dashboard.launch import FOLLOW_ENV

    session = tmp_path / "live"
    session.mkdir()
    (session / "manifest.json").write_text(json.dumps({"kind": "engine", "kvtrace_pid": 1}))  # no host: not judged
    monkeypatch.setenv(OPEN_ENV, str(session))
    monkeypatch.setenv(FOLLOW_ENV, "1")
    at = _app()  # no raw.log yet: a notice, no error
    assert any("waiting for the capture to write raw.log" in i.value for i in at.info)
    raw = (STALE / "raw.log").read_bytes()
    lines = raw.splitlines(keepends=True)
    first_error = int(analyze.parse(raw).errors["line"].iloc[0])
    log = session / "raw.log"
    batches = []
    for cut in (first_error - 200, first_error + 2, len(lines) * 3 // 4):
        log.write_bytes(b"".join(lines[:cut]))
        time.sleep(1.0)  # the page rebuilds the tables at most about once a second
        at.run()
        assert not at.exception
        metrics = {m.label: m.value for m in at.metric}
        batches.append(int(metrics["Batches"].replace(",", "")))
        if len(batches) == 1:
            assert metrics["Position errors"] == "0"
            before = next(s for s in at.slider if s.key and s.key.startswith("range-")).value
        if len(batches) == 2:
            assert metrics["Position errors"] != "0"
            assert any(f"Position error logged at line {first_error}" in e.value for e in at.error)
            slider = next(s for s in at.slider if s.key and s.key.startswith("range-"))
            assert slider.value[0] == before[0] and slider.value[1] > before[1]  # not zoomed: it grew with the log
            zoom = (slider.value[0], (slider.value[0] + slider.value[1]) / 2)
            slider.set_value(zoom)
            at.run()
    slider = next(s for s in at.slider if s.key and s.key.startswith("range-"))
    assert tuple(slider.value) == zoom  # zoomed: the range stayed
    assert batches == sorted(batches) and batches[0] < batches[-1]
    assert "Raw log" not in [s.value for s in at.subheader]
    log.write_bytes(raw)
    (session / "manifest.json").write_text(json.dumps({"kind": "engine", "ended": "now", "outcome": {"status": "ok"}}))
    at.run()
    assert not at.exception
    assert any("The capture has ended" in s.value for s in at.success)
    metrics = {m.label: m.value for m in at.metric}
    assert int(metrics["Batches"].replace(",", "")) > batches[-1]
    assert "Raw log" in [s.value for s in at.subheader]
    assert tuple(next(s for s in at.slider if s.key and s.key.startswith("range-")).value) == zoom


def test_the_page_gives_the_reports_next_steps_and_counts_it_the_same_way() -> None:
    """One source of advice (the report's filled next steps) and one count of batches, headline and tab alike;
    with one log open there is no empty Compare-with box, only a line saying how to get one."""
    from kvtrace import analyze
    from kvtrace.analyze.views.report import what_to_do

    at = _app()
    at.sidebar.selectbox(key="session").set_value("sample: stale-drafter")
    at.run()
    assert not at.exception
    result = analyze.parse(STALE)
    explanation, steps = what_to_do(result)
    shown = "\n".join(m.value for m in at.markdown)
    assert steps and all(step in shown for step in steps), (steps, shown[-800:])
    assert explanation in shown
    metrics = {m.label: m.value for m in at.metric}
    n_batches = int(result.batches["batch"].nunique())
    assert metrics["Batches"] == f"{n_batches:,}"
    assert any(t.label.startswith(f"Batches ({n_batches:,} batches, {len(result.batches):,} rows)") for t in at.tabs)
    assert "For the whole log" in " ".join(c.value for c in at.caption)
    assert not [s for s in at.sidebar.selectbox if s.key == "compare-with"]
    assert any("To compare, open a second log" in c.value for c in at.sidebar.caption)


def test_a_browsers_first_open_draws_the_chart_alone_then_the_whole_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opened from the command line in a browser, the first run sends the title and the position chart and no
    other kind of element; the run the browser's timer asks for (a plain rerun here: AppTest has no timer)
    draws the whole page around the same chart, at the same place."""
    from kvtrace.analyze.dashboard import page

    monkeypatch.setenv(OPEN_ENV, str(STALE))
    monkeypatch.setattr(page, "_in_a_browser", lambda: True)
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception
    assert len(at.get("plotly_chart")) == 1 and len(at.title) == 1
    assert not at.metric and not at.selectbox and not at.slider and not at.get("dataframe") and not at.code
    assert not at.sidebar.selectbox and not at.sidebar.file_uploader and not at.sidebar.text_area
    first = at.get("plotly_chart")[0]
    assert "Verdict: inconsistent positions" not in _texts(at)
    at.run()
    assert not at.exception
    assert "Verdict: inconsistent positions" in _texts(at)
    assert at.metric and at.sidebar.selectbox(key="session") and at.get("dataframe")
    chart = at.get("plotly_chart")[0]
    assert chart.proto.spec == first.proto.spec and chart.proto.id == first.proto.id


def test_a_browsers_first_open_of_a_missing_path_gives_the_widgets(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    from kvtrace.analyze.dashboard import page

    monkeypatch.setenv(OPEN_ENV, str(tmp_path / "nope.log"))
    monkeypatch.setattr(page, "_in_a_browser", lambda: True)
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception
    assert any("no such log file" in e.value for e in at.error)
    assert at.sidebar.file_uploader and at.sidebar.selectbox(key="session")
    assert not at.get("plotly_chart")  # the chart's frame drawn before the path was looked at is gone
