"""Figures from real logs and from mutated real logs: never an exception, errors always drawn exactly, and
what each trace holds (names, points, x and y) checked against the tables and the engine's ground truth."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.io as pio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtrace import analyze
from kvtrace.analyze.findings.health import health
from kvtrace.analyze.findings.overview import overview
from kvtrace.analyze.findings.positions import (
    apart,
    apart_stretches,
    choose_axis,
    default_tolerance,
    floats,
    stored_positions,
)
from kvtrace.analyze.reader.definitions import reset_events
from kvtrace.analyze.views.figures import acceptance_figure, compare_figure, delta_figure, position_figure
from kvtrace.analyze.views.perfetto import trace
from tests.analyze.reader.formats import batch_dump, find_slot

ROOT = Path(__file__).resolve().parents[3]
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


STALE = ROOT / "samples" / "stale-drafter"


def _spec(fig) -> dict:  # noqa: ANN001
    return json.loads(pio.to_json(fig, validate=False))


def _xy(trace: dict) -> tuple[np.ndarray, np.ndarray]:
    return _decode(trace["x"]), _decode(trace["y"])


def _triples(values: np.ndarray) -> np.ndarray:
    """A segments trace (a, b, NaN, a, b, NaN, ...) as rows (a, b), its NaN separators checked."""
    assert values.size % 3 == 0 and np.isnan(values[2::3]).all()
    return np.stack([values[0::3], values[1::3]], axis=1)


def test_the_position_figure_draws_each_trace_from_the_tables() -> None:
    result = analyze.parse(STALE)
    truth = pd.read_parquet(STALE / "ground_truth.parquet")
    axis = choose_axis(result)
    tol = default_tolerance(result)
    spec = _spec(position_figure(result, seq_id=0))
    traces = {d["name"]: d for d in spec["data"]}
    n_requests = int(((result.events["kind"] == "new_prompt") & (result.events["seq_id"] == 0)).sum())
    # the drafter's cache stuck before its refusals: the health finding's onset is marked too (issue 37)
    stuck = [f for f in health(result) if f.finding == "drafter_stale"]
    assert list(traces) == ["target batch span", "target", "drafter batch span", "drafter",
                            "position error (X to Y)", f"drafter and target apart (> {tol:g})",
                            f"requests ({n_requests}; every other one shaded)", "reset",
                            f"onset: drafter_stale, slot 0 (line {stuck[0].onset_line})"]
    assert tol == 4  # the sample's draft block: a 3-token draft plus the token it starts from

    # Stored max per side: every point of the derivation (a small log is never downsampled), in order.
    for side in ("target", "drafter"):
        want = stored_positions(result, side, 0, axis)
        x, y = _xy(traces[side])
        np.testing.assert_array_equal(x, want["x"].to_numpy(float))
        np.testing.assert_array_equal(y, want["pos"].to_numpy(float))
        np.testing.assert_array_equal(_decode(traces[side]["customdata"]), want["line"].to_numpy())

    # Batch spans: one vertical segment per decode of that side, from its first to its last position, as the
    # engine's API decoded them (the ground truth, not the reader's tables).
    for side in ("target", "drafter"):
        x, y = _xy(traces[f"{side} batch span"])
        spans = _triples(y)
        xs = _triples(x)
        assert (xs[:, 0] == xs[:, 1]).all()  # vertical
        decoded = truth[truth["context"] == side]
        assert len(spans) == len(decoded)
        assert sorted(map(tuple, spans.tolist())) == sorted(zip(decoded["pos_min"].astype(float),
                                                                decoded["pos_max"].astype(float), strict=True))

    # Position errors: from X (the drafter's stored max, per the API) to Y (the refused batch's start).
    x, y = _xy(traces["position error (X to Y)"])
    failed = truth[truth["ret"] != 0]
    assert sorted(map(tuple, _triples(y).tolist())) == sorted(
        zip(failed["drafter_kv_max"].astype(float), failed["pos_min"].astype(float), strict=True))
    errors = result.errors
    np.testing.assert_array_equal(_triples(x)[:, 0], axis.of(errors["line"], errors["t"]))

    # Every drawn position lies inside the y extent the resets and the shading span.
    drawn = np.concatenate([_xy(traces[n])[1] for n in ("target", "drafter", "target batch span",
                                                        "drafter batch span", "position error (X to Y)")])
    lo, hi = np.nanmin(drawn), np.nanmax(drawn)

    # Resets: one dotted vertical line per reset event, at its place on the axis, spanning everything drawn.
    resets = reset_events(result.events)
    x, y = _xy(traces["reset"])
    assert len(resets) == 3
    np.testing.assert_array_equal(_triples(x)[:, 0], axis.of(resets["line"], resets["t"]))
    assert (_triples(y)[:, 0] < lo).all() and (_triples(y)[:, 1] > hi).all()

    # The divergence band: one closed rectangle per stretch the drafter and target are apart by more than tol.
    runs = apart_stretches(result, apart(result, 0, axis), tol)
    assert len(runs) == 1
    x, y = _xy(traces[f"drafter and target apart (> {tol:g})"])
    assert traces[f"drafter and target apart (> {tol:g})"]["fill"] == "toself"
    np.testing.assert_array_equal(x[:5], [runs[0].x0, runs[0].x1, runs[0].x1, runs[0].x0, runs[0].x0])
    assert y[0] == y[1] == y[4] < lo and y[2] == y[3] > hi and np.isnan(x[5]) and np.isnan(y[5])


def test_a_chosen_tolerance_moves_the_band_in_both_figures() -> None:
    result = analyze.parse(STALE)
    axis = choose_axis(result)
    for tol in (2.0, 9.0):
        traces = {d["name"]: d for d in _spec(position_figure(result, seq_id=0, tolerance=tol))["data"]}
        runs = apart_stretches(result, apart(result, 0, axis), tol)
        band = traces.get(f"drafter and target apart (> {tol:g})")
        if runs:
            assert band is not None and np.isfinite(_decode(band["x"])).sum() >= 5 * len(runs) - 5
        else:
            assert band is None
        shapes = _spec(delta_figure(result, seq_id=0, tolerance=tol))["layout"]["shapes"]
        assert [(s["type"], s["y0"], s["y1"]) for s in shapes] == [("rect", -tol, tol), ("line", 0, 0)]
    # the stale drafter stays 9 to 13 positions behind: apart at 2, never by more than 13
    assert apart_stretches(result, apart(result, 0, axis), 2.0)
    assert not apart_stretches(result, apart(result, 0, axis), 13.0)


def test_the_delta_figure_is_drafter_minus_target() -> None:
    result = analyze.parse(STALE)
    axis = choose_axis(result)
    d = apart(result, 0, axis)
    spec = _spec(delta_figure(result, seq_id=0))
    assert [t["name"] for t in spec["data"]] == ["drafter minus target"]
    x, y = _xy(spec["data"][0])
    np.testing.assert_array_equal(x, d["x"].to_numpy(float))
    np.testing.assert_array_equal(y, d["delta"].to_numpy(float))
    # the stale drafter's widest gap as the log shows it (the stored max before each batch; the API's caches,
    # read after each call, were one further apart at the last refused batch: -13)
    assert y.min() == -12 == min(r.peak for r in apart_stretches(result, d, default_tolerance(result)))


def test_the_acceptance_figure_counts_the_cycles() -> None:
    result = analyze.parse(STALE)
    cycles = result.events[result.events["kind"] == "accepted"]
    spec = _spec(acceptance_figure(result))
    bars = spec["data"][0]
    x, y = _xy(bars)
    counts = floats(cycles["accepted"]).astype(int)
    np.testing.assert_array_equal(x, np.unique(counts))
    np.testing.assert_array_equal(y, [int((counts == v).sum()) for v in np.unique(counts)])
    rate = floats(cycles["accepted"]).sum() / floats(cycles["generated"]).sum()
    assert spec["layout"]["title"]["text"] == f"accepted draft tokens per cycle ({len(cycles)} cycles, {rate:.1%} accepted)"
    assert (len(cycles), x.tolist(), y.tolist()) == (5, [0.0, 1.0], [4.0, 1.0])


def test_downsampling_keeps_each_traces_extremes_within_its_budget() -> None:
    result = analyze.parse(STALE)
    axis = choose_axis(result)
    traces = {d["name"]: d for d in _spec(position_figure(result, seq_id=0, max_points=6))["data"]}
    for side in ("target", "drafter"):
        full = stored_positions(result, side, 0, axis)["pos"].to_numpy(float)
        _, y = _xy(traces[side])
        assert len(full) > 6 >= len(y)
        assert y.max() == full.max() and y.min() == full.min() and y[0] == full[0] and y[-1] == full[-1]
    # errors and resets are never downsampled
    assert len(_triples(_xy(traces["position error (X to Y)"])[1])) == len(result.errors) == 15
    assert len(_triples(_xy(traces["reset"])[1])) == 3


def test_the_gap_view_of_a_long_real_run_is_an_envelope_under_the_band() -> None:
    """The real 2-slot b11434 capture: too many points for a readable step line, so the range per time bucket
    is drawn, the tolerance band sits above it, and the buckets outside the band are marked; zoomed in far
    enough, the step line again."""
    from kvtrace.analyze.findings.positions import apart, choose_axis, default_tolerance
    from kvtrace.analyze.views.figures import ENVELOPE_ABOVE

    result = analyze.parse(ROOT / "tests" / "fixtures" / "server" / "b11434-draft-simple-2slots-head.log.gz")
    axis = choose_axis(result)
    d = apart(result, 0, axis)
    assert len(d) > ENVELOPE_ABOVE  # what the test is about
    fig = delta_figure(result, seq_id=0, axis=axis)
    names = [t.name for t in fig.data]
    assert "drafter minus target (range per time bucket)" in names and "drafter minus target" not in names
    band = [s for s in fig.layout.shapes if s.type == "rect"]
    tol = default_tolerance(result)
    assert len(band) == 1 and band[0].layer == "above" and (band[0].y0, band[0].y1) == (-tol, tol)
    env = next(t for t in fig.data if t.name.startswith("drafter minus target (range"))
    top = next(t for t in fig.data if t.name == "envelope max")
    lo, hi = np.asarray(env.y, float), np.asarray(top.y, float)
    assert (lo <= hi).all() and lo.min() == d["delta"].min() and hi.max() == d["delta"].max()
    outside = [t for t in fig.data if t.name == "outside the band"]
    n_out = int(((hi > tol) | (lo < -tol)).sum())
    assert (len(outside[0].x) if outside else 0) == n_out
    # zoomed into a stretch of fewer points than the threshold: the raw step line
    x = d["x"].to_numpy(float)
    zoom = (float(x[10]), float(x[10 + ENVELOPE_ABOVE // 2]))
    zoomed = delta_figure(result, seq_id=0, axis=axis, x_range=zoom)
    assert [t.name for t in zoomed.data] == ["drafter minus target"]


def test_the_requests_of_a_sequence_can_be_told_apart() -> None:
    """Each request of a slot spans its `new prompt` line to its `stop processing`; every other one is shaded."""
    from kvtrace.analyze.findings.positions import choose_axis
    from kvtrace.analyze.views.figures import request_spans

    result = analyze.parse(ROOT / "samples" / "stale-drafter")
    axis = choose_axis(result)
    ev = result.events
    prompts = ev[(ev["kind"] == "new_prompt") & (ev["seq_id"] == 0)]
    x0, x1 = request_spans(result, 0, axis)
    assert len(x0) == len(prompts) >= 2 and (x0 < x1).all() and (x1[:-1] <= x0[1:]).all()
    fig = position_figure(result, seq_id=0, axis=axis)
    band = next(t for t in fig.data if t.name and t.name.startswith("requests ("))
    assert band.name == f"requests ({len(x0)}; every other one shaded)"
    xs = np.asarray(band.x, float)
    shaded = [(xs[i], xs[i + 1]) for i in range(0, xs.size, 6)]
    assert shaded == [(x0[i], x1[i]) for i in range(1, len(x0), 2)]
    assert not any(t.name and t.name.startswith("requests (") for t in position_figure(result, axis=axis).data)
