"""Acceptance figures (analyze/findings/acceptance.py's derivations): over time, per draft position, per request.

Numbers and the tool's own words only: no log text goes into a figure.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvtrace.analyze.findings.acceptance import Acceptance
from kvtrace.analyze.views.figures import COLOURS, onset_trace

SERVER_COLOUR = "#2ca02c"
_MARGIN = {"l": 60, "r": 20, "t": 50, "b": 50}
_HIST_BINS = 10  # per-request acceptance in tenths


def time_title(acc: Acceptance) -> str:
    return ("seconds since the capture began" if acc.clock == "capture"
            else "log time (s)")


SLOT_BINS = 20  # acceptance over time per slot: each slot's steps in this many equal stretches of the run
SLOT_COLOURS = ("#1f77b4", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def _slot_traces(fig: go.Figure, steps: pd.DataFrame) -> None:
    """Per slot, where the log's steps name more than one: each slot's acceptance per stretch of the run."""
    steps = steps[steps["t"].notna() & (steps["slot"] >= 0)]
    if steps["slot"].nunique() < 2:
        return
    t = steps["t"].to_numpy(np.float64)
    lo, hi = float(t.min()), float(t.max())
    edges = np.linspace(lo, hi, SLOT_BINS + 1) if hi > lo else np.array([lo, lo + 1.0])
    part = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(edges) - 2)
    g = steps.assign(part=part).groupby(["slot", "part"])[["drafted", "accepted"]].sum().reset_index()
    mids = (edges[:-1] + edges[1:]) / 2
    for i, (slot, rows) in enumerate(g.groupby("slot", sort=True)):
        rate = rows["accepted"].to_numpy(np.float64) / np.maximum(rows["drafted"].to_numpy(np.float64), 1)
        fig.add_trace(go.Scatter(
            x=mids[rows["part"].to_numpy(np.int64)], y=rate, mode="lines", name=f"slot {slot}",
            line={"color": SLOT_COLOURS[i % len(SLOT_COLOURS)], "width": 1},
            hovertemplate=f"slot {slot}" + "<br>t %{x:.2f} s<br>%{y:.1%} accepted<extra></extra>"))


def over_time_figure(acc: Acceptance, steps: pd.DataFrame | None = None,
                     onsets: list[tuple[float, str]] | None = None) -> go.Figure | None:
    """Acceptance per stretch of time from the log's steps (per slot too, from `steps`, the log's per-step
    lines, where they name several slots), per scrape from the server's counters, and each health finding's
    onset (`onsets`: the log's seconds and a name, drawn where the chart runs on the log's clock)."""
    log, server = acc.log_over_time, acc.server_over_time
    if not len(log) and (server is None or not len(server)):
        return None
    fig = go.Figure()
    if steps is not None and acc.clock == "log":
        _slot_traces(fig, steps)
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
    for t, name in onsets or [] if acc.clock == "log" else []:
        onset_trace(fig, t, 0.0, 1.05, name, name)
    fig.update_layout(title="draft acceptance over time", xaxis_title=time_title(acc), yaxis_title="accepted",
                      yaxis={"tickformat": ".0%", "range": [0, 1.05]}, height=320, margin=_MARGIN,
                      legend={"orientation": "h", "y": -0.25})
    return fig


def step_histogram_figure(histogram: list[dict[str, Any]]) -> go.Figure | None:
    """"Accepted exactly j of n", counted from the log's per-step lines (findings.acceptance.step_histogram): one
    group of bars per draft size n."""
    if not histogram:
        return None
    fig = go.Figure()
    for i, h in enumerate(histogram):
        steps = np.array(h["steps"], dtype=np.float64)
        fig.add_trace(go.Bar(x=np.arange(steps.size), y=steps, name=f"{h['drafted']} drafted",
                             marker_color=SLOT_COLOURS[i % len(SLOT_COLOURS)],
                             hovertemplate="%{y:.0f} steps accepted exactly %{x} of "
                                           f"{h['drafted']}<extra></extra>"))
    fig.update_layout(title="verify steps that accepted exactly j of n (per-step lines)", barmode="group",
                      xaxis_title="accepted tokens j", yaxis_title="verify steps", xaxis_dtick=1, height=320,
                      margin=_MARGIN, legend={"orientation": "h", "y": -0.25})
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
