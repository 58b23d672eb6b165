"""Shrink a position trace to a few thousand points without hiding what matters.

Streamlit sends no zoom events back, so the server decides what the browser draws. Min-max bucketing
keeps each bucket's lowest and highest point, so a spike (a drafter stuck far below the target) or a
drop (a reset) survives at any zoom; indices the caller marks as `keep` (errors, resets) are always
kept exactly.
"""

from __future__ import annotations

import numpy as np

DEFAULT_MAX_POINTS = 4000


def minmax_indices(
    y: np.ndarray, max_points: int = DEFAULT_MAX_POINTS, keep: np.ndarray | None = None
) -> np.ndarray:
    """Sorted unique indices into `y` to draw: first, last, each bucket's min and max, and `keep`.

    NaN values never count as a bucket's min or max (a bucket of NaN only contributes nothing).
    The result has at most max(`max_points`, 4) + len(keep) entries.
    """
    y = np.asarray(y, dtype=np.float64)
    n = y.size
    extra = _keep_indices(keep, n)
    max_points = max(max_points, 4)  # two ends plus one bucket's min and max
    if n <= max_points:
        return np.union1d(np.arange(n), extra).astype(np.int64)
    # Two points (min and max) per bucket, plus the two ends.
    n_buckets = max(1, (max_points - 2) // 2)
    size = -(-n // n_buckets)  # ceil: every index falls in some bucket
    n_full = n // size
    picks: list[np.ndarray] = [np.array([0, n - 1], dtype=np.int64), extra]
    if n_full:
        picks.append(_bucket_extremes(y[: n_full * size].reshape(n_full, size), 0))
    if n_full * size < n:
        picks.append(_bucket_extremes(y[n_full * size :].reshape(1, -1), n_full * size))
    idx = np.unique(np.concatenate(picks))
    kept: np.ndarray = idx[~np.isnan(y[idx]) | np.isin(idx, extra)]
    return kept


def _bucket_extremes(block: np.ndarray, offset: int) -> np.ndarray:
    valid = ~np.isnan(block)
    has = valid.any(axis=1)
    lo = np.where(valid, block, np.inf).argmin(axis=1)
    hi = np.where(valid, block, -np.inf).argmax(axis=1)
    starts = offset + np.arange(block.shape[0], dtype=np.int64) * block.shape[1]
    return np.concatenate([(starts + lo)[has], (starts + hi)[has]]).astype(np.int64)


def _keep_indices(keep: np.ndarray | None, n: int) -> np.ndarray:
    if keep is None:
        return np.empty(0, dtype=np.int64)
    keep = np.asarray(keep)
    if keep.dtype == bool:
        keep = np.flatnonzero(keep)
    keep = keep.astype(np.int64, copy=False)
    return np.unique(keep[(keep >= 0) & (keep < n)])


def downsample(
    x: np.ndarray, y: np.ndarray, max_points: int = DEFAULT_MAX_POINTS, keep: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) reduced to the points `minmax_indices` picks, in their original order."""
    x = np.asarray(x)
    y = np.asarray(y)
    if x.shape != y.shape:
        raise ValueError(f"x and y differ in shape: {x.shape} vs {y.shape}")
    idx = minmax_indices(y, max_points, keep)
    return x[idx], y[idx]


def envelope(x: np.ndarray, y: np.ndarray, buckets: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per bucket of equal x width: (x start, x end, min y, max y), empty buckets left out. NaN y is ignored."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if not x.size:
        empty = np.array([], dtype=float)
        return empty, empty, empty, empty
    lo_x, hi_x = float(x.min()), float(x.max())
    edges = np.linspace(lo_x, hi_x if hi_x > lo_x else lo_x + 1.0, buckets + 1)
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, buckets - 1)
    order = np.argsort(which, kind="stable")
    which, ys = which[order], y[order]
    starts = np.flatnonzero(np.r_[True, which[1:] != which[:-1]])
    used = which[starts]
    return edges[used], edges[used + 1], np.minimum.reduceat(ys, starts), np.maximum.reduceat(ys, starts)
