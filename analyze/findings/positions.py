"""Target and drafter stored KV positions over the log, their difference, and where they diverge.

Works on the reader's tables only (no Streamlit, no Plotly), so the dashboard, the reports and the tests
share one definition of "diverged". A context's stored position is the `find_slot` max when the log has
LLAMA_KV_CACHE_DEBUG lines for it, else the last position of each batch it decoded; a position error's X is
the stored position of the side that failed, so it is added to that side.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast

import numpy as np
import pandas as pd

from kvtrace.analyze.reader.definitions import CYCLE_BOUNDARIES
from kvtrace.analyze.reader.spec import MIRROR, OWN, keeping, upstream_drafter

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult

CONTEXTS = ("target", "drafter")
T = TypeVar("T")


def derived(result: ParseResult, key: Hashable, make: Callable[[], T]) -> T:
    """`make()`, worked out once per result and key and kept on the result (callers read it, never change it).

    A result without the cache (an object shaped like one) gets `make()` each time.
    """
    cache = getattr(result, "derived", None)
    if cache is None:
        return make()
    if key not in cache:
        cache[key] = make()
    return cast(T, cache[key])


def floats(values: pd.Series | np.ndarray) -> np.ndarray:
    """A column as float64 with NaN for missing (the tables use nullable Int64 and Arrow strings)."""
    if isinstance(values, pd.Series):
        return pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    return np.asarray(values, dtype=np.float64)


@dataclass(slots=True)
class XAxis:
    """What the horizontal axis is: the log's own timestamps, capture arrival time, or the line number."""

    kind: str  # "log_time" | "capture_time" | "line"
    title: str
    # For capture time: seconds since the first chunk, indexed by line number (1-based; [0] unused).
    line_seconds: np.ndarray | None = None
    # For log time: (line, t) pairs known from the tables, to place rows whose own t is missing.
    known: tuple[np.ndarray, np.ndarray] | None = None
    # For log time: the lines where the logger's clock restarted (a server restart inside one log) and the
    # seconds to add from each of them on, so time keeps increasing across restarts.
    restarts: tuple[np.ndarray, np.ndarray] | None = None

    def of(self, line: pd.Series | np.ndarray, t: pd.Series | np.ndarray | None = None) -> np.ndarray:
        line = np.asarray(line, dtype=np.int64)
        if self.kind == "line" or line.size == 0:
            return line.astype(np.float64)
        if self.kind == "capture_time" and self.line_seconds is not None:
            seconds: np.ndarray = self.line_seconds[np.clip(line, 0, self.line_seconds.size - 1)]
            return seconds
        values = np.full(line.size, np.nan) if t is None else floats(t).copy()
        missing = np.isnan(values)
        if self.restarts is not None and self.restarts[0].size:
            own = ~missing
            values[own] += self.restarts[1][np.searchsorted(self.restarts[0], line[own], side="right")]
        if missing.any() and self.known is not None and self.known[0].size:
            # `known` is already joined across restarts
            values[missing] = np.interp(line[missing], self.known[0], self.known[1])
        return values


def _restarts(lines: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where t goes back (by over a millisecond): the clock restarted.

    llama.cpp stamps entries in the order they are logged, so inside one process time never goes back.
    """
    drop = np.flatnonzero(ts[:-1] - ts[1:] > 1e-3) + 1
    if not drop.size:
        return np.empty(0, np.int64), np.zeros(1)
    # offsets[k] applies to lines from the k-th restart on; offsets[0] = 0 before the first one.
    add = np.concatenate([[0.0], np.cumsum(ts[drop - 1] - ts[drop])])
    return lines[drop], add


def _time_rows(result: ParseResult) -> tuple[np.ndarray, np.ndarray]:
    frames = [getattr(result, name) for name in ("batches", "kv", "errors", "events")]
    lines = np.concatenate([f["line"].to_numpy(np.int64) for f in frames if len(f)] or [np.empty(0, np.int64)])
    ts = np.concatenate([floats(f["t"]) for f in frames if len(f)] or [np.empty(0)])
    return lines, ts


def capture_time_axis(capture_line_seconds: np.ndarray | None) -> XAxis | None:
    """When each line arrived (seconds since the first chunk, indexed by line number), if that is known."""
    if capture_line_seconds is not None and capture_line_seconds.size > 1:
        return XAxis("capture_time", "capture time (s)", line_seconds=capture_line_seconds)
    return None


def choose_axis(result: ParseResult, capture_line_seconds: np.ndarray | None = None) -> XAxis:
    """Log timestamps where most rows have them, else capture time when given, else line numbers."""
    lines, ts = _time_rows(result)
    have = ~np.isnan(ts)
    if lines.size and have.mean() >= 0.5:
        order = np.argsort(lines[have], kind="stable")
        known_lines, known_t = lines[have][order], ts[have][order]
        restart_lines, offsets = _restarts(known_lines, known_t)
        joined = known_t + offsets[np.searchsorted(restart_lines, known_lines, side="right")]
        title = "log time (s)" if not restart_lines.size else f"log time (s; {restart_lines.size} restarts joined)"
        return XAxis("log_time", title, known=(known_lines, joined), restarts=(restart_lines, offsets))
    return capture_time_axis(capture_line_seconds) or XAxis("line", "log line")


def sequences(result: ParseResult) -> list[int]:
    """Every sequence id the tables mention, smallest first."""
    ids: set[int] = set()
    for name in ("batches", "kv", "errors"):
        col = getattr(result, name)["seq_id"]
        ids.update(int(v) for v in pd.to_numeric(col, errors="coerce").dropna().unique() if v >= 0)
    return sorted(ids)


def batches_per_sequence(result: ParseResult) -> dict[int, int]:
    """How many batches carried each sequence the tables mention (0 for one seen only in kv or errors)."""
    counts = dict.fromkeys(sequences(result), 0)
    b = result.batches
    if len(b):
        seq = pd.to_numeric(b["seq_id"], errors="coerce")
        per = b.assign(seq=seq)[seq >= 0].groupby("seq")["batch"].nunique()
        counts.update({int(cast(float, k)): int(v) for k, v in per.items()})
    return counts


def opening_sequence(result: ParseResult, counts: dict[int, int] | None = None) -> int | None:
    """The sequence a view opens on: the failing one, else the busiest (a server with -np auto puts its one
    client on whichever slot it picks, and its warm-up batches on sequence 0), else the smallest id.
    `counts`: `batches_per_sequence(result)`, when the caller has it already."""
    counts = batches_per_sequence(result) if counts is None else counts
    if not counts:
        return None
    failing = result.verdict.seq_id
    if failing is not None and int(failing) in counts:
        return int(failing)
    return max(counts, key=lambda s: (counts[s], -s))


def _seq_mask(frame: pd.DataFrame, seq_id: int | None) -> pd.Series:
    if seq_id is None:
        return pd.Series(True, index=frame.index)
    return pd.to_numeric(frame["seq_id"], errors="coerce") == seq_id


def stored_positions(result: ParseResult, context: str, seq_id: int | None, axis: XAxis) -> pd.DataFrame:
    """Columns line, x, pos, source ('kv', 'batch' or 'error'), sorted by line. Computed once per result,
    context, sequence and kind of axis: the chart and drafter minus target both read it (callers never change it).
    """
    return derived(result, ("stored", context, seq_id, axis.kind),
                   lambda: _stored_positions(result, context, seq_id, axis))


def _stored_positions(result: ParseResult, context: str, seq_id: int | None, axis: XAxis) -> pd.DataFrame:
    kv = result.kv
    kv = kv[(kv["context"] == context) & _seq_mask(kv, seq_id)]
    if len(kv):
        part = pd.DataFrame({"line": kv["line"], "t": kv["t"], "pos": kv["pos_max"], "source": "kv"})
    else:
        b = result.batches
        b = b[(b["context"] == context) & _seq_mask(b, seq_id) & b["ok"].astype(bool)]
        part = pd.DataFrame({"line": b["line"], "t": b["t"], "pos": b["pos_max"], "source": "batch"})
    err = result.errors
    err = err[(err["component"] == context) & _seq_mask(err, seq_id) & err["last_pos"].notna()]
    part_err = pd.DataFrame({"line": err["line"], "t": err["t"], "pos": err["last_pos"], "source": "error"})
    frames = [f for f in (part, part_err) if len(f)]
    if not frames:
        return pd.DataFrame({"line": pd.Series(dtype="int64"), "x": pd.Series(dtype="float64"),
                             "pos": pd.Series(dtype="float64"), "source": pd.Series(dtype="object")})
    out = pd.concat(frames, ignore_index=True).sort_values("line", kind="stable", ignore_index=True)
    out["pos"] = floats(out["pos"])
    out["x"] = axis.of(out["line"], out["t"])
    return out[["line", "x", "pos", "source"]]


def delta(target: pd.DataFrame, drafter: pd.DataFrame) -> pd.DataFrame:
    """At every observation of either side: the latest stored position of each, and drafter minus target.

    Columns line, x, target, drafter, delta; rows before both sides have been seen are dropped.
    """
    if not len(target) or not len(drafter):
        return pd.DataFrame(columns=["line", "x", "target", "drafter", "delta"], dtype="float64")
    both = pd.concat([target.assign(side="target"), drafter.assign(side="drafter")], ignore_index=True)
    both = both.sort_values("line", kind="stable", ignore_index=True)
    # Forward-fill each side's last value onto every row: the state of both caches at that line.
    tgt = both["pos"].where(both["side"] == "target").ffill()
    dft = both["pos"].where(both["side"] == "drafter").ffill()
    out = pd.DataFrame({"line": both["line"], "x": both["x"], "target": tgt, "drafter": dft})
    out = out.dropna(subset=["target", "drafter"])
    # Several rows on one line (a find_slot pair): keep the last state of that line.
    out = out.drop_duplicates("line", keep="last").reset_index(drop=True)
    out["delta"] = out["drafter"] - out["target"]
    return out


@dataclass(slots=True)
class Stretch:
    start_line: int
    end_line: int
    x0: float
    x1: float
    peak: float  # the largest |drafter - target| inside, with its sign


def stretches(d: pd.DataFrame, tolerance: float, min_rows: int = 2, ahead_only: bool = False) -> list[Stretch]:
    """Runs of at least `min_rows` consecutive rows where |drafter - target| > tolerance.

    One row apart is the normal hand-over between the two caches (a new request reaching one side first);
    staying apart over several observations is divergence. A stretch ends where the next in-step row
    begins (or at the last row), so the shading covers the time the two caches spent apart.
    """
    if not len(d):
        return []
    off = ((d["delta"] if ahead_only else d["delta"].abs()) > tolerance).to_numpy()
    if not off.any():
        return []
    edges = np.diff(np.concatenate([[0], off.astype(np.int8), [0]]))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)  # exclusive
    x = d["x"].to_numpy(np.float64)
    line = d["line"].to_numpy(np.int64)
    dv = d["delta"].to_numpy(np.float64)
    out = []
    for s, e in zip(starts, ends, strict=True):
        if e - s < min_rows:
            continue
        stop = min(int(e), len(d) - 1)
        seg = dv[s:e]
        peak = float(seg[np.argmax(np.abs(seg))])
        out.append(Stretch(int(line[s]), int(line[stop]), float(x[s]), float(x[stop]), peak))
    return out


def default_tolerance(result: ParseResult) -> float:
    """How far apart the caches may be inside one healthy draft/verify cycle.

    Mirror (DFlash, EAGLE3, unnamed): one draft block. While drafting, the drafter runs ahead of the target
    by at most one draft batch (its most common batch size, the draft block); after verification they are
    level again; upstream types draft token by token too (EAGLE3), so at least the draft size. Own cache
    (draft-simple): the draft size, the most tokens a verification checked less one (chain drafting decodes
    one token per batch, but runs that many ahead).
    """
    b = result.batches
    ev = result.events
    drafted = [int(n) for n in ev.loc[ev["kind"] == "accepted", "generated"].fillna(0)]
    draft_size = max(drafted, default=0)  # the server's `accepted N/M draft tokens`: M is the draft
    if keeping(result.meta) == OWN:
        if draft_size > 0:
            return float(draft_size)
        t = b[b["context"] == "target"]
        span = pd.Series(floats(t["pos_max"]) - floats(t["pos_min"]))
        span = span[(floats(t["n_outputs"]) >= 2) & span.notna().to_numpy()]
        return float(max(1.0, span.mode().max())) if len(span) else 1.0
    sizes = pd.to_numeric(b.loc[b["context"] == "drafter", "n_tokens"], errors="coerce").dropna()
    block = float(sizes.mode().max()) if len(sizes) else 1.0
    if upstream_drafter(result.meta):
        return max(block, float(draft_size))  # upstream EAGLE3 drafts token by token, up to the draft size ahead
    return block


def _batch_ends(result: ParseResult, context: str, seq_id: int | None, axis: XAxis) -> pd.DataFrame:
    """The last position each decoded batch of a context wrote (columns line, x, pos, source)."""
    b = result.batches
    b = b[(b["context"] == context) & _seq_mask(b, seq_id) & b["ok"].astype(bool)]
    out = pd.DataFrame({"line": b["line"].to_numpy(np.int64), "pos": floats(b["pos_max"]), "source": "batch"})
    out["x"] = axis.of(out["line"], b["t"])
    return out[["line", "x", "pos", "source"]]


def apart(result: ParseResult, seq_id: int | None, axis: XAxis) -> pd.DataFrame:
    """Drafter minus target where it means something for this log's speculative type (`delta`'s columns).

    Mirror: at every observation of either side. Own cache (draft-simple): where the drafter decodes, from
    the positions each side's batches reached; between its drafts the drafter's cache is its own business
    (after a new request it keeps the old one until its next draft trims it). No drafter (n-gram): empty.
    Computed once per result, sequence and kind of axis (callers read it, never change it).
    """
    return derived(result, ("apart", seq_id, axis.kind), lambda: _apart(result, seq_id, axis))


def _apart(result: ParseResult, seq_id: int | None, axis: XAxis) -> pd.DataFrame:
    keep = keeping(result.meta)
    if keep == MIRROR and upstream_drafter(result.meta):
        return _mirror_apart(result, seq_id, axis)
    if keep != OWN:
        target = stored_positions(result, "target", seq_id, axis)
        return delta(target, stored_positions(result, "drafter", seq_id, axis))
    drafter = _batch_ends(result, "drafter", seq_id, axis)
    d = delta(_batch_ends(result, "target", seq_id, axis), drafter)
    return d[d["line"].isin(drafter["line"])].reset_index(drop=True)


def _mirror_apart(result: ParseResult, seq_id: int | None, axis: XAxis) -> pd.DataFrame:
    """Upstream DFlash/EAGLE3: the positions each side's batches reached (find_slot prints the max before a
    placement, one batch behind), except in the hand-over after a new request or a reset: the target goes
    first, and the drafter mirrors it with its next batch, so nothing is judged until that batch."""
    drafter = _batch_ends(result, "drafter", seq_id, axis)
    d = delta(_batch_ends(result, "target", seq_id, axis), drafter)
    ev = result.events
    ev = ev[ev["kind"].isin(CYCLE_BOUNDARIES)]
    if seq_id is not None:
        ev = ev[pd.to_numeric(ev["seq_id"], errors="coerce").isna() | (ev["seq_id"] == seq_id)]
    bounds = np.sort(ev["line"].to_numpy(np.int64))
    d_lines = np.sort(drafter["line"].to_numpy(np.int64))
    if not len(d) or not bounds.size:
        return d
    lines = d["line"].to_numpy(np.int64)
    last_bound = bounds[np.clip(np.searchsorted(bounds, lines, side="right") - 1, 0, None)]
    has_bound = np.searchsorted(bounds, lines, side="right") > 0
    at = np.searchsorted(d_lines, lines, side="right") - 1
    last_drafter = np.where(at >= 0, d_lines[np.clip(at, 0, None)], -1)
    handing_over = has_bound & (last_bound > last_drafter)
    return d[~handing_over].reset_index(drop=True)


def apart_stretches(result: ParseResult, d: pd.DataFrame, tolerance: float) -> list[Stretch]:
    """The stretches where the two sides are apart: a drafter with its own cache may trail (it catches up
    through its own batch), so only running ahead past the draft size counts for it."""
    return stretches(d, tolerance, ahead_only=keeping(result.meta) == OWN)


@dataclass(slots=True)
class Divergence:
    """The first place the two sides disagree: from a position error (exact) or from the stored positions."""

    line: int
    x: float
    target: float | None
    drafter: float | None
    delta: float
    source: str  # "error" or "positions"
    seq_id: int | None


def first_divergence(
    result: ParseResult, seq_id: int | None, axis: XAxis, tolerance: float | None = None,
    among: list[int] | None = None,
) -> Divergence | None:
    """The first position error with both X and Y, else the start of the first divergence stretch.
    `among`: without a chosen sequence, the sequences to look in (default: every one the tables mention)."""
    err = result.errors
    err = err[_seq_mask(err, seq_id) & err["last_pos"].notna() & err["batch_start"].notna()]
    candidates: list[Divergence] = []
    if len(err):
        row = err.sort_values("line", kind="stable").iloc[0]
        x_val = float(axis.of(np.array([row["line"]]), np.array([row["t"]]))[0])
        stored, submitted = float(row["last_pos"]), float(row["batch_start"])
        drafter_side = row["component"] == "drafter"
        candidates.append(Divergence(
            int(row["line"]), x_val,
            target=None if drafter_side else stored,
            drafter=stored if drafter_side else None,
            delta=submitted - stored - 1, source="error",
            seq_id=None if pd.isna(row["seq_id"]) else int(row["seq_id"]),
        ))  # fmt: skip
    tol = default_tolerance(result) if tolerance is None else tolerance
    # without a chosen sequence, each one on its own: slots' positions are not comparable with each other
    every = sequences(result) if among is None else among
    seqs: list[int | None] = [seq_id] if seq_id is not None else [*every] or [None]
    for seq in seqs:
        d = apart(result, seq, axis)
        runs = apart_stretches(result, d, tol)
        if runs:
            first = d[d["line"] == runs[0].start_line].iloc[0]
            candidates.append(Divergence(
                int(first["line"]), float(first["x"]), float(first["target"]), float(first["drafter"]),
                float(first["delta"]), "positions", seq,
            ))  # fmt: skip
    return min(candidates, key=lambda c: c.line) if candidates else None
