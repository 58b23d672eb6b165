"""The dashboard's page: target and drafter KV positions over time, where they diverge, and a triage to take away.

Streamlit runs a script that calls `main()` on every rerun (`analyze/dashboard/app.py`, or the checkout's
`app.py` for `streamlit run app.py`). Logs come from strangers: log text is only ever shown as plain text
(st.code, st.dataframe, st.json), never as Markdown or HTML.

A browser's first open of the path on the command line draws the title and the position chart first, and
nothing else: every other kind of element (metrics, widgets, tables, code) costs the browser a script to load
and run before it gets to the chart's own. Its timer asks for the rest once the chart is in (`_rest_of_the_page`).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
import streamlit as st

from kvtrace import analyze
from kvtrace.analyze.dashboard import preload
from kvtrace.analyze.dashboard.acceptance import show_acceptance, show_counters_finding
from kvtrace.analyze.dashboard.follow import Follower, LiveState
from kvtrace.analyze.dashboard.launch import FOLLOW_ENV, OPEN_ENV
from kvtrace.analyze.dashboard.rawtext import RawText, capture_seconds, format_excerpt
from kvtrace.analyze.findings.chart import ChartModel, chart_axis, chart_model
from kvtrace.analyze.findings.health import health, restated
from kvtrace.analyze.findings.overview import overview
from kvtrace.analyze.findings.positions import XAxis
from kvtrace.analyze.reader.definitions import SYNTHETIC_NOTE
from kvtrace.analyze.reader.devices import device_rows, layout_line, placement_rows
from kvtrace.analyze.reader.parser import parse_head
from kvtrace.analyze.reader.session import DEFAULT_ROOT, RAW_LOG, is_session, list_sessions, load_chunks, log_named
from kvtrace.analyze.views.bundle import zip_tables
from kvtrace.analyze.views.downsample import DEFAULT_MAX_POINTS
from kvtrace.analyze.views.figures import (
    acceptance_figure,
    compare_figure,
    delta_figure,
    position_figure,
    waiting_figure,
)
from kvtrace.analyze.views.report import escape, headline, markdown_report, what_to_do

if TYPE_CHECKING:
    from streamlit.delta_generator import DeltaGenerator
    from streamlit.runtime.uploaded_file_manager import UploadedFile

    from kvtrace.analyze import ParseResult
    from kvtrace.analyze.reader.records import Meta
    from kvtrace.analyze.reader.verdict import AcceptanceSummary

# the bundled samples sit beside the packages in a checkout (a wheel has none: the picker then lists none)
SAMPLES = Path(__file__).resolve().parents[2] / "samples"
UPLOAD_TYPES = ["log", "txt", "gz", "md", "json"]  # json: a GitHub thread (gh, REST or an event)
TABLE_ROWS_SHOWN = 5000  # the browser gets at most this many rows per table; downloads have all
RAW_CONTEXT = 20  # lines either side of the chosen one
LIVE_INTERVAL_S = 1.0  # a followed log's charts and counters update this often
# A first open's browser ticks this often once it has the chart, and asks for the rest of the page on the first
# tick that comes on time at least REST_AFTER_S after the chart was sent (a browser still loading the chart
# library or drawing the chart runs its timers late), and REST_AT_MOST_S after it at the latest.
REST_TICK_S = 0.5
REST_AFTER_S = 1.5
REST_AT_MOST_S = 4.0
REST_KEY = "rest-to-draw"  # session state: the first run drew the chart only (when its last tick came)
# The first open's chart is downsampled this far (the full figure comes with the rest of the page): a browser
# draws 18,000 points of a 124 MB capture about 2 s later than 5,000; a small log has fewer and is the same.
FIRST_MAX_POINTS = 1000
# A big upload's first chart is drawn from its first HEAD_BYTES of text (4 MB: 40-60 ms to parse), labelled as
# partial, while a child process parses the whole (preload.start_upload); the rest of the page, the whole chart
# among it, comes from the whole parse only.
HEAD_BYTES = 4 << 20
GZIP_MAGIC = b"\x1f\x8b"
# The digests of uploads parsed whole in this server (`_parse_bytes` ran): opened again (another tab, another
# user), the cached parse draws the chart at once; a head's chart and a child's parse would be wasted, the child's
# never taken (a cached call does not run the function).
_parsed_whole: set[str] = set()


@dataclass(slots=True)
class Source:
    """Something opened in the page: an upload, a paste, a session folder or a path on this machine."""

    name: str
    digest: str
    data: bytes | None = None  # uploads and pastes
    path: str | None = None  # files and session folders on this machine
    live: bool = False  # followed while it is written (kvtrace dashboard --follow)


@dataclass(slots=True)
class Opened:
    source: Source
    result: ParseResult | None  # None when it could not be read (then `error` says why)
    error: str | None

    @property
    def parsed(self) -> ParseResult:
        """The parse result of a source that was read: callers look at `error` first."""
        assert self.result is not None, self.error
        return self.result


# ---- reading, cached by content hash -------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@st.cache_data(show_spinner=False, max_entries=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file, remembered per (path, size, mtime) so a rerun does not read it again."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


@st.cache_data(show_spinner=False, max_entries=16)
def _parse_bytes(digest: str, _data: bytes, _name: str) -> tuple[Any | None, str | None]:
    # Keyed on the digest alone: the same bytes under another name are not parsed again.
    _parsed_whole.add(digest)
    started = preload.take_upload(digest, len(_data))  # a big upload, parsed while its head's chart was drawn
    if started is not None:
        return started
    try:
        return analyze.parse(_data, name=_name), None
    except analyze.InputError as exc:
        return None, str(exc)


@st.cache_data(show_spinner=False, max_entries=64)
def _upload_digest(file_id: str, _upload: UploadedFile) -> str:
    """sha256 of an upload's bytes where Streamlit holds them (no copy), once per upload (`file_id`)."""
    return hashlib.sha256(_upload.getbuffer()).hexdigest()


@st.cache_data(show_spinner=False, max_entries=16)
def _parse_path(digest: str, _path: str) -> tuple[Any | None, str | None]:
    started = preload.take(_path)  # the path on the command line, read while the server started
    if started is not None:
        return started
    try:
        return analyze.parse(_path), None
    except analyze.InputError as exc:
        return None, str(exc)


@st.cache_resource(show_spinner=False, max_entries=8)
def _raw_text(digest: str, _source: str | bytes) -> RawText:
    return RawText.open(_source)


@st.cache_data(show_spinner=False, max_entries=16)
def _report(digest: str, _result: ParseResult, name: str, _axis: XAxis) -> str:
    return markdown_report(_result, name=name, axis=_axis)  # a source's axis is the same on every run


@st.cache_resource(show_spinner=False, max_entries=4)
def _follower(path: str) -> Follower:
    # One per path for the whole server: every page and every rerun share its parse, so no byte is parsed twice.
    return Follower(Path(path), interval_s=LIVE_INTERVAL_S)


def live_source(path: str) -> Source:
    """A log followed while it is written: its key stays the same as it grows, so the user's choices stay."""
    p = Path(path).expanduser().resolve()
    return Source(p.name, "live" + _sha256(str(p).encode())[:20], path=str(p), live=True)


def open_source(src: Source) -> Opened:
    with st.spinner(f"Reading {src.name} ..."):
        if src.data is not None:
            result, error = _parse_bytes(src.digest, src.data, src.name)
        else:
            result, error = _parse_path(src.digest, src.path or "")
    return Opened(src, result, error)


def path_source(path: str | Path, name: str | None = None) -> Source | str:
    """A Source for a log or session folder on this machine, or a one-line reason it cannot be opened."""
    p = Path(path).expanduser()
    log = log_named(p)
    if not log.is_file():
        return f"{p}: no such log file or session folder (a session folder holds {RAW_LOG})"
    try:
        stat = log.stat()
        digest = _file_digest(str(log), stat.st_size, stat.st_mtime_ns)
    except OSError as exc:
        return f"{p}: cannot read ({exc.strerror or exc})"
    return Source(name or p.name, digest, path=str(p))


def raw_text(src: Source) -> RawText | None:
    try:
        return _raw_text(src.digest, src.data if src.data is not None else (src.path or ""))
    except (OSError, ValueError, analyze.InputError):
        return None


def capture_axis(src: Source, result: ParseResult) -> XAxis:
    """The log's own timestamps, else (for a captured session) when each line arrived, else line numbers."""
    return chart_axis(result, lambda: _arrival_seconds(src))


def _arrival_seconds(src: Source) -> np.ndarray | None:
    """When each line of a captured session arrived (seconds, by line number); None for anything else."""
    if not src.path or not Path(src.path).is_dir():
        return None
    try:
        chunks = load_chunks(Path(src.path))  # chunks.parquet, or the journal of a killed capture
        raw = raw_text(src) if len(chunks) else None
        return capture_seconds(raw, chunks) if raw is not None else None
    except (OSError, ValueError, KeyError):
        return None


# ---- the sidebar: what to open -------------------------------------------------------------------


def gather_sources(widgets: bool = True) -> tuple[list[Source], list[str]]:
    """What is open; `widgets=False` (a first open, chart first) only reads the path on the command line and
    draws the sidebar's heading, unless that path cannot be opened (then the widgets are the way in)."""
    sources: list[Source] = []
    problems: list[str] = []
    st.sidebar.header("Open a log")
    opened_path = os.environ.get(OPEN_ENV, "").strip()
    if opened_path and os.environ.get(FOLLOW_ENV) == "1":
        followed = live_source(opened_path)
        if not widgets:
            return [followed], problems
        sources.append(followed)
        st.sidebar.caption("Following, from the command line:")
        st.sidebar.code(followed.path or "", language=None)
    elif opened_path:
        got = path_source(opened_path)
        if isinstance(got, str):
            problems.append(got)
        elif not widgets:
            return [got], problems
        else:
            sources.append(got)
            st.sidebar.caption("Opened from the command line:")
            st.sidebar.code(got.path or "", language=None)
    limit = int(st.get_option("server.maxUploadSize"))
    uploads = st.sidebar.file_uploader(
        "Upload logs (.log, .txt, .gz, a bug report as .md, a GitHub thread as .json)",
        type=UPLOAD_TYPES, accept_multiple_files=True,
        help=f"Up to {limit} MB per file. Bigger logs: run kvtrace dashboard PATH on the machine that has them.",
    )  # fmt: skip
    st.sidebar.caption(
        f"Up to {limit} MB per upload. For a bigger log run `kvtrace dashboard PATH`: "
        "the file is read where it is and never uploaded."
    )
    for up in uploads or []:
        if up.size > limit * 1024 * 1024:
            problems.append(f"{up.name} is over the {limit} MB upload limit: run kvtrace dashboard {up.name} instead")
            continue
        # the bytes as Streamlit holds them: the parse streams through them (a .gz unpacked as it is read)
        sources.append(Source(up.name, _upload_digest(up.file_id, up), data=up.getvalue()))
    pasted = st.sidebar.text_area("...or paste a bug report's text", height=120, key="paste")
    if pasted.strip():
        data = pasted.encode("utf-8", "replace")
        sources.append(Source("pasted text", _sha256(data), data=data))
    choices: dict[str, Path | None] = {"(none)": None}
    for sess in list_sessions(DEFAULT_ROOT):
        choices[f"session: {sess.path.name}"] = sess.path
    if SAMPLES.is_dir():
        for sample in sorted(p for p in SAMPLES.iterdir() if is_session(p)):
            choices[f"sample: {sample.name}"] = sample
    picked = st.sidebar.selectbox("...or a captured session or bundled sample", list(choices), key="session")
    chosen = choices.get(picked)
    if chosen is not None:
        got = path_source(chosen, name=picked)
        if isinstance(got, str):
            problems.append(got)
        else:
            sources.append(got)
    # The same bytes opened twice (say a sample also uploaded) are one source.
    unique: dict[str, Source] = {}
    for s in sources:
        unique.setdefault(s.digest, s)
    return list(unique.values()), problems


# ---- the page ------------------------------------------------------------------------------------


@st.cache_data(show_spinner=False, max_entries=16)
def _what_to_do(digest: str, _result: ParseResult) -> tuple[str, list[str]]:
    return what_to_do(_result)


def show_verdict(op: Opened, axis: XAxis) -> None:
    result = op.parsed
    v = result.verdict
    for warning in result.warnings:  # e.g. a .gz cut short: say what was not read
        st.warning(escape(warning))
    if v.kind == "no_log":
        st.warning(escape(
            f"{op.source.name}: no llama.cpp log lines found in {result.lines} lines of text. "
            "Upload the server's own output (stderr), a bug report that quotes it, or a captured session."
        ))  # fmt: skip
        return
    ov = overview(result, axis)  # the chart's axis: the first divergence here is where the chart shades it
    st.subheader(headline(result))
    if v.thread is not None:  # a GitHub thread: which comment the deciding line was pasted in (its words escaped)
        n = len(v.thread.get("parts") or ())
        st.caption(escape(f"A GitHub thread of {n} part{'s' if n != 1 else ''}: the evidence is from "
                          f"{v.thread.get('evidence_from') or 'none of them'}."))
    st.caption("For the whole log; the charts below follow the sequence picked beside them.")
    failed = bool(len(result.errors))
    cols = st.columns(4)
    cols[0].metric("Failing side", v.component if failed else "none")
    d = ov.first_divergence
    if d is not None:
        how = f"gap {int(d.delta)}" if d.source == "error" else f"drafter {d.delta:+g}"
        cols[1].metric("First divergence", f"line {d.line}", how, delta_color="off", delta_arrow="off")
    else:
        cols[1].metric("First divergence", "none")
    cols[2].metric("Position errors", f"{v.n_position_errors:,}")
    cols[3].metric("All errors", f"{ov.n_errors:,}", f"{ov.n_resets:,} resets", delta_color="off", delta_arrow="off")
    cols = st.columns(4)
    cols[0].metric("Batches", f"{ov.n_batches:,}")
    cols[1].metric("Target batches", f"{ov.n_target:,}")
    cols[2].metric("Drafter batches", f"{ov.n_drafter:,}")
    cols[3].metric("Draft acceptance", _rate(ov.acceptance), _acc_detail(ov.acceptance), delta_color="off",
                   delta_arrow="off")
    if v.last_pos is not None and v.batch_start is not None:
        st.markdown(
            f"**First position error:** the KV cache held up to **X = {int(v.last_pos)}**, the batch started "
            f"at **Y = {int(v.batch_start)}** (sequence {v.seq_id}; gap {int(v.batch_start) - int(v.last_pos) - 1})."
        )
    found = health(result)
    if v.summary:
        st.markdown(escape(restated(v.summary, found)))
    if found:  # data, never markup: the evidence is the tool's words, but a table keeps it plain
        st.markdown("**Health findings:** the drafter stopped helping; each onset is marked on the charts.")
        st.dataframe(pd.DataFrame([f.to_dict() for f in found]), hide_index=True, key=f"health-{op.source.digest}")
    explanation, steps = _what_to_do(op.source.digest, result)
    if failed or not v.summary:  # a healthy run's summary says it all: one sentence, not two
        st.markdown(explanation)
    if steps:
        st.markdown("**Next steps:**\n" + "\n".join(f"- {s}" for s in steps))
    show_counters_finding(result, op.source.digest)


def _rate(acc: AcceptanceSummary) -> str:
    if acc and acc.get("synthetic"):  # the server chose what was accepted: not a rate of the drafter's
        return "synthetic"
    return f"{acc['rate']:.1%}" if acc and acc.get("rate") is not None else "n/a"


def _acc_detail(acc: AcceptanceSummary) -> str | None:
    if acc and acc.get("synthetic"):
        return f"{acc.get('accepted')} of {acc.get('generated')}, by the server"
    return f"{acc.get('accepted')} of {acc.get('generated')} drafted" if acc else None


def _acceptance_caption(result: ParseResult) -> str:
    acc = result.verdict.acceptance or {}
    return f"Draft acceptance: {SYNTHETIC_NOTE}." if acc.get("synthetic") else "Draft acceptance"


def sequence_label(seq_id: int, n_batches: int) -> str:
    return f"{seq_id} ({n_batches:,} batch{'es' if n_batches != 1 else ''})"


def chart_controls(op: Opened, opening: ChartModel, key: str) -> tuple[ChartModel, tuple[float, float] | None, float]:
    """The sequence picker, the tolerance and the x range; returns the picked sequence's model, the range (None:
    all of it) and the tolerance. `opening`: the model a view opens on."""
    result = op.parsed
    seqs = opening.sequences
    c1, c2, c3 = st.columns([1, 1, 3])
    model = opening
    if seqs and opening.opening is not None:
        seq_id = c1.selectbox("Sequence / slot", seqs, index=seqs.index(opening.opening), key=f"seq-{key}",
                              format_func=lambda s: sequence_label(s, opening.batches.get(s, 0)))
        model = chart_model(result, opening.axis, seq_id=seq_id)
    tol = c2.number_input(
        "Apart when more than", min_value=0.0, value=opening.tolerance, step=1.0, key=f"tol-{key}",
        help="Positions the drafter may lead or trail the target within one draft cycle (default: one draft block; the "
             "draft size for a drafter that keeps its own cache).",
    )  # fmt: skip
    axis = model.axis
    if model.x_extent is None or model.x_extent[1] <= model.x_extent[0]:
        return model, None, tol
    lo, hi = model.x_extent
    # The chosen range lives under its own key: the slider's bounds grow with a followed log (a new widget
    # each time), and a range the user chose stays; the whole range follows the log as it grows.
    zoom_at = zoom_key(key, model.seq_id)
    div = model.divergence(tol)
    if div is not None and c1.button("Jump to first divergence", key=f"jump-{key}"):
        st.session_state[zoom_at] = _around(div.x, lo, hi, 0.08, axis)
    err = model.first_error
    if st.session_state.pop(f"jump-error-{key}", False) and err is not None and np.isfinite(err.x):
        st.session_state[zoom_at] = _around(err.x, lo, hi, 0.04, axis)
    fmt = None
    step: float
    if axis.kind == "line":
        lo, hi, step = int(lo), int(hi), 1
    else:
        step = max((hi - lo) / 1000, 1e-6)
        fmt = f"%.{max(0, int(-np.floor(np.log10(step))))}f"
    zoom = st.session_state.get(zoom_at)
    if zoom is not None and c1.button("Whole log", key=f"whole-{key}", help="Undo the zoom (a range dragged "
                                      "across the chart, the slider's, or a jump)"):
        zoom = st.session_state[zoom_at] = None
    value = (max(lo, zoom[0]), min(hi, zoom[1])) if zoom is not None and zoom[0] < hi else (lo, hi)
    slider_key = f"range-{key}-{model.seq_id}-{lo}-{hi}-{zoom}"  # a new range set here is a new widget
    rng = cast(tuple[float, float], c3.slider(
        axis.title, min_value=lo, max_value=hi, value=value, step=step, key=slider_key, format=fmt,
        on_change=_keep_zoom, args=(slider_key, zoom_at, (lo, hi), value),
    ))  # fmt: skip
    return model, (float(rng[0]), float(rng[1])) if tuple(rng) != (lo, hi) else None, tol


def _around(x: float, lo: float, hi: float, share: float, axis: XAxis) -> tuple[float, float]:
    width = max((hi - lo) * share, 1.0 if axis.kind == "line" else 1e-6)
    a, b = max(lo, x - width), min(hi, x + width)
    return (int(a), int(np.ceil(b))) if axis.kind == "line" else (a, b)


def zoom_key(key: str, seq_id: int | None) -> str:
    """Where a view's chosen x range lives (the range slider and a range dragged in the chart): one per source
    and sequence, so it stays while a followed log grows and when the rest of a first open arrives."""
    return f"zoom-{key}-{seq_id}"


def _zoom_from_chart(chart_key: str, zoom_at: str, axis: XAxis) -> None:
    """A range dragged across the position chart (a box selection) becomes the view's zoom. A cleared selection
    changes nothing: the browser clears it by itself when it draws the zoomed figure, so it does not say the
    user wants the whole log back (the range slider and "Whole log" do)."""
    event = st.session_state.get(chart_key)
    boxes = event.get("selection", {}).get("box", []) if event is not None else []
    xs = [float(x) for x in boxes[0].get("x", [])] if boxes else []
    if len(xs) != 2 or not all(np.isfinite(xs)) or xs[0] == xs[1]:
        return
    lo, hi = min(xs), max(xs)
    st.session_state[zoom_at] = (int(np.floor(lo)), int(np.ceil(hi))) if axis.kind == "line" else (lo, hi)


def _keep_zoom(slider_key: str, zoom_at: str, full: tuple[float, float], shown: tuple[float, float]) -> None:
    chosen = tuple(st.session_state[slider_key])
    if chosen == tuple(shown):  # a new slider (the log grew) reporting the value it was drawn with
        return
    st.session_state[zoom_at] = None if chosen == full else chosen


_FILTERS = {
    "errors": ("kind", "component"),
    "batches": ("context", "ok"),
    "events": ("kind", "context"),
    "kv": ("context", "cache_size"),
}
_TITLES = {"errors": "Errors", "batches": "Batches", "events": "Events", "kv": "KV cache (find_slot)"}


def show_tables(op: Opened, key: str) -> int | None:
    """Filterable tables; returns the log line of the row the user picked."""
    result = op.parsed
    picked: int | None = None
    n_batches = int(result.batches["batch"].nunique()) if len(result.batches) else 0
    # the batches table has a row per sequence of a batch: say both, so the count matches the headline's
    labels = [f"Batches ({n_batches:,} batches, {len(result.batches):,} rows)" if n == "batches"
              else f"{_TITLES[n]} ({len(getattr(result, n)):,})" for n in _FILTERS]
    tabs = st.tabs(labels, key=f"tabs-{key}", on_change="rerun")
    for tab, name in zip(tabs, _FILTERS, strict=True):
        if not tab.open:
            continue
        with tab:
            frame = getattr(result, name)
            if not len(frame):
                st.caption("None in this log.")
                continue
            cols = st.columns(len(_FILTERS[name]) + 1)
            mask = pd.Series(True, index=frame.index)
            for col, field in zip(cols, _FILTERS[name], strict=False):
                values = sorted({str(v) for v in frame[field].dropna().unique()})
                chosen = col.multiselect(field, values, key=f"f-{key}-{name}-{field}")
                if chosen:
                    mask &= frame[field].astype(str).isin(chosen)
            if "seq_id" in frame:
                seqs = sorted({str(v) for v in frame["seq_id"].dropna().unique()})
                chosen = cols[-1].multiselect("seq_id", seqs, key=f"f-{key}-{name}-seq")
                if chosen:
                    mask &= frame["seq_id"].astype(str).isin(chosen)
            shown = frame[mask]
            if len(shown) > TABLE_ROWS_SHOWN:
                st.caption(f"Showing the first {TABLE_ROWS_SHOWN:,} of {len(shown):,} rows; filter, or download all.")
                shown = shown.head(TABLE_ROWS_SHOWN)
            display = shown.drop(columns=[c for c in ("lines",) if c in shown])
            event = st.dataframe(display, key=f"t-{key}-{name}", on_select="rerun", selection_mode="single-row",
                                 hide_index=True, width="stretch")
            rows = event.selection.rows if event is not None else []
            if rows:
                picked = int(display.iloc[rows[0]]["line"])
    return picked


def show_raw(op: Opened, key: str, picked: int | None) -> None:
    raw = raw_text(op.source)
    if raw is None:
        st.caption("The raw log is not available.")
        return
    n = max(1, raw.n_lines)
    state_key, applied_key = f"line-{key}", f"line-applied-{key}"
    if state_key not in st.session_state:
        evidence = op.parsed.verdict.evidence
        st.session_state[state_key] = min(int(evidence[0]["line"]) if evidence else 1, n)
    # A newly picked table row moves the view; after that the number box is the user's again.
    if picked is not None and st.session_state.get(applied_key) != picked:
        st.session_state[state_key] = min(picked, n)
        st.session_state[applied_key] = picked
    line = st.number_input("Show the log around line", min_value=1, max_value=n, step=1, key=state_key)
    st.code(format_excerpt(raw.around(int(line), RAW_CONTEXT, RAW_CONTEXT), mark=int(line)), language=None)


def show_downloads(op: Opened, key: str, axis: XAxis) -> None:
    """The tables and the triage report (`axis`: the chart's, so the report reads what the chart worked out)."""
    result = op.parsed
    stem = Path(op.source.name).name.split(".")[0] or "log"
    report = _report(op.source.digest, result, op.source.name, axis)
    c1, c2, c3 = st.columns(3)
    c1.download_button("Tables (Parquet, zip)", data=lambda: zip_tables(result, "parquet"),
                       file_name=f"{stem}-tables-parquet.zip", mime="application/zip", key=f"dl-pq-{key}",
                       on_click="ignore")
    c2.download_button("Tables (CSV, zip)", data=lambda: zip_tables(result, "csv"),
                       file_name=f"{stem}-tables-csv.zip", mime="application/zip", key=f"dl-csv-{key}",
                       on_click="ignore")
    c3.download_button("Triage report (Markdown)", data=report, file_name=f"{stem}-triage.md",
                       mime="text/markdown", key=f"dl-md-{key}", on_click="ignore")
    with st.expander("Triage report, ready to paste into a GitHub issue"):
        st.code(report, language="markdown")


def show_compare(a: Opened, b: Opened, seq_id: int | None) -> None:
    st.subheader("Compare")
    fig = compare_figure(a.parsed, b.parsed, names=(a.source.name, b.source.name), seq_id=seq_id)
    st.plotly_chart(fig, key="compare", config={"displaylogo": False})
    rows = []
    for op in (a, b):
        v = op.parsed.verdict
        rows.append({"source": op.source.name, "verdict": v.kind, "failing side": v.component,
                     "position errors": v.n_position_errors, "errors": v.n_errors, "batches": v.n_batches,
                     "resets": v.n_resets, "acceptance": _rate(v.acceptance)})
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")


# ---- a log's page: its panels, in the order they stand ---------------------------------------------

FIRST, LIVE, FULL = "first", "live", "full"  # a browser's first open (chart first), a followed log, the whole page
UPDATED, PER_RUN = "updated", "per run"  # a followed log's panel: redrawn each second, or on the page's own runs


@dataclass(slots=True)
class Shown:
    """One log's page while it is drawn: what its panels share. The chart's controls set `chart` (the picked
    sequence's model), `x_range` and `tolerance`; a first open keeps their starting values. The tables set
    `picked`, the raw log shows it."""

    op: Opened
    key: str
    run: str  # FIRST, LIVE or FULL
    chart: ChartModel
    tolerance: float
    x_range: tuple[float, float] | None = None
    compare_with: Source | None = None
    picked: int | None = None
    partial: str | None = None  # the chart is of the log's head only (a big upload's first run): how much was read

    @classmethod
    def of(cls, op: Opened, run: str, axis: XAxis, compare_with: Source | None = None) -> Shown:
        chart = chart_model(op.parsed, axis)
        return cls(op, op.source.digest[:12], run, chart, chart.tolerance, compare_with=compare_with)


@dataclass(frozen=True, slots=True)
class Panel:
    """One part of a log's page. `first`: drawn on a browser's first open; `live`: how a followed log's page draws
    it (UPDATED, PER_RUN, or None: once the capture has ended); `leads`: filled before the others (the chart and
    what it needs, so the browser draws it while the rest is worked out), though it stands where PANELS puts it."""

    name: str
    draw: Callable[[Shown], None]
    first: bool = False
    live: str | None = None
    leads: bool = False


def _verdict_panel(s: Shown) -> None:
    show_verdict(s.op, s.chart.axis)


def _controls_panel(s: Shown) -> None:
    if s.chart.has_positions:
        s.chart, s.x_range, s.tolerance = chart_controls(s.op, s.chart, s.key)


def _chart_panel(s: Shown) -> None:
    result, model = s.op.parsed, s.chart
    if not model.has_positions:
        with st.container():
            st.info(
                "This log has no KV positions to draw: no batch dumps, no find_slot lines and no position errors. "
                "To see them, rerun with LLAMA_BATCH_DEBUG=1 LLAMA_KV_CACHE_DEBUG=1 and -v, or capture with "
                "`kvtrace capture run -- llama-server ...`."
            )
            _acceptance_chart(result, s.key)
        return
    x_range = s.x_range
    if s.run == FIRST:  # no controls yet: a range chosen in the chart before (a redraw's) is drawn all the same
        x_range = st.session_state.get(zoom_key(s.key, model.seq_id))
    fig = position_figure(result, seq_id=model.seq_id, axis=model.axis, x_range=x_range, tolerance=s.tolerance,
                          max_points=FIRST_MAX_POINTS if s.run == FIRST else DEFAULT_MAX_POINTS, title=s.partial)
    # Dragging across the chart chooses the range to zoom into, held on the server (the range slider's own
    # key): every redraw is a new figure, which the browser draws afresh, so a zoom kept only there would be
    # lost each second under --follow and when the rest of a first open arrives. Double-click: the whole log.
    fig.update_layout(uirevision=f"{s.key}-{model.seq_id}", dragmode="select", selectdirection="h")
    chart_key = f"pos-{s.key}"
    st.plotly_chart(fig, key=chart_key, config={"displaylogo": False}, selection_mode="box",
                    on_select=partial(_zoom_from_chart, chart_key, zoom_key(s.key, model.seq_id), model.axis))


def _acceptance_chart(result: ParseResult, key: str) -> bool:
    acc = acceptance_figure(result)
    if acc is None:
        return False
    st.caption(_acceptance_caption(result))
    st.plotly_chart(acc, key=f"acc-{key}", config={"displaylogo": False})
    return True


def _second_charts_panel(s: Shown) -> None:
    """Drafter minus target beside the acceptance per cycle; a followed log's page says they come at its end."""
    if not s.chart.has_positions:
        return
    if s.run == LIVE:
        st.caption("Drafter minus target and the draft acceptance are drawn once the capture ends.")
        return
    result, model = s.op.parsed, s.chart
    left, right = st.columns(2)
    with left:
        st.caption("Drafter minus target stored position (0 = in step; dotted band = within one draft cycle's "
                   "tolerance). A long run shows its range per time bucket, x where it leaves the band; zoom in "
                   "with the slider for the step line.")
        if len(result.kv) or len(result.batches):
            fig = delta_figure(result, seq_id=model.seq_id, axis=model.axis, x_range=s.x_range, tolerance=s.tolerance)
            st.plotly_chart(fig, key=f"delta-{s.key}", config={"displaylogo": False})
        else:
            st.info("No batch or find_slot lines in this log, so no positions over time: only the errors above.")
    with right:
        if not _acceptance_chart(result, s.key):
            st.info("No per-cycle acceptance lines in this log.")


def _acceptance_panel(s: Shown) -> None:
    show_acceptance(s.op.parsed, s.op.source.digest, s.key)


def _compare_panel(s: Shown) -> None:
    if s.compare_with is None:
        return
    other = open_source(s.compare_with)
    if other.error is not None:
        st.error(escape(f"{other.source.name}: {other.error}"))
    elif other.parsed.verdict.kind == "no_log":
        st.warning(escape(f"{other.source.name}: no llama.cpp log lines to compare."))
    else:
        show_compare(s.op, other, s.chart.seq_id if s.chart.has_positions else None)  # the sequence picked


def _tables_panel(s: Shown) -> None:
    st.subheader("Tables")
    if s.run == LIVE:
        st.caption("As of this page's last full run; the tables, the raw log and the downloads are "
                   "complete once the capture ends.")
    s.picked = show_tables(s.op, s.key)


def _raw_panel(s: Shown) -> None:
    st.subheader("Raw log")
    show_raw(s.op, s.key, s.picked)


def _downloads_panel(s: Shown) -> None:
    st.subheader("Take it away")
    show_downloads(s.op, s.key, s.chart.axis)


def _environment_panel(s: Shown) -> None:
    meta = s.op.parsed.meta
    with st.expander("Environment (from the log)", expanded=bool(meta.get("gpus"))):
        show_devices(meta)
        st.json(meta, expanded=False)


# The one list of a log's panels, in the order they stand on the page; every run draws from it.
PANELS = (
    Panel("verdict", _verdict_panel, live=UPDATED),
    Panel("controls", _controls_panel, live=UPDATED, leads=True),
    Panel("chart", _chart_panel, first=True, live=UPDATED, leads=True),
    Panel("second charts", _second_charts_panel, live=UPDATED),
    Panel("acceptance", _acceptance_panel),
    Panel("compare", _compare_panel),
    Panel("tables", _tables_panel, live=PER_RUN),
    Panel("raw log", _raw_panel),
    Panel("downloads", _downloads_panel),
    Panel("environment", _environment_panel),
)


def panels_for(run: str, live: str | None = None) -> list[Panel]:
    """The panels a run draws, in PANELS' order: a first open the chart alone; a followed log's page those
    drawn `live` (UPDATED or PER_RUN); a finished log every one."""
    if run == FIRST:
        return [p for p in PANELS if p.first]
    if run == LIVE:
        return [p for p in PANELS if p.live == live]
    return list(PANELS)


@dataclass(slots=True)
class Slots:
    """Where each panel of a log's page goes, laid out in PANELS' order before the log is read, the same on
    every run: a first open fills the chart alone, the next run the rest around it, so the browser keeps the
    chart it has drawn (same place, same figure)."""

    places: dict[str, DeltaGenerator]

    @classmethod
    def here(cls, panels: Sequence[Panel] | None = None, caption: str | None = None) -> Slots:
        """A place for each of `panels` (default: every one, PANELS read when called), in their order."""
        if caption is not None:
            st.caption(caption)
        # the chart's place holds one element, replaced: the empty frame a first open shows while it reads
        return cls({p.name: st.empty() if p.name == "chart" else st.container() for p in panels or PANELS})

    @property
    def chart(self) -> DeltaGenerator:
        return self.places["chart"]


def draw_panels(shown: Shown, panels: Sequence[Panel], slots: Slots | None = None) -> None:
    """Fill each panel's place: the leading ones first, then the others in the order they stand."""
    slots = slots or Slots.here(panels)
    for panel in sorted(panels, key=lambda p: not p.leads):  # a stable sort: each group keeps PANELS' order
        with slots.places[panel.name]:
            panel.draw(shown)


# ---- following a capture while it runs ------------------------------------------------------------


def _jump_to_error(key: str) -> None:
    st.session_state[f"jump-error-{key}"] = True


def show_live_status(state: LiveState, src: Source, key: str) -> None:
    """Where the followed log stands: still written, ended (and why), gone; the first position error."""
    for note in state.notices:
        st.warning(escape(note))
    name = escape(src.name)
    if state.waiting:
        what = RAW_LOG if src.path is None or Path(src.path).exists() else "its folder or file"
        st.info(f"Following {name}: waiting for the capture to write {what} (nothing yet).")
    elif state.ended:
        why = {"until-error": "it stopped at the first decode failure (--until-error), after its grace period",
               "killed": "its process is gone"}.get(state.stop_reason or "", escape(state.stop_reason or "done"))
        st.success(f"The capture has ended ({why}): this is the whole log, read {state.bytes_read / 1e6:,.1f} MB.")
    else:
        quiet = f"; nothing new for {state.idle_s:.0f} s" if state.idle_s >= 10 else ""
        st.caption(f"Following {name} while it is written: {state.bytes_read / 1e6:,.1f} MB read, "
                   f"updated every {LIVE_INTERVAL_S:g} s{quiet}.")
    result = state.result
    if result is None or not result.verdict.n_position_errors:
        return
    first = chart_model(result, chart_axis(result), seq_id=None).first_error  # the whole log's
    if first is None:
        return
    what = " ".join(f"{k} = {int(v)}" for k, v in (("X", first.last_pos), ("Y", first.batch_start)) if v is not None)
    side = "" if first.component is None else f" ({escape(first.component)})"
    c1, c2 = st.columns([4, 1])
    c1.error(f"Position error logged at line {first.line}{side}: {what}. "
             f"{result.verdict.n_position_errors:,} so far.")
    c2.button("Jump to the first position error", key=f"jump-error-button-{key}", on_click=_jump_to_error,
              args=(key,))


@st.fragment(run_every=LIVE_INTERVAL_S)
def live_view(src: Source) -> None:
    """The part of the page that updates by itself: status, verdict and charts (tables wait for the end)."""
    state = _follower(src.path or "").poll()
    if state.ended:
        st.rerun()  # the whole page, as for a finished log
    key = src.digest[:12]
    show_live_status(state, src, key)
    result = state.result
    if result is None:
        return
    if result.verdict.kind == "no_log":
        st.info(f"No llama.cpp log lines yet in {result.lines:,} lines.")
        return
    # the live view reads the log's own clock, else line numbers: a session's arrival times grow with it
    draw_panels(Shown.of(Opened(src, result, None), LIVE, chart_axis(result)), panels_for(LIVE, UPDATED))


def _show_newest(sources: list[Source]) -> None:
    """A log opened after the first run (an upload, a paste, a sample picked) is the one shown: picking a
    sample while a path is open shows the sample. The first run shows the first source."""
    seen = st.session_state.get("seen-sources")
    digests = [s.digest for s in sources]
    new = [i for i, d in enumerate(digests) if seen is not None and d not in seen]
    if new:
        st.session_state["show"] = new[-1]
    elif st.session_state.get("show", 0) >= len(sources):
        st.session_state["show"] = 0  # the one shown was closed
    st.session_state["seen-sources"] = set(digests)


def _in_a_browser() -> bool:
    """Whether a browser is on the other end: Streamlit's AppTest sends no request headers, and has no timer
    to ask for the rest of a page drawn chart first."""
    return bool(st.context.headers)


def _chart_first() -> bool:
    """A browser's first run with the path on the command line open, followed or not: the chart goes first."""
    return bool(os.environ.get(OPEN_ENV, "").strip()) and "opened" not in st.session_state and _in_a_browser()


def _rest_later() -> None:
    """After a run that drew the chart alone: the browser's timer asks for the rest of the page."""
    _rest_of_the_page()
    now = time.monotonic()  # after the inline run above: only the timer's runs draw the rest
    st.session_state[REST_KEY] = (now, now)  # the first tick is due REST_TICK_S after the chart was sent


def _follow_first(src: Source, head: Slots) -> bool:
    """A browser's first run on a followed log: the chart of what is read so far, alone, in `head`; False
    (and the frame cleared) when there is nothing to draw yet, and the page is drawn whole."""
    st.session_state["opened"] = src.digest
    state = _follower(src.path or "").poll()
    result = state.result
    if result is None or result.verdict.kind == "no_log":
        head.chart.empty()
        return False
    # the axis each view of it uses: the live view the log's own clock, the finished page the capture's
    axis = capture_axis(src, result) if state.ended else chart_axis(result)
    draw_panels(Shown.of(Opened(src, result, None), FIRST, axis), panels_for(FIRST), head)
    return True


def _head_of_upload(src: Source) -> tuple[Opened, str] | None:
    """A big upload's head parsed (HEAD_BYTES of its text), to draw its first chart from, and the chart's label
    saying how much of the upload it shows (numbers only: the name is a stranger's); None when the upload is small,
    parsed whole already, ended within its head, or cannot be read (then it is read whole, which says why)."""
    data = src.data
    if data is None or (len(data) <= HEAD_BYTES and not data.startswith(GZIP_MAGIC)) or src.digest in _parsed_whole:
        return None
    try:
        head = parse_head(data, max_bytes=HEAD_BYTES, name=src.name)
    except analyze.InputError:
        return None
    if head.whole or head.result.verdict.kind == "no_log":
        return None
    total = _text_size(data)
    of = f" of {total / 1e6:,.1f}" if total is not None and total >= head.read else ""
    title = f"Read {head.read / 1e6:,.1f}{of} MB so far: the whole chart and the rest of the page follow"
    return Opened(src, head.result, None), title


def _text_size(data: bytes) -> int | None:
    """The log's text in all: a plain upload's size, a .gz's from its trailer (the unpacked size of its last
    member, modulo 4 GiB: the caller checks it against what was read); None when it has none."""
    if not data.startswith(GZIP_MAGIC):
        return len(data)
    return int.from_bytes(data[-4:], "little") if len(data) >= 18 else None


def _upload_first(src: Source) -> bool:
    """An upload (or a paste) shown for the first time in a browser: drawn chart first, as a path is (the
    sidebar's widgets are drawn all the same: the upload lives in one of them)."""
    if src.data is None or not _in_a_browser():
        return False
    charted: set[str] = st.session_state.setdefault("charted", set())
    if src.digest in charted:
        return False
    charted.add(src.digest)
    return True


@st.fragment(run_every=REST_TICK_S)
def _rest_of_the_page() -> None:
    """Run by the browser's timer: the whole page, in one full run (which stops this timer), once the chart is
    likely drawn (REST_TICK_S, REST_AFTER_S): the rest of the page arriving before that only delays the chart,
    whose library the browser is still loading, or which it is still drawing. On the run that draws it, it
    draws nothing."""
    state = st.session_state.get(REST_KEY)
    if state is None:
        return
    sent, last = state
    now = time.monotonic()
    on_time = REST_TICK_S * 0.5 <= now - last <= REST_TICK_S * 1.5  # ticks bunched up: it was busy until now
    if (on_time and now - sent >= REST_AFTER_S) or now - sent >= REST_AT_MOST_S:
        del st.session_state[REST_KEY]
        st.rerun(scope="app")
    st.session_state[REST_KEY] = (sent, now)


def _head_of(name: str, waiting: bool) -> Slots:
    slots = Slots.here(caption=f"Source: {escape(name)}")
    if waiting:  # a first open: the chart's empty frame at once, so the browser loads its library meanwhile
        slots.chart.plotly_chart(waiting_figure(), key="waiting", config={"displaylogo": False})
    return slots


def show_log(src: Source, run: str, opened: Opened | None = None, slots: Slots | None = None,
             compare_with: Source | None = None, partial: str | None = None) -> None:
    """A log's page: its panels (on a first open, `run` FIRST, the chart alone); `opened`: already read (a
    followed capture that has ended); `slots`: laid out already. An unreadable log gets its error, and one with
    no llama.cpp lines its verdict only."""
    slots = slots or _head_of(src.name, waiting=opened is None and st.session_state.get("opened") != src.digest)
    op = opened
    if op is None:
        op = open_source(src)
        st.session_state["opened"] = src.digest
    if op.error is not None:
        slots.chart.empty()
        st.error(escape(f"{op.source.name}: {op.error}"))
        return
    shown = Shown.of(op, run, capture_axis(op.source, op.parsed), compare_with)
    shown.partial = partial
    if op.parsed.verdict.kind == "no_log":
        slots.chart.empty()
        draw_panels(shown, [p for p in PANELS if p.name == "verdict"], slots)
        return
    draw_panels(shown, panels_for(run), slots)


def main() -> None:
    st.set_page_config(page_title="kvtrace", layout="wide")
    st.title("kvtrace: target and drafter KV positions")
    first = _chart_first()
    if not first:
        st.session_state.pop(REST_KEY, None)  # a whole page: no timer is waiting to draw it
    # on a first open the chart's frame goes before the file is even hashed (a 124 MB log: 0.2-0.3 s)
    head = _head_of(Path(os.environ[OPEN_ENV].strip()).expanduser().name, waiting=True) if first else None
    sources, problems = gather_sources(widgets=not first)
    if first and len(sources) != 1 and head is not None:  # the path could not be opened: the widgets are the way in
        first = False
        head.chart.empty()
    for p in problems:
        st.error(escape(p))
    if not sources:
        st.info(
            "Open a llama.cpp log on the left: upload it, paste a bug report's text, or pick a captured session "
            "or a bundled sample. Big local logs: `kvtrace dashboard PATH`."
        )
        if _in_a_browser() and not os.environ.get(OPEN_ENV, "").strip():
            # the chart's empty frame, so the browser loads its chart library while the user picks a log
            st.plotly_chart(waiting_figure("the position chart of the log you open"), key="waiting",
                            config={"displaylogo": False})
        return
    if first and head is not None:
        if not sources[0].live:
            show_log(sources[0], FIRST, slots=head)
        elif not _follow_first(sources[0], head):
            st.rerun()  # nothing read yet: the whole page, which says so
        _rest_later()
        return
    names = [s.name for s in sources]
    _show_newest(sources)
    pick = st.sidebar.selectbox("Show", range(len(sources)), format_func=lambda i: names[i], key="show")
    other = [i for i in range(len(sources)) if i != pick]
    cmp_pick: int | None = None
    if other:
        cmp_pick = st.sidebar.selectbox("Compare with", [None, *other], key="compare-with",
                                        format_func=lambda i: "(nothing)" if i is None else names[i])
    else:
        st.sidebar.caption("To compare, open a second log: upload, paste or pick one above.")
    src = sources[pick]
    compare_with = sources[cmp_pick] if cmp_pick is not None else None
    if _upload_first(src):
        started = _head_of_upload(src)
        if started is None:
            show_log(src, FIRST)
        else:  # its head's chart, labelled as partial; the whole is parsed meanwhile, for the rest of the page
            show_log(src, FIRST, opened=started[0], partial=started[1])
            preload.start_upload(src.digest, src.data or b"", src.name)
        _rest_later()
        return
    if src.live:
        state = _follower(src.path or "").poll()
        if not state.ended:
            st.caption(f"Source: {escape(src.name)} (live)")
            live_view(src)
            if state.result is not None and state.result.verdict.kind != "no_log":
                # what the live view does not redraw each second, as of this run
                followed = Opened(src, state.result, None)
                draw_panels(Shown.of(followed, LIVE, chart_axis(state.result)), panels_for(LIVE, PER_RUN))
            return
        show_live_status(state, src, src.digest[:12])
        ended = Opened(src, state.result, None if state.result is not None else "the capture wrote no log")
        show_log(src, FULL, opened=ended, compare_with=compare_with)
    else:
        show_log(src, FULL, compare_with=compare_with)


def show_devices(meta: Meta) -> None:
    """The devices the log lists and where the target's and the drafter's layers and buffers sat (the same
    rows as the report's tables; shown as data, never as markup)."""
    devices = device_rows(meta)
    if devices:
        st.caption("Devices")
        st.dataframe(pd.DataFrame(devices), hide_index=True)
    line = layout_line(meta)
    if line:
        st.text(line)
    placed = placement_rows(meta)
    if placed:
        st.caption("Placement: the target's and the drafter's layers and buffers per device")
        st.dataframe(pd.DataFrame(placed), hide_index=True)

