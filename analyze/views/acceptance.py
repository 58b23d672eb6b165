"""Acceptance figures (analyze/findings/acceptance.py's derivations): over time, per draft position, per request.

Numbers and the tool's own words only: no log text goes into a figure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvtrace.analyze.findings.acceptance import Acceptance
from kvtrace.analyze.views.figures import COLOURS

SERVER_COLOUR = "#2ca02c"
_MARGIN = {"l": 60, "r": 20, "t": 50, "b": 50}
_HIST_BINS = 10  # per-request acceptance in tenths


def time_title(acc: Acceptance) -> str:
    return ("seconds since the capture began" if acc.clock == "capture"
            else "log time (s)")


def over_time_figure(acc: Acceptance) -> go.Figure | None:
    """Acceptance per stretch of time from the log's steps, and per scrape from the server's counters."""
    log, server = acc.log_over_time, acc.server_over_time
    if not len(log) and (server is None or not len(server)):
        return None
    fig = go.Figure()
    if len(log):
        fig.add_trace(go.Scatter(
            x=log["t"].to_numpy(np.float64), y=log["rate"].to_numpy(np.float64), mode="lines+markers",
            name="log (verify steps)", line={"color": COLOURS["drafter"]},
            customdata=np.stack([log["accepted"].to_numpy(np.float64), log["drafted"].to_numpy(np.float64)], axis=1),
            hovertemplate="t %{x:.2f} s<br>%{y:.1%} accepted (%{customdata[0]:.0f} of %{customdata[1]:.0f})"
                          "<extra></extra>"))
    if server is not None and len(server):
        fig.add_trace(go.Scatter(
            x=server["t"].to_numpy(np.float64), y=server["rate"].to_numpy(np.float64), mode="markers",
            name="server counters (/metrics)", marker={"color": SERVER_COLOUR, "size": 9, "symbol": "diamond"},
            customdata=np.stack([server["accepted"].to_numpy(np.float64),
                                 server["drafted"].to_numpy(np.float64)], axis=1),
            hovertemplate="scrape at %{x:.2f} s<br>%{y:.1%} accepted since the last (%{customdata[0]:.0f} of "
                          "%{customdata[1]:.0f})<extra></extra>"))
    fig.update_layout(title="draft acceptance over time", xaxis_title=time_title(acc), yaxis_title="accepted",
                      yaxis={"tickformat": ".0%", "range": [0, 1.05]}, height=320, margin=_MARGIN,
                      legend={"orientation": "h", "y": -0.25})
    return fig


def per_position_figure(acc: Acceptance) -> go.Figure | None:
    """The share of drafts whose k-th token was accepted, from the log and from the counters."""
    if not acc.per_position and not acc.server_per_position:
        return None
    fig = go.Figure()
    if acc.per_position:
        fig.add_trace(go.Bar(x=np.arange(1, len(acc.per_position) + 1), y=np.array(acc.per_position),
                             name="log (verify steps)", marker_color=COLOURS["drafter"],
                             hovertemplate="position %{x}: %{y:.1%}<extra></extra>"))
    if acc.server_per_position:
        fig.add_trace(go.Bar(x=np.arange(1, len(acc.server_per_position) + 1), y=np.array(acc.server_per_position),
                             name="server counters (/metrics)", marker_color=SERVER_COLOUR,
                             hovertemplate="position %{x}: %{y:.1%}<extra></extra>"))
    fig.update_layout(title="acceptance per draft position", xaxis_title="draft position", xaxis_dtick=1,
                      yaxis_title="drafts accepted to here", yaxis={"tickformat": ".0%", "range": [0, 1.05]},
                      barmode="group", height=320, margin=_MARGIN, legend={"orientation": "h", "y": -0.25})
    return fig


def per_request_figure(acc: Acceptance) -> go.Figure | None:
    """How many requests accepted each share of their drafts (tenths), stacked per slot."""
    r = acc.requests[acc.requests["drafted"] > 0]
    if not len(r):
        return None
    edges = np.linspace(0.0, 1.0, _HIST_BINS + 1)
    mids = (edges[:-1] + edges[1:]) / 2
    fig = go.Figure()
    for slot in sorted(int(s) for s in r["slot"].unique()):
        counts, _ = np.histogram(r.loc[r["slot"] == slot, "rate"].to_numpy(np.float64), bins=edges)
        fig.add_trace(go.Bar(x=mids, y=counts.astype(np.float64), width=1 / _HIST_BINS * 0.95, name=f"slot {slot}",
                             hovertemplate=f"slot {slot}" + ": %{y:.0f} requests near %{x:.0%}<extra></extra>"))
    fig.update_layout(title=f"acceptance per request ({len(r)} requests)", xaxis_title="accepted share of drafted",
                      xaxis={"tickformat": ".0%", "range": [0, 1]}, yaxis_title="requests", barmode="stack",
                      height=320, margin=_MARGIN, legend={"orientation": "h", "y": -0.25})
    return fig


def request_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Requests as the dashboard and report list them."""
    return pd.DataFrame({
        "slot": rows["slot"].astype("int64"), "task": rows["task"].astype("int64"),
        "first line": rows["line"].astype("int64"), "seconds": rows["seconds"].round(3),
        "drafted": rows["drafted"].astype("int64"), "accepted": rows["accepted"].astype("int64"),
        "accepted %": (rows["rate"] * 100).round(1),
    }).reset_index(drop=True)


def slot_table(acc: Acceptance) -> pd.DataFrame:
    s = acc.slots
    return pd.DataFrame({
        "slot": s["slot"].astype("int64"), "requests": s["requests"].astype("int64"),
        "drafted": s["drafted"].astype("int64"), "accepted": s["accepted"].astype("int64"),
        "accepted %": (s["rate"] * 100).round(1), "mean seconds": s["seconds"].round(3),
    })
