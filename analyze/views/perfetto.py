"""A Chrome/Perfetto trace (JSON trace-event format) of one log, for people who live in a trace viewer.

Counter tracks "target pos" and "drafter pos" carry each context's stored KV max (one series per
sequence), instant events mark failures and resets. Timestamps are microseconds from the log's own clock
when most rows have one (rows without one are placed between their neighbours), else one microsecond per
log line. Within a track, time never goes back: a restarted clock is held at the last value seen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from kvtrace.analyze.findings.positions import choose_axis, sequences, stored_positions
from kvtrace.analyze.reader.definitions import reset_events
from kvtrace.analyze.reader.records import detail_of

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult

PID = 1
TIDS = {"target": 1, "drafter": 2, "unknown": 3}


def _ts(axis_kind: str, x: np.ndarray) -> np.ndarray:
    us = x * 1e6 if axis_kind != "line" else x.astype(np.float64)
    us = np.nan_to_num(us, nan=0.0)
    return np.maximum.accumulate(us) if us.size else us


def _opt(v: Any) -> Any:
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return None
    return int(v) if isinstance(v, (int, np.integer)) or (isinstance(v, float) and v.is_integer()) else v


def trace(result: ParseResult) -> dict[str, Any]:
    axis = choose_axis(result)
    title = f"kvtrace {Path(result.source or 'log').name}"
    events: list[dict[str, Any]] = [{"ph": "M", "pid": PID, "name": "process_name", "args": {"name": title}}]
    events += [{"ph": "M", "pid": PID, "tid": tid, "name": "thread_name", "args": {"name": ctx}}
               for ctx, tid in TIDS.items()]
    seqs: list[int | None] = [*sequences(result)] or [None]
    for ctx in ("target", "drafter"):
        frames = []
        for seq in seqs:
            f = stored_positions(result, ctx, seq if len(seqs) > 1 else None, axis)
            frames.append(f.assign(series=f"seq {seq if seq is not None else 0}"))
        rows = pd.concat(frames, ignore_index=True).sort_values(["line"], kind="stable", ignore_index=True)
        ts = _ts(axis.kind, rows["x"].to_numpy(np.float64))
        for t, pos, series in zip(ts, rows["pos"], rows["series"], strict=True):
            if pd.isna(pos):
                continue
            events.append({"ph": "C", "pid": PID, "name": f"{ctx} pos", "ts": float(t),
                           "args": {series: float(pos)}, "cat": "kv"})
    marks = []
    row: Any  # itertuples rows are namedtuples built at run time
    err = result.errors
    for row in err.itertuples():
        marks.append((int(row.line), row.t, str(row.component), f"{row.kind}: {row.variant}", {
            "line": int(row.line), "seq_id": _opt(row.seq_id), "X": _opt(row.last_pos), "Y": _opt(row.batch_start),
            "ret": _opt(row.ret), "component": str(row.component)}))
    ev = result.events
    for row in reset_events(ev).itertuples():
        ctx = str(row.context) if str(row.context) in TIDS else "unknown"
        marks.append((int(row.line), row.t, ctx, str(row.kind), {
            "line": int(row.line), "seq_id": _opt(row.seq_id), "pos": _opt(row.pos), "detail": detail_of(row.detail)}))
    marks.sort(key=lambda m: m[0])
    if marks:
        x = axis.of(np.array([m[0] for m in marks]), np.array([np.nan if m[1] is None else m[1] for m in marks],
                                                             dtype=np.float64))
        ts = _ts(axis.kind, x)
        for t, (_, _, ctx, name, args) in zip(ts, marks, strict=True):
            events.append({"ph": "i", "pid": PID, "tid": TIDS.get(ctx, TIDS["unknown"]), "name": name,
                           "ts": float(t), "s": "t", "cat": "failure" if ":" in name else "reset", "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"tool": "kvtrace", "clock": axis.kind, "verdict": result.verdict.kind}}


def write_trace(result: ParseResult, out: Path) -> int:
    """Write the trace; returns the number of trace events."""
    data = trace(result)
    Path(out).write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")
    return len(data["traceEvents"])
