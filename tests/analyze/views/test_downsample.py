"""The downsampler keeps every bucket's extremes and every marked point, and stays small."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from kvtrace.analyze.views.downsample import downsample, minmax_indices

positions = arrays(
    np.float64,
    st.integers(0, 5000),
    elements=st.one_of(st.floats(-1, 1e6, allow_nan=False), st.just(np.nan)),
)


@settings(max_examples=200, deadline=None)
@given(y=positions, max_points=st.integers(2, 400), data=st.data())
def test_minmax_keeps_extremes_and_markers(y: np.ndarray, max_points: int, data: st.DataObject) -> None:
    n = y.size
    keep = np.array(data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=20) if n else st.just([])))
    idx = minmax_indices(y, max_points, keep)
    assert np.all(np.diff(idx) > 0), "sorted and unique"
    assert set(keep.tolist()) <= set(idx.tolist())
    if n > max_points:
        assert idx.size <= max(max_points, 4) + len(set(keep.tolist()))
    finite = ~np.isnan(y)
    if finite.any():
        kept = y[idx]
        assert np.nanmin(kept) == np.nanmin(y)
        assert np.nanmax(kept) == np.nanmax(y)


def test_drop_in_a_long_trace_survives() -> None:
    # A million-point climbing target with one reset to 0 in the middle: the reset must still show.
    y = np.arange(1_000_000, dtype=np.float64)
    y[654_321] = 0.0
    x = np.arange(y.size) * 0.01
    xs, ys = downsample(x, y, 3000)
    assert xs.size <= 3000
    assert 0.0 in ys[1:]
    assert x[654_321] in xs
    assert ys[-1] == y[-1]


def test_short_trace_is_untouched() -> None:
    x = np.array([1.0, 2.0, 3.0])
    y = np.array([5.0, np.nan, 7.0])
    xs, ys = downsample(x, y, 10)
    np.testing.assert_array_equal(xs, x)
    np.testing.assert_array_equal(ys, y)


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError):
        downsample(np.arange(3), np.arange(4))
