"""The chart's model says what positions.py says, worked out once and kept on the parse."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvtrace import analyze
from kvtrace.analyze.findings import positions
from kvtrace.analyze.findings.chart import chart_axis, chart_model
from kvtrace.analyze.findings.overview import overview

ROOT = Path(__file__).resolve().parents[3]
TWO_SLOTS = ROOT / "tests" / "fixtures" / "server" / "b11434-draft-simple-2slots-head.log.gz"
STALE = ROOT / "samples" / "stale-drafter"
NO_ROLLBACK = ROOT / "samples" / "no-rollback"


def test_the_model_agrees_with_the_position_tables() -> None:
    result = analyze.parse(STALE)
    model = chart_model(result)
    axis = positions.choose_axis(result)
    assert model.axis.kind == axis.kind == "log_time"
    assert model.sequences == positions.sequences(result) == [0]
    assert model.opening == positions.opening_sequence(result) == model.seq_id == 0
    assert model.batches == positions.batches_per_sequence(result)
    assert model.tolerance == positions.default_tolerance(result)
    assert model.first_divergence == positions.first_divergence(result, 0, axis)
    assert model.first_divergence is not None and model.first_divergence.source == "error"
    pos_err = result.errors[result.errors["last_pos"].notna() | result.errors["batch_start"].notna()]
    first = model.first_error
    assert first is not None and first.line == int(pos_err["line"].iloc[0])
    assert (first.last_pos, first.batch_start) == (float(pos_err["last_pos"].iloc[0]),
                                                   float(pos_err["batch_start"].iloc[0]))
    lo, hi = model.x_extent or (np.nan, np.nan)
    xs = axis.of(result.batches["line"], result.batches["t"])
    assert lo <= np.nanmin(xs) and np.nanmax(xs) <= hi
    # a band of the user's own is worked out again, at that band
    assert model.divergence(0.0) == positions.first_divergence(result, 0, axis, 0.0)


def test_one_model_per_parse_axis_and_sequence() -> None:
    result = analyze.parse(TWO_SLOTS)
    opening = chart_model(result)
    assert opening is chart_model(result, chart_axis(result))  # kept on the parse
    assert opening.sequences == [0, 1] and opening.seq_id == opening.opening
    other = chart_model(result, seq_id=1 - (opening.opening or 0))
    assert other is not opening and other.seq_id != opening.seq_id
    whole = chart_model(result, seq_id=None)
    assert whole.seq_id is None and whole.first_divergence == positions.first_divergence(result, None, whole.axis)
    again = analyze.parse(TWO_SLOTS)
    assert chart_model(again) is not opening  # another parse: its own model


def test_the_overview_reads_the_axis_it_is_given() -> None:
    """No timestamps: the chart may read when each line arrived; the overview's first divergence is then on
    that axis, at the same line."""
    result = analyze.parse(NO_ROLLBACK)
    line_axis = chart_axis(result)
    assert line_axis.kind == "line"
    seconds = np.linspace(0.0, 2.0, result.lines + 1)
    arrived = chart_axis(result, lambda: seconds)
    assert arrived.kind == "capture_time"
    on_line, on_arrival = overview(result, line_axis), overview(result, arrived)
    assert on_line.first_divergence is not None and on_arrival.first_divergence is not None
    assert on_line.first_divergence.line == on_arrival.first_divergence.line
    assert on_arrival.first_divergence.x == float(seconds[on_arrival.first_divergence.line])
    assert on_arrival.first_divergence == chart_model(result, arrived, seq_id=0).first_divergence


def test_arrival_times_are_read_only_without_the_logs_own_clock() -> None:
    asked: list[int] = []

    def seconds() -> np.ndarray:
        asked.append(1)
        return np.linspace(0.0, 1.0, 10)

    assert chart_axis(analyze.parse(STALE), seconds).kind == "log_time"
    assert not asked
