"""Plotly figures from the reader's tables: positions over time, drafter minus target, acceptance.

Every trace gets numpy arrays (Plotly serialises them as binary, 40x faster than lists) downsampled to a
few thousand points; error and reset markers are never downsampled. No log text goes into a figure:
hover labels carry numbers and line numbers only, because Plotly renders some HTML in labels.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvtrace.analyze.findings.chart import chart_axis, chart_model
from kvtrace.analyze.findings.health import health
from kvtrace.analyze.findings.positions import (
    XAxis,
    apart_stretches,
    choose_axis,
    first_divergence,
    floats,
    opening_sequence,
    stored_positions,
)
from kvtrace.analyze.findings.signatures import match_signature
from kvtrace.analyze.reader.definitions import reset_events
from kvtrace.analyze.reader.records import detail_of
from kvtrace.analyze.views.downsample import DEFAULT_MAX_POINTS, envelope, minmax_indices

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult

COLOURS = {
    "target": "#1f6fc5",
    "drafter": "#f28e1c",
    "unknown": "#9a9a9a",
    "error": "#d62728",
    "reset": "#6b6b6b",
    "divergence": "rgba(214, 39, 40, 0.13)",
}
MAX_GAP_LABELS = 12  # text labels on the first errors; every error still has its segment and hover
MAX_DETAILED_ERRORS = 3000


def _in_range(x: np.ndarray, x_range: tuple[float, float] | None) -> np.ndarray:
    if x_range is None:
        return np.ones(x.size, dtype=bool)
    return (x >= x_range[0]) & (x <= x_range[1])


def _x_span(fig: go.Figure, x_range: tuple[float, float] | None) -> float | None:
    """Width of the x range drawn so far (the zoom if one is set)."""
    if x_range is not None:
        return float(x_range[1] - x_range[0])
    xs = [np.asarray(tr.x, dtype=float) for tr in fig.data if tr.x is not None and len(tr.x)]
    xs = [x[np.isfinite(x)] for x in xs]
    xs = [x for x in xs if x.size]
    return float(max(x.max() for x in xs) - min(x.min() for x in xs)) if xs else None


def _extent(lo: float, hi: float, *values: np.ndarray) -> tuple[float, float]:
    """Widen (lo, hi) to cover the finite values (NaN gaps and empty arrays ignored)."""
    for v in values:
        v = v[np.isfinite(v)]
        if v.size:
            lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
    return lo, hi


def _segments(x: np.ndarray, y0: np.ndarray, y1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertical segments x: (y0 -> y1) as one trace's points, separated by NaN gaps."""
    n = x.size
    xs = np.empty(3 * n)
    ys = np.empty(3 * n)
    xs[0::3], xs[1::3], xs[2::3] = x, x, np.nan
    ys[0::3], ys[1::3], ys[2::3] = y0, y1, np.nan
    return xs, ys


def _position_traces(
    fig: go.Figure, result: ParseResult, seq_id: int | None, axis: XAxis,
    x_range: tuple[float, float] | None, max_points: int, suffix: str = "", col: int | None = None,
    dash: str | None = None,
) -> tuple[float, float]:
    """Add the stored-position lines and batch spans; return the y extent drawn (for resets and shading)."""
    lo, hi = np.inf, -np.inf
    add = (lambda tr: fig.add_trace(tr, row=1, col=col)) if col else fig.add_trace
    b = result.batches
    seq_ok = pd.to_numeric(b["seq_id"], errors="coerce") == seq_id if seq_id is not None else True
    for context in ("target", "drafter", "unknown"):
        # Batch spans: the positions each decoded batch covered.
        part = b[(b["context"] == context) & seq_ok] if len(b) else b
        if len(part):
            x = axis.of(part["line"], part["t"])
            keep = _in_range(x, x_range)
            x, pmin, pmax = x[keep], floats(part["pos_min"])[keep], floats(part["pos_max"])[keep]
            idx = minmax_indices(pmax, max_points // 2)
            if idx.size:
                xs, ys = _segments(x[idx], pmin[idx], pmax[idx])
                lo, hi = _extent(lo, hi, pmin[idx], pmax[idx])
                add(go.Scatter(
                    x=xs, y=ys, mode="lines", name=f"{context} batch span{suffix}",
                    legendgroup=f"{context}{suffix}", line={"color": COLOURS[context], "width": 5},
                    opacity=0.35, hoverinfo="skip",
                ))  # fmt: skip
        if context == "unknown":
            continue
        # The stored max position: the line a reader follows.
        s = stored_positions(result, context, seq_id, axis)
        s = s[_in_range(s["x"].to_numpy(float), x_range)]
        pos = s["pos"].to_numpy(float)
        # Error X points need no forced keep here: the error trace draws every one of them exactly.
        idx = minmax_indices(pos, max_points)
        x, y, line = s["x"].to_numpy(float)[idx], pos[idx], s["line"].to_numpy(np.int64)[idx]
        lo, hi = _extent(lo, hi, y)
        add(go.Scatter(
            x=x, y=y, mode="lines+markers" if y.size < 400 else "lines", name=f"{context}{suffix}",
            legendgroup=f"{context}{suffix}", line={"color": COLOURS[context], "width": 2, "shape": "hv",
                                                     "dash": dash},
            marker={"size": 5}, customdata=line,
            hovertemplate=f"{context}: stored max %{{y}}<br>line %{{customdata}}<extra></extra>",
        ))  # fmt: skip
    return lo, hi


def _error_traces(
    fig: go.Figure, result: ParseResult, seq_id: int | None, axis: XAxis, x_range: tuple[float, float] | None,
    suffix: str = "", col: int | None = None, labels: bool = True, span: float | None = None,
) -> tuple[float, float]:
    add = (lambda tr: fig.add_trace(tr, row=1, col=col)) if col else fig.add_trace
    err = result.errors
    if seq_id is not None:
        err = err[(pd.to_numeric(err["seq_id"], errors="coerce") == seq_id) | err["seq_id"].isna()]
    err = err[err["last_pos"].notna() | err["batch_start"].notna()]
    if not len(err):
        return np.inf, -np.inf
    x = axis.of(err["line"], err["t"])
    keep = _in_range(x, x_range)
    err, x = err[keep], x[keep]
    if not len(err):
        return np.inf, -np.inf
    X = floats(err["last_pos"])
    Y = floats(err["batch_start"])
    line = err["line"].to_numpy(np.int64)
    both = ~np.isnan(X) & ~np.isnan(Y)
    xs, ys = _segments(x[both], X[both], Y[both])
    gap = Y - X - 1
    # Every error is drawn exactly, never downsampled; past a few thousand, markers and per-point hover
    # data would only slow the browser (the segments and the table still show each one).
    detailed = int(both.sum()) <= MAX_DETAILED_ERRORS
    add(go.Scatter(
        x=xs, y=ys, mode="lines+markers" if detailed else "lines", name=f"position error (X to Y){suffix}",
        line={"color": COLOURS["error"], "width": 2}, marker={"size": 9, "symbol": "x", "color": COLOURS["error"]},
        customdata=np.repeat(np.column_stack([line[both], X[both], Y[both], gap[both]]), 3, axis=0)
        if detailed else None,
        hovertemplate="position error at line %{customdata[0]}<br>stored X = %{customdata[1]}"
                      "<br>batch Y = %{customdata[2]}<br>gap %{customdata[3]}<extra></extra>"
        if detailed else "position error: %{y}<extra></extra>",
    ))  # fmt: skip
    only_y = np.isnan(X) & ~np.isnan(Y)
    if only_y.any():
        add(go.Scatter(
            x=x[only_y], y=Y[only_y], mode="markers", name=f"position error, X cut off{suffix}",
            marker={"size": 10, "symbol": "triangle-down-open", "color": COLOURS["error"]},
            customdata=line[only_y], hovertemplate="position error at line %{customdata} (X not in the log)"
                                                     "<br>batch Y = %{y}<extra></extra>",
        ))  # fmt: skip
    if labels:
        # Label errors that have room: the first, then any at least 8 % of the drawn range further on.
        if span is None:
            span = float(np.nanmax(x) - np.nanmin(x)) if x.size else 0.0
        last = -np.inf
        shown = 0
        for i in np.flatnonzero(both):
            if shown >= MAX_GAP_LABELS:
                break
            if x[i] - last < span * 0.08:
                continue
            last, shown = x[i], shown + 1
            fig.add_annotation(
                x=x[i], y=(X[i] + Y[i]) / 2, text=f"gap {int(gap[i])}", showarrow=False, xanchor="left",
                xshift=6, font={"color": COLOURS["error"], "size": 11}, row=1 if col else None, col=col,
            )
    vals = np.concatenate([X[~np.isnan(X)], Y[~np.isnan(Y)]])
    return float(vals.min()), float(vals.max())


def _resets(result: ParseResult, seq_id: int | None, axis: XAxis, x_range: tuple[float, float] | None) -> pd.DataFrame:
    ev = reset_events(result.events)
    if seq_id is not None and len(ev):
        ev = ev[(pd.to_numeric(ev["seq_id"], errors="coerce") == seq_id) | ev["seq_id"].isna()]
    x = axis.of(ev["line"], ev["t"])
    keep = _in_range(x, x_range)
    return pd.DataFrame({"x": x[keep], "line": ev["line"].to_numpy(np.int64)[keep],
                         "context": ev["context"].to_numpy(object)[keep]})


def _merge_bands(x0: np.ndarray, x1: np.ndarray, parts: int = 1500) -> tuple[np.ndarray, np.ndarray]:
    """Join bands closer than 1/`parts` of the drawn span: the same picture, far fewer polygons to draw."""
    if x0.size < 2:
        return x0, x1
    gap = (max(x1.max(), x0.max()) - min(x0.min(), x1.min())) / parts
    new = np.concatenate([[True], x0[1:] - x1[:-1] > gap])
    starts = np.flatnonzero(new)
    return x0[starts], np.maximum.reduceat(x1, starts)


def _vertical_band_trace(x0: np.ndarray, x1: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, ...]:
    """Closed rectangles (for fill='toself') from x0 to x1 spanning lo..hi, NaN-separated."""
    x0, x1 = np.asarray(x0, float), np.asarray(x1, float)
    n = x0.size
    xs = np.empty(6 * n)
    ys = np.empty(6 * n)
    corners: tuple[tuple[np.ndarray | float, float], ...] = (
        (x0, lo), (x1, lo), (x1, hi), (x0, hi), (x0, lo), (np.nan, np.nan))
    for k, (xv, yv) in enumerate(corners):
        xs[k::6] = xv
        ys[k::6] = yv
    return xs, ys


def _reset_trace(fig: go.Figure, resets: pd.DataFrame, lo: float, hi: float, suffix: str = "",
                 col: int | None = None) -> None:
    """Resets as dotted vertical lines from lo to hi (every one drawn, never downsampled)."""
    if not len(resets):
        return
    xs, ys = _segments(resets["x"].to_numpy(float), np.full(len(resets), lo), np.full(len(resets), hi))
    trace = go.Scatter(
        x=xs, y=ys, mode="lines", name=f"reset{suffix}", line={"color": COLOURS["reset"], "width": 1, "dash": "dot"},
        customdata=np.repeat(resets["line"].to_numpy(), 3), hovertemplate="reset at line %{customdata}<extra></extra>",
    )  # fmt: skip
    if col:
        fig.add_trace(trace, row=1, col=col)
    else:
        fig.add_trace(trace)


def request_spans(result: ParseResult, seq_id: int | None, axis: XAxis) -> tuple[np.ndarray, np.ndarray]:
    """(start x, end x) of each request a slot served, from its `new prompt` line to its next one (or its
    `stop processing`, or the log's end), for the chosen sequence (a slot's requests are its sequence's)."""
    ev = result.events
    if seq_id is None or not len(ev):
        return np.array([]), np.array([])
    mine = ev[pd.to_numeric(ev["seq_id"], errors="coerce") == seq_id]
    starts = mine[mine["kind"] == "new_prompt"]
    if not len(starts):
        return np.array([]), np.array([])
    stops = mine[mine["kind"] == "stop"]
    start_lines = starts["line"].to_numpy(np.int64)
    stop_lines = stops["line"].to_numpy(np.int64)
    last_line = int(result.meta.get("lines") or max(int(ev["line"].max()), int(start_lines.max())))
    ends = np.empty_like(start_lines)
    for i, s in enumerate(start_lines):
        nxt = start_lines[i + 1] if i + 1 < len(start_lines) else last_line
        after = stop_lines[(stop_lines > s) & (stop_lines <= nxt)]
        ends[i] = after[0] if after.size else nxt
    x0 = axis.of(start_lines, starts["t"].to_numpy(float))
    x1 = axis.of(ends, np.full(ends.size, np.nan))
    return x0, x1


def _request_bands(fig: go.Figure, result: ParseResult, seq_id: int | None, axis: XAxis,
                   x_range: tuple[float, float] | None, lo: float, hi: float) -> None:
    """Every other request of the sequence lightly shaded, so the requests of a many-request run can be told
    apart (their prompts start the stored position over)."""
    x0, x1 = request_spans(result, seq_id, axis)
    if x0.size < 2:
        return
    ok = np.isfinite(x0) & np.isfinite(x1)
    if x_range is not None:
        ok &= (x1 >= x_range[0]) & (x0 <= x_range[1])
    pick = ok & (np.arange(x0.size) % 2 == 1)
    if not pick.any():
        return
    a, b = x0[pick], x1[pick]
    if x_range is not None:  # a zoomed chart holds nothing outside its range
        a, b = np.maximum(a, x_range[0]), np.minimum(b, x_range[1])
    xs, ys = _vertical_band_trace(a, b, lo, hi)
    fig.add_trace(go.Scatter(
        x=xs, y=ys, fill="toself", mode="lines", line={"width": 0}, fillcolor="rgba(60, 60, 60, 0.05)",
        name=f"requests ({x0.size}; every other one shaded)", hoverinfo="skip",
    ))  # fmt: skip


ONSET_COLOUR = "#9467bd"


def onset_trace(fig: go.Figure, x: float, lo: float, hi: float, name: str, hover: str) -> None:
    """A health finding's onset: a dashed vertical line across the chart, named in the legend."""
    fig.add_trace(go.Scatter(
        x=[x, x], y=[lo, hi], mode="lines", line={"color": ONSET_COLOUR, "dash": "dash", "width": 2},
        name=name, hovertemplate=html.escape(hover) + "<extra></extra>",
    ))  # fmt: skip


def _onset_traces(fig: go.Figure, result: ParseResult, seq_id: int | None, axis: XAxis,
                  x_range: tuple[float, float] | None, lo: float, hi: float) -> None:
    """Each health finding of this sequence (all of them where the chart shows every sequence) at its onset."""
    for f in health(result):
        if seq_id is not None and f.seq_id is not None and f.seq_id != seq_id:
            continue
        x = float(axis.of(np.array([f.onset_line]), None if f.onset_t is None else np.array([f.onset_t]))[0])
        if not np.isfinite(x) or (x_range is not None and not x_range[0] <= x <= x_range[1]):
            continue
        where = f", slot {f.slot}" if f.slot is not None else ""
        onset_trace(fig, x, lo, hi, f"onset: {f.finding}{where} (line {f.onset_line})",
                    f"{f.finding} from line {f.onset_line} ({f.confidence} confidence)")


def position_figure(
    result: ParseResult,
    *,
    seq_id: int | None = None,
    axis: XAxis | None = None,
    x_range: tuple[float, float] | None = None,
    tolerance: float | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
    title: str | None = None,
) -> go.Figure:
    """The main chart: KV position over time for target and drafter, errors, resets, divergence; its axis,
    default tolerance and drafter minus target are the chart's model's (`chart_model`)."""
    model = chart_model(result, axis, seq_id=seq_id)
    axis = model.axis
    fig = go.Figure()
    lo, hi = _position_traces(fig, result, seq_id, axis, x_range, max_points)
    elo, ehi = _error_traces(fig, result, seq_id, axis, x_range, span=_x_span(fig, x_range))
    lo, hi = min(lo, elo), max(hi, ehi)
    if not np.isfinite(lo):
        lo, hi = 0.0, 1.0
    pad = max(1.0, (hi - lo) * 0.03)
    lo, hi = lo - pad, hi + pad
    # Divergence shading goes first in the legend but under the data (Plotly draws fills in trace order).
    tol = model.tolerance if tolerance is None else tolerance
    runs = [r for r in apart_stretches(result, model.apart, tol)
            if x_range is None or (r.x1 >= x_range[0] and r.x0 <= x_range[1])]
    if runs:
        x0, x1 = _merge_bands(np.array([r.x0 for r in runs]), np.array([r.x1 for r in runs]))
        xs, ys = _vertical_band_trace(x0, x1, lo, hi)
        fig.add_trace(go.Scatter(
            x=xs, y=ys, fill="toself", mode="lines", line={"width": 0}, fillcolor=COLOURS["divergence"],
            name=f"drafter and target apart (> {tol:g})", hoverinfo="skip",
        ))  # fmt: skip
    _request_bands(fig, result, seq_id, axis, x_range, lo, hi)
    _reset_trace(fig, _resets(result, seq_id, axis, x_range), lo, hi)
    _onset_traces(fig, result, seq_id, axis, x_range, lo, hi)
    fig.update_layout(
        title=html.escape(title) if title else None,
        xaxis_title=axis.title, yaxis_title="KV position", height=520, hovermode="closest",
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
        margin={"l": 60, "r": 20, "t": 60 if title else 40, "b": 50},
    )
    if x_range is not None:
        fig.update_xaxes(range=list(x_range))
    return fig


def waiting_figure(title: str = "reading the log ...") -> go.Figure:
    """The position chart's empty frame, drawn while a log is read (or before one is opened): the browser loads
    its chart library in the meantime (about two seconds on a first open) instead of after the log is read. No
    log text in it."""
    fig = go.Figure()
    fig.update_layout(
        height=520, xaxis_title=title, yaxis_title="KV position",
        margin={"l": 60, "r": 20, "t": 40, "b": 50},
    )
    return fig


# More points than this in view read as a solid block in a 300-pixel-high strip: draw the range per time
# bucket instead, with the tolerance band on top and the buckets outside it marked; zoomed in, the step line.
ENVELOPE_ABOVE = 400
ENVELOPE_BUCKETS = 200


def delta_figure(
    result: ParseResult, *, seq_id: int | None = None, axis: XAxis | None = None,
    x_range: tuple[float, float] | None = None, tolerance: float | None = None,
    max_points: int = DEFAULT_MAX_POINTS, envelope_above: int = ENVELOPE_ABOVE,
) -> go.Figure:
    """Drafter minus target stored position over time (0 = in step): the step line, or on a long run the
    envelope (min to max per time bucket) under the tolerance band, with the stretches outside it marked."""
    model = chart_model(result, axis, seq_id=seq_id)
    axis = model.axis
    d = model.apart[_in_range(model.apart["x"].to_numpy(float), x_range)]
    xv, dv = d["x"].to_numpy(float), d["delta"].to_numpy(float)
    tol = model.tolerance if tolerance is None else tolerance
    fig = go.Figure()
    if len(dv) > envelope_above:
        x0, x1, lo, hi = envelope(xv, dv, ENVELOPE_BUCKETS)
        mid = (x0 + x1) / 2
        fig.add_trace(go.Scatter(x=mid, y=hi, mode="lines", line={"width": 0, "color": COLOURS["drafter"]},
                                 name="envelope max", hoverinfo="skip", showlegend=False))
        fig.add_trace(go.Scatter(
            x=mid, y=lo, mode="lines", line={"width": 0, "color": COLOURS["drafter"]}, fill="tonexty",
            fillcolor="rgba(242,142,28,0.35)", name="drafter minus target (range per time bucket)",
            customdata=np.stack([lo, hi], axis=-1),
            hovertemplate="drafter - target from %{customdata[0]} to %{customdata[1]}<extra></extra>",
        ))  # fmt: skip
        out = (hi > tol) | (lo < -tol)
        if out.any():
            worst = np.where(np.abs(hi) >= np.abs(lo), hi, lo)[out]
            fig.add_trace(go.Scatter(
                x=mid[out], y=worst, mode="markers", name="outside the band",
                marker={"color": COLOURS["error"], "size": 5, "symbol": "x"},
                hovertemplate="outside the band: %{y}<extra></extra>",
            ))  # fmt: skip
    else:
        idx = minmax_indices(dv, max_points)
        fig.add_trace(go.Scatter(
            x=xv[idx], y=dv[idx], mode="lines", name="drafter minus target",
            line={"color": COLOURS["drafter"], "shape": "hv"}, customdata=d["line"].to_numpy(np.int64)[idx],
            hovertemplate="drafter - target = %{y}<br>line %{customdata}<extra></extra>",
        ))  # fmt: skip
    if tol:
        # above the data with an outline, so a dense run cannot hide it
        fig.add_hrect(y0=-tol, y1=tol, fillcolor="rgba(120,120,120,0.12)", layer="above",
                      line={"color": "#555", "width": 1, "dash": "dot"}, name="tolerance band")
    fig.add_hline(y=0, line={"color": "#444", "width": 1})
    fig.update_layout(
        xaxis_title=axis.title, yaxis_title="drafter - target (positions)", height=300,
        margin={"l": 60, "r": 20, "t": 30, "b": 50}, showlegend=False,
    )
    if x_range is not None:
        fig.update_xaxes(range=list(x_range))
    return fig


def acceptance_figure(result: ParseResult) -> go.Figure | None:
    """Accepted draft tokens per cycle where the log prints them, else acceptance per draft position."""
    ev = result.events
    cycles = ev[ev["kind"] == "accepted"]
    acc = floats(cycles["accepted"])
    drafted = floats(cycles["generated"])
    if acc.size and not np.isnan(acc).all():
        fig = go.Figure()
        counts = pd.Series(acc[~np.isnan(acc)]).value_counts().sort_index()
        fig.add_trace(go.Bar(x=counts.index.to_numpy(float), y=counts.to_numpy(float), name="cycles",
                             marker_color=COLOURS["drafter"]))
        rate = np.nansum(acc) / np.nansum(drafted) if np.nansum(drafted) else np.nan
        fig.update_layout(
            title=f"accepted draft tokens per cycle ({acc.size} cycles, {rate:.1%} accepted)",
            xaxis_title="accepted tokens in a cycle", yaxis_title="cycles", height=300, xaxis_dtick=1,
            margin={"l": 60, "r": 20, "t": 50, "b": 50},
        )
        return fig
    stats = ev[ev["kind"] == "draft_stats"]
    for d in reversed([detail_of(text) for text in stats["detail"]]):  # a few lines per request
        text = d.get("acc_per_pos")
        if not text:
            continue
        try:
            values = np.array([float(v) for v in str(text).split(",") if v.strip()])
        except ValueError:
            continue
        fig = go.Figure(go.Bar(x=np.arange(1, values.size + 1), y=values, marker_color=COLOURS["drafter"]))
        fig.update_layout(
            title="acceptance per draft position", xaxis_title="draft position", yaxis_title="accepted",
            height=300, margin={"l": 60, "r": 20, "t": 50, "b": 50},
        )
        return fig
    return None


def compare_figure(
    a: ParseResult, b: ParseResult, *, names: tuple[str, str], seq_id: int | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> go.Figure:
    """Two sources side by side, sharing one position axis (say before and after a fix)."""
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[html.escape(n) for n in names])
    lo, hi = np.inf, -np.inf
    resets = []
    for col, (res, suffix) in enumerate(((a, " (A)"), (b, " (B)")), start=1):
        axis = chart_axis(res)
        plo, phi = _position_traces(fig, res, seq_id, axis, None, max_points, suffix=suffix, col=col,
                                    dash=None if col == 1 else "dash")
        elo, ehi = _error_traces(fig, res, seq_id, axis, None, suffix=suffix, col=col, labels=False)
        lo, hi = min(lo, plo, elo), max(hi, phi, ehi)
        resets.append(_resets(res, seq_id, axis, None))
        fig.update_xaxes(title_text=axis.title, row=1, col=col)
    # Resets span the shared position axis, so they are drawn once both sides' extents are known.
    lo, hi = (lo, hi) if np.isfinite(lo) else (0.0, 1.0)
    for col, (found, suffix) in enumerate(zip(resets, (" (A)", " (B)"), strict=True), start=1):
        _reset_trace(fig, found, lo, hi, suffix=suffix, col=col)
    fig.update_yaxes(title_text="KV position", row=1, col=1)
    fig.update_layout(height=480, legend={"orientation": "h", "yanchor": "bottom", "y": 1.08, "x": 0},
                      margin={"l": 60, "r": 20, "t": 80, "b": 50})
    return fig


# A picture for an issue: sized for GitHub's comment column (shown about 900 px wide, twice that on a
# high-density screen), with text large enough to read there.
PICTURE_WIDTH, PICTURE_HEIGHT = 1200, 600


def _vline(fig: go.Figure, x: float, text: str, colour: str, row: int | None = None, dash: str = "dash",
           side: str = "top left") -> None:
    """A marked moment: a vertical line across the plot with its label at the top, on `side` of it."""
    fig.add_vline(x=x, line={"color": colour, "width": 1.5, "dash": dash}, annotation_text=html.escape(text),
                  annotation_position=side, annotation_font={"color": colour, "size": 12},
                  row=row, col=1 if row else None)


ONSET_NEAR_LINES = 5  # an onset this close to the first divergence is the same failure block: one mark, not two


def _marks(fig: go.Figure, result: ParseResult, seq_id: int | None, axis: XAxis, shift: float = 0.0,
           row: int | None = None) -> None:
    """The first divergence and the failure's onset (the first log line the matched signature cites), one mark
    when they are the same failure block."""
    div = first_divergence(result, seq_id, axis)
    sig = match_signature(result)
    lines = [line for line, _ in sig.match.evidence if line > 0]
    onset = min(lines) if sig.signature.failure and lines else None
    near = onset is not None and div is not None and abs(onset - div.line) <= ONSET_NEAR_LINES
    if div is not None and np.isfinite(div.x):
        text = f"first divergence (line {div.line})" + (f": {sig.signature.name}" if near else "")
        _vline(fig, div.x - shift, text, COLOURS["error"], row)
    if onset is not None and not near:
        x = float(axis.of(np.array([onset]))[0])
        if np.isfinite(x):
            _vline(fig, x - shift, f"onset: {sig.signature.name} (line {onset})", "#7b3fa0", row, "dot", "top right")


def _picture_layout(fig: go.Figure) -> None:
    fig.update_layout(
        width=PICTURE_WIDTH, height=PICTURE_HEIGHT, template="plotly_white", font={"size": 13},
        paper_bgcolor="white", plot_bgcolor="white",
    )


def picture_figure(result: ParseResult, *, title: str | None = None) -> go.Figure:
    """The position chart as a picture for an issue: the dashboard's chart of the opening sequence, with the
    first divergence and the failure's onset marked, at PICTURE_WIDTH x PICTURE_HEIGHT."""
    seq_id = opening_sequence(result)
    axis = choose_axis(result)
    fig = position_figure(result, seq_id=seq_id, axis=axis, title=title)
    _marks(fig, result, seq_id, axis)
    _picture_layout(fig)
    fig.update_layout(margin={"l": 70, "r": 30, "t": 120 if title else 90, "b": 60},
                      legend={"y": 1.04, "font": {"size": 12}})
    if title:  # above the legend's two rows, not behind them
        fig.update_layout(title={"y": 0.985, "yanchor": "top", "x": 0.01, "xanchor": "left"})
    return fig


def stacked_figure(a: ParseResult, b: ParseResult, *, names: tuple[str, str]) -> go.Figure:
    """Two runs one above the other on one time axis (each from its own start), for a before/after picture."""
    axes = [choose_axis(a), choose_axis(b)]
    if axes[0].kind != axes[1].kind:  # seconds and line numbers cannot share an axis: both by line
        axes = [XAxis("line", "log line"), XAxis("line", "log line")]
    title = "seconds from the run's start" if axes[0].kind != "line" else "log line"
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=[html.escape(n) for n in names])
    for row, (res, axis, suffix) in enumerate(zip((a, b), axes, (" (A)", " (B)"), strict=True), start=1):
        seq_id = opening_sequence(res)
        one = position_figure(res, seq_id=seq_id, axis=axis)
        xs = [np.asarray(tr.x, float) for tr in one.data if tr.x is not None and len(tr.x)]
        finite = [x[np.isfinite(x)] for x in xs]
        shift = min((float(x.min()) for x in finite if x.size), default=0.0) if axis.kind != "line" else 0.0
        for tr in one.data:
            if tr.x is not None:
                tr.x = np.asarray(tr.x, float) - shift
            tr.name = f"{tr.name}{suffix}"
            tr.legendgroup = f"{tr.legendgroup or tr.name}{suffix}"
            fig.add_trace(tr, row=row, col=1)
        _marks(fig, res, seq_id, axis, shift, row)
        fig.update_yaxes(title_text="KV position", row=row, col=1)
    fig.update_xaxes(title_text=title, row=2, col=1)
    _picture_layout(fig)
    fig.update_layout(height=2 * PICTURE_HEIGHT - 200, legend={"orientation": "h", "yanchor": "bottom",
                                                                "y": 1.04, "x": 0, "font": {"size": 11}},
                      margin={"l": 70, "r": 30, "t": 130, "b": 60})
    return fig
