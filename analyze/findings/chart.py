"""The position chart's model: what the chart and the page around it show of one parse, on one x axis, for one
sequence, worked out once.

The sequences and the one a view opens on, the default tolerance, the x extent, drafter minus target, the first
divergence and the first position error. The chart (`views/figures.py`), the overview, and the dashboard's
full, live and first-open runs all read the same model, so none of them asks the position tables again; no
Plotly, no Streamlit. A model is kept on its parse (`ParseResult.derived`), one per axis kind and sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
import pandas as pd

from kvtrace.analyze.findings import positions
from kvtrace.analyze.findings.positions import Divergence, XAxis, derived

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult

T = TypeVar("T")
Opening = Literal["opening"]
OPENING: Opening = "opening"  # chart_model's seq_id: the sequence a view opens on


@dataclass(frozen=True, slots=True)
class PositionError:
    """A position error the chart points at: where it is, the side that refused its batch, X and Y."""

    line: int
    x: float  # NaN where the axis cannot place it
    component: str | None
    last_pos: float | None  # X: what the refusing side had stored
    batch_start: float | None  # Y: where the refused batch started


@dataclass(slots=True)
class _Sequences:
    """What a parse's chart knows before any sequence is picked (the same on every axis)."""

    batches: dict[int, int]  # every sequence the tables mention, smallest first: its batches
    opening: int | None
    tolerance: float
    has_positions: bool


@dataclass(slots=True)
class ChartModel:
    """What the position chart and the page around it show of one parse, on one x axis, for one sequence
    (`seq_id` None: the whole log, each sequence judged on its own). Made by `chart_model`, once per parse, axis
    kind and sequence: read it, never change it. The sequences and the tolerance are worked out with the model;
    the x extent, drafter minus target, the first divergence and the first error when first read (a first open
    draws the chart before it needs them), then kept on the parse."""

    axis: XAxis
    seq_id: int | None
    sequences: list[int]  # every sequence the tables mention, smallest first
    batches: dict[int, int]  # batches per sequence (0 for one seen only in kv or errors)
    opening: int | None  # the sequence a view opens on
    tolerance: float  # how far apart the caches may be in a healthy cycle: the default of the chart's band
    has_positions: bool  # batch spans, find_slot lines or position errors: anything to draw
    result: ParseResult = field(repr=False, compare=False)

    def _kept(self, name: str, make: Callable[[], T]) -> T:
        return derived(self.result, ("chart", name, self.axis.kind, self.seq_id), make)

    @property
    def x_extent(self) -> tuple[float, float] | None:
        """The whole log's x range on this axis (None: nothing to place), the same for every sequence."""
        return derived(self.result, ("chart", "x extent", self.axis.kind), lambda: _x_extent(self.result, self.axis))

    @property
    def apart(self) -> pd.DataFrame:
        """Drafter minus target (`positions.apart`: kept on the parse), for the delta chart and the shading."""
        return positions.apart(self.result, self.seq_id, self.axis)

    @property
    def first_divergence(self) -> Divergence | None:
        """The first divergence at the default tolerance."""
        return self._kept("first divergence", lambda: positions.first_divergence(
            self.result, self.seq_id, self.axis, self.tolerance, among=self.sequences))

    @property
    def first_error(self) -> PositionError | None:
        """The first position error (X or Y known) of the sequence, or of none in particular."""
        return self._kept("first error", lambda: _first_error(self.result, self.seq_id, self.axis))

    def divergence(self, tolerance: float) -> Divergence | None:
        """The first divergence at `tolerance`: the default's is kept, another (a user's own band) is worked out."""
        if tolerance == self.tolerance:
            return self.first_divergence
        return positions.first_divergence(self.result, self.seq_id, self.axis, tolerance, among=self.sequences)


def chart_axis(result: ParseResult, capture_line_seconds: Callable[[], np.ndarray | None] | None = None) -> XAxis:
    """The chart's x axis: the log's own timestamps, else when each line arrived (`capture_line_seconds`, asked
    only then: reading a session's arrival times costs), else line numbers. Chosen once per parse."""
    own = derived(result, ("axis",), lambda: positions.choose_axis(result))
    if own.kind != "line" or capture_line_seconds is None:
        return own
    return derived(result, ("axis", "capture_time"),
                   lambda: positions.capture_time_axis(capture_line_seconds()) or own)


def chart_model(result: ParseResult, axis: XAxis | None = None,
                seq_id: int | None | Opening = OPENING) -> ChartModel:
    """The model of `result`'s chart on `axis` (default: `chart_axis`) for `seq_id` (default: the sequence a view
    opens on; None: the whole log), worked out the first time it is asked for and kept on the result."""
    axis = axis or chart_axis(result)
    seqs = derived(result, ("chart", "sequences"), lambda: _sequences(result))
    seq = seqs.opening if isinstance(seq_id, str) else seq_id
    return derived(result, ("chart", axis.kind, seq), lambda: _model(result, axis, seq, seqs))


def _sequences(result: ParseResult) -> _Sequences:
    counts = positions.batches_per_sequence(result)
    return _Sequences(counts, positions.opening_sequence(result, counts), positions.default_tolerance(result),
                      _has_positions(result))


def _model(result: ParseResult, axis: XAxis, seq_id: int | None, seqs: _Sequences) -> ChartModel:
    return ChartModel(axis=axis, seq_id=seq_id, sequences=list(seqs.batches), batches=seqs.batches,
                      opening=seqs.opening, tolerance=seqs.tolerance, has_positions=seqs.has_positions,
                      result=result)


def _has_positions(result: ParseResult) -> bool:
    err = result.errors
    return bool(len(result.batches) or len(result.kv)
                or (len(err) and (err["last_pos"].notna() | err["batch_start"].notna()).any()))


def _x_extent(result: ParseResult, axis: XAxis) -> tuple[float, float] | None:
    """From the first to the last row of any table (whole line numbers on a line axis)."""
    xs = [axis.of(frame["line"], frame["t"]) for frame in (result.batches, result.kv, result.errors, result.events)
          if len(frame)]
    allx = np.concatenate(xs) if xs else np.empty(0)
    allx = allx[np.isfinite(allx)]
    if not allx.size:
        return None
    if axis.kind == "line":
        return float(np.floor(allx.min())), float(np.ceil(allx.max()))
    return float(allx.min()), float(allx.max())


def _first_error(result: ParseResult, seq_id: int | None, axis: XAxis) -> PositionError | None:
    err = result.errors
    err = err[err["last_pos"].notna() | err["batch_start"].notna()]
    if seq_id is not None:
        err = err[(err["seq_id"] == seq_id) | err["seq_id"].isna()]
    if not len(err):
        return None
    row = err.iloc[0]
    x = float(axis.of(err["line"].iloc[:1], err["t"].iloc[:1])[0])
    return PositionError(int(row["line"]), x, None if pd.isna(row["component"]) else str(row["component"]),
                         _known(row["last_pos"]), _known(row["batch_start"]))


def _known(value: Any) -> float | None:
    return None if pd.isna(value) else float(value)
