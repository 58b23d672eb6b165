"""The dashboard's acceptance section and its counters finding: acceptance over time, per draft position and per
request (histogram per slot, the worst and the slowest listed), and a warning where the log's draft counts
differ from the server's /metrics. Tables are data (st.dataframe), never markup."""

from __future__ import annotations

import streamlit as st

from kvtrace.analyze.findings.acceptance import Acceptance, acceptance, step_histogram, step_table
from kvtrace.analyze.findings.counters import ServerCounters, server_counters
from kvtrace.analyze.findings.health import health
from kvtrace.analyze.reader.parser import ParseResult
from kvtrace.analyze.views.acceptance import (
    over_time_figure,
    per_position_figure,
    per_request_figure,
    request_table,
    slot_table,
    step_histogram_figure,
)
from kvtrace.analyze.views.report import disagreement_text

_CONFIG = {"displaylogo": False}


@st.cache_data(show_spinner=False, max_entries=16)
def _acceptance(digest: str, _result: ParseResult) -> Acceptance:
    return acceptance(_result)


@st.cache_data(show_spinner=False, max_entries=16)
def _counters(digest: str, _result: ParseResult) -> ServerCounters | None:
    return server_counters(_result)


def show_counters_finding(result: ParseResult, digest: str) -> None:
    """A disagreement of the log with the server's own counters, as a finding beside the verdict."""
    c = _counters(digest, result)
    if c is not None and c.agree is False:
        st.warning(disagreement_text(c))  # the tool's words and counts only


def show_acceptance(result: ParseResult, digest: str, key: str) -> None:
    """The acceptance section of a finished log; nothing where the log has no acceptance lines."""
    acc = _acceptance(digest, result)
    if acc.empty:
        return
    st.subheader("Acceptance")
    onsets = [(f.onset_t, f"onset: {f.finding}" + (f", slot {f.slot}" if f.slot is not None else ""))
              for f in health(result) if f.onset_t is not None]
    steps = step_table(result.events)
    over_time = over_time_figure(acc, steps, onsets)
    figures = [(name, fig) for name, fig in (("time", over_time), ("position", per_position_figure(acc)),
                                             ("request", per_request_figure(acc)),
                                             ("steps", step_histogram_figure(step_histogram(result.events))))
               if fig is not None]
    for col, (name, fig) in zip(st.columns(len(figures)) if figures else [], figures, strict=True):
        with col:
            st.plotly_chart(fig, key=f"acceptance-{name}-{key}", config=_CONFIG)
    for note in acc.notes:
        st.caption(note)
    if len(acc.slots):
        st.caption("Per slot")
        st.dataframe(slot_table(acc), hide_index=True, key=f"acceptance-slots-{key}")
    if len(acc.requests) > 1:
        left, right = st.columns(2)
        left.caption(f"Lowest acceptance (of {len(acc.requests)} requests)")
        left.dataframe(request_table(acc.worst()), hide_index=True, key=f"acceptance-worst-{key}")
        right.caption("Slowest requests (first line to last)")
        right.dataframe(request_table(acc.slowest()), hide_index=True, key=f"acceptance-slowest-{key}")
