"""Figures from real logs and from mutated real logs: never an exception, errors always drawn exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import plotly.io as pio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import analyze
from analyze.overview import overview
from analyze.positions import floats
from analyze.views.figures import acceptance_figure, compare_figure, delta_figure, position_figure
from analyze.views.perfetto import trace
from tests.analyze.formats import batch_dump, find_slot

ROOT = Path(__file__).resolve().parents[2]
LINES = (ROOT / "samples" / "stale-drafter" / "raw.log").read_bytes().split(b"\n")
HEALTHY = ROOT / "samples" / "healthy"


def _trace(fig, name: str) -> dict | None:  # noqa: ANN001
    spec = json.loads(pio.to_json(fig, validate=False))
    return next((d for d in spec["data"] if d.get("name") == name), None)


def _decode(value: object) -> np.ndarray:
    if isinstance(value, dict):
        import base64

        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
    return np.array([np.nan if v is None else v for v in (value or [])], dtype=float)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.tuples(st.integers(0, len(LINES) - 1), st.integers(0, 80)), max_size=6),
       dup=st.integers(0, len(LINES) - 1), max_points=st.integers(4, 300))
def test_mutated_engine_log_always_draws(cuts: list[tuple[int, int]], dup: int, max_points: int) -> None:
    lines = list(LINES)
    for start, n in cuts:  # drop stretches of lines, as a paste or a lost chunk would
        del lines[start : start + n]
    lines[dup:dup] = lines[dup : dup + 40]  # and repeat a stretch
    result = analyze.parse(b"\n".join(lines))
    fig = position_figure(result, seq_id=0, max_points=max_points)
    delta_figure(result, seq_id=0, max_points=max_points)
    acceptance_figure(result)
    err = result.errors
    err = err[err["last_pos"].notna() & err["batch_start"].notna() & (err["seq_id"] == 0)]
    trace = _trace(fig, "position error (X to Y)")
    if not len(err):
        assert trace is None
        return
    y = _decode(trace["y"])
    drawn = sorted(zip(y[0::3].tolist(), y[1::3].tolist(), strict=True))
    assert drawn == sorted(zip(floats(err["last_pos"]).tolist(), floats(err["batch_start"]).tolist(), strict=True))


def test_compare_puts_both_sources_on_one_position_axis() -> None:
    a = analyze.parse(ROOT / "samples" / "stale-drafter")
    b = analyze.parse(HEALTHY)
    fig = compare_figure(a, b, names=("before <fix>", "after"), seq_id=0)
    spec = json.loads(pio.to_json(fig, validate=False))
    assert spec["layout"]["yaxis2"]["matches"] == "y"
    names = {d["name"] for d in spec["data"]}
    assert {"target (A)", "drafter (A)", "target (B)", "drafter (B)", "position error (X to Y) (A)"} <= names
    # Names are shown as text, never as markup.
    titles = [ann["text"] for ann in spec["layout"]["annotations"]]
    assert "before &lt;fix&gt;" in titles


def test_zoomed_range_keeps_only_what_is_inside() -> None:
    result = analyze.parse(ROOT / "samples" / "no-rollback")  # no timestamps: x is the line number
    fig = position_figure(result, seq_id=0, x_range=(1000, 1400))
    for d in json.loads(pio.to_json(fig, validate=False))["data"]:
        if d["name"].startswith("drafter and target apart") or d["name"] == "reset":
            continue
        x = _decode(d["x"])
        x = x[~np.isnan(x)]
        assert ((x >= 1000) & (x <= 1400)).all(), d["name"]


def _reset_markers(fig) -> int:  # noqa: ANN001
    trace = _trace(fig, "reset")
    return 0 if trace is None else len(set(_decode(trace["customdata"]).tolist()))


@pytest.mark.parametrize("sample", ["stale-drafter", "healthy", "no-rollback"])
def test_the_overview_reset_count_is_the_resets_the_chart_draws(sample: str) -> None:
    result = analyze.parse(ROOT / "samples" / sample)  # real engine sessions: the server's seq_rm lines
    n = overview(result).n_resets
    assert n == result.verdict.n_resets == _reset_markers(position_figure(result))
    trace_resets = [e for e in trace(result)["traceEvents"] if e.get("ph") == "i" and e.get("cat") == "reset"]
    assert len(trace_resets) == n
    if sample == "stale-drafter":
        assert n == 3  # one per request: the resets that leave the drafter behind


def test_a_stored_max_that_drops_is_counted_and_drawn_as_a_reset() -> None:
    lines: list[str] = []
    for pos in (100, 200, 300):
        lines += batch_dump("", pos, 1, 1) + find_slot("", 4096, 0, pos - 1, pos)
    lines += batch_dump("", 0, 1, 1) + find_slot("", 4096, -1, -1, 0)
    result = analyze.parse("\n".join(lines).encode())
    assert list(result.events.kind) == ["kv_drop"]
    assert overview(result).n_resets == _reset_markers(position_figure(result)) == 1


def test_compare_draws_each_sides_resets() -> None:
    a = analyze.parse(ROOT / "samples" / "stale-drafter")
    b = analyze.parse(HEALTHY)
    fig = compare_figure(a, b, names=("before", "after"), seq_id=0)
    for side, result in (("A", a), ("B", b)):
        trace = _trace(fig, f"reset ({side})")
        assert trace is not None, side
        n = overview(result).n_resets
        assert n > 0 and len(_decode(trace["y"])) == 3 * n
        assert trace["xaxis"] == ("x" if side == "A" else "x2")
    # Both sides' resets span the shared position axis: from below the lowest to above the highest drawn.
    ys = np.concatenate([_decode(_trace(fig, f"reset ({s})")["y"]) for s in "AB"])
    assert np.nanmin(ys) <= 0 and np.nanmax(ys) >= max(a.batches["pos_max"].max(), b.batches["pos_max"].max())
