"""One big log on every core: cut it at input-batch dumps, parse the pieces in parallel, merge.

A piece starts at an `init: input batch info:` line: the walker handles that line the same whatever came
before it (it closes any open failure and starts a new dump), so each piece can be read on its own. The
little state that reaches across the cut (the last hint and sequence warning, the last KV-cache size) is
rebuilt by reading a short stretch before the cut first, and checked against where the piece before
ended: a piece whose start differs is read again with that state. The lines that add to the meta (devices,
model layout, contexts, flags: start-up lines, and the odd compute buffer re-reserved while serving) read
what came before, so each piece keeps them and the merge replays them onto the meta of the pieces before
it; no record depends on the meta, so a log with a start-up in every piece is still read once. What is
numbered across the whole log (batches, batch-size signatures, batch buffers, requests) is renumbered in
the merge, in the order the serial reader would have met it, so the tables come out exactly as `parse`
makes them.
"""

from __future__ import annotations

import copy
import math
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields
from multiprocessing import get_context
from pathlib import Path
from typing import BinaryIO

from kvtrace.analyze.reader.devices import Layout
from kvtrace.analyze.reader.records import KEEP_LINES_FOR, NA, Meta
from kvtrace.analyze.reader.source import Opened, iter_chunks
from kvtrace.analyze.reader.walker import Walker

WARM_BYTES = 64 << 10  # read before a cut to rebuild the hint state (hints reach back 12 lines at most)
MIN_PIECE = 8 << 20  # below this a piece is not worth a process
_BOUNDARY = b"input batch info:"
# a cut line must take the walker's input-batch path and no other (the checks in Walker.feed come first)
_NOT_ON_CUT = (b"ubatch_print:", b"find_slot: stream[", b": pos = [")
@dataclass(slots=True)
class Piece:
    start: int  # byte offset of the piece's first line
    end: int
    first_line: int  # its global line number, minus one


def cut_points(path: Path, pieces: int) -> list[Piece]:
    """Up to `pieces` ranges of about equal size, each starting at an input-batch dump."""
    size = path.stat().st_size
    starts = [0]
    with open(path, "rb") as f:
        for k in range(1, pieces):
            at = _next_boundary(f, max(starts[-1] + 1, size * k // pieces), size)
            if at is None:
                break
            if at > starts[-1]:
                starts.append(at)
        out = []
        lines = 0
        f.seek(0)
        pos = 0
        for i, s in enumerate(starts):
            while pos < s:  # count the lines before each cut (the pieces' global numbering)
                data = f.read(min(4 << 20, s - pos))
                lines += data.count(b"\n")
                pos += len(data)
            out.append(Piece(s, starts[i + 1] if i + 1 < len(starts) else size, lines))
    return out


def _next_boundary(f: BinaryIO, at: int, size: int) -> int | None:
    """Offset of the first line at or after `at` that starts an input-batch dump."""
    f.seek(at)
    pos = at
    tail = b""
    while pos < size:
        data = tail + f.read(256 << 10)
        base = pos - len(tail)
        pos += len(data) - len(tail)
        i = 0
        while (j := data.find(_BOUNDARY, i)) >= 0:
            ls = data.rfind(b"\n", 0, j) + 1
            le = data.find(b"\n", j)
            if le < 0:
                break  # the line goes on in the next read
            line = data[ls:le]
            if b"init:" in line and not any(x in line for x in _NOT_ON_CUT) and (ls > 0 or _at_line_start(f, base)):
                return base + ls
            i = le
        cut = data.rfind(b"\n")
        tail = data[cut + 1 :] if cut >= 0 else data[-(1 << 20):]
    return None


def _at_line_start(f: BinaryIO, offset: int) -> bool:
    if offset == 0:
        return True
    here = f.tell()
    f.seek(offset - 1)
    ok = f.read(1) == b"\n"
    f.seek(here)
    return ok


class _Range:
    """A file read from `start` up to `end` only."""

    def __init__(self, path: Path, start: int, end: int) -> None:
        self._f = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._f.seek(start)
        self._left = end - start

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        data = self._f.read(n)
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._f.close()


def _feed(w: Walker, path: Path, start: int, end: int) -> list[str]:
    stream = _Range(path, start, end)
    opened = Opened(stream, str(path), end - start, stream)  # type: ignore[arg-type]
    try:
        for text in iter_chunks(opened):
            w.feed_text(text)
    finally:
        stream.close()
    return opened.warnings


# what reaches across a cut; everything else the walker keeps is either per dump (reset at the cut line)
# or numbered across the log (renumbered in the merge)
# (the last hint: line, component, text; the last sequence warning: line, sequence; the last KV-cache size)
Carried = tuple[tuple[int, str, str] | None, tuple[int, int] | None, int]


def carried(w: Walker) -> Carried:
    return (w._hint, w._seq_hint, w._kv_size)  # noqa: SLF001


def _restore(w: Walker, state: Carried) -> None:
    w._hint, w._seq_hint, w._kv_size = state  # noqa: SLF001


# what the meta lines built up: the meta, and the layout and draft state that the next meta lines read
MetaState = tuple[Meta, Layout, bool]


def meta_state(w: Walker) -> MetaState:
    return w.meta, w.layout, w.draft_seen


def _set_meta_state(w: Walker, state: MetaState) -> None:
    w.meta, w.layout, w.draft_seen = state


@dataclass(slots=True)
class PieceResult:
    walker: Walker
    start_state: Carried
    end_state: Carried
    warnings: list[str]


def parse_piece(path: Path, piece: Piece, state: Carried | None = None,
                meta: MetaState | None = None) -> PieceResult:
    """Parse one piece; without `state`, rebuild it from the bytes just before the piece. `meta`: what the
    pieces before it found (devices, layout, contexts, flags...), for a piece that adds to it."""
    w = Walker()
    if piece.start > 0:
        if state is None:
            warm = max(0, piece.start - WARM_BYTES)
            with open(path, "rb") as f:
                f.seek(warm)
                head = f.read(piece.start - warm)
            skip = head.find(b"\n") + 1 if warm > 0 else 0  # from a whole line on
            w.n_lines = piece.first_line - head[skip:].count(b"\n")
            _feed(w, path, warm + skip, piece.start)
            state = carried(w)
            w = Walker()
        _restore(w, state)
        w.n_lines = piece.first_line
    if meta is not None:
        _set_meta_state(w, meta)
    else:
        w.meta_lines = []  # replayed onto the meta of the pieces before it in the merge
    start_state = carried(w)
    warnings = _feed(w, path, piece.start, piece.end)
    w.close()
    return PieceResult(w, start_state, carried(w), warnings)


def _work(args: tuple[str, Piece]) -> PieceResult:
    return parse_piece(Path(args[0]), args[1])


# runs the pieces somewhere else (a cluster's workers): map_pieces(work, args) gives work(a) for each a, in order
PieceMap = Callable[[Callable[[tuple[str, Piece]], PieceResult], list[tuple[str, Piece]]], Iterable[PieceResult]]


def split_walk(path: Path, jobs: int, piece_bytes: int | None = None,
               map_pieces: PieceMap | None = None) -> tuple[Walker, list[str]] | None:
    """The merged walker of a parallel parse, or None when the log must be read serially (too small, or
    absolute timestamps whose origin is the first one in the whole log). `map_pieces` runs the pieces
    instead of local processes."""
    size = path.stat().st_size
    n = max(1, math.ceil(size / piece_bytes)) if piece_bytes else jobs
    if piece_bytes is None and size < 2 * MIN_PIECE:
        return None
    pieces = cut_points(path, n)
    if len(pieces) < 2:
        return None
    if map_pieces is not None:
        results = list(map_pieces(_work, [(str(path), p) for p in pieces]))
    elif jobs > 1:
        # fork is quick, but forking a process that runs other threads (the dashboard's server) can hang
        ctx = get_context("fork" if hasattr(os, "fork") and threading.active_count() == 1 else "spawn")
        with ProcessPoolExecutor(min(jobs, len(pieces)), mp_context=ctx) as pool:
            results = list(pool.map(_work, [(str(path), p) for p in pieces]))
    else:
        results = [parse_piece(path, p) for p in pieces]
    if any(r.walker.first_abs_t is not None for r in results[1:]):
        return None
    out = results[0].walker
    out.meta_lines = None
    for k in range(1, len(results)):
        r = results[k]
        # a piece read from a state other than where the piece before ended is read again from the true
        # state and the meta so far (rare, and exact); else its meta lines, which read what came before (a
        # device seen again, a buffer re-reserved, a context after the draft marker), are replayed onto the
        # meta of the pieces before it: no record depends on the meta, so nothing else is read twice
        if r.start_state != results[k - 1].end_state:
            r = results[k] = parse_piece(path, pieces[k], results[k - 1].end_state, copy.deepcopy(meta_state(out)))
        _merge_into(out, r.walker)
        if r.walker.meta_lines is None:  # read again from the meta so far: its meta is the whole answer
            _set_meta_state(out, meta_state(r.walker))
        else:
            out.replay_meta(r.walker.meta_lines)
    for i, f in enumerate(out.failures):
        if i >= KEEP_LINES_FOR and f.keep_lines:
            f.keep_lines = False
            f.lines.clear()
    return out, [w for r in results for w in r.warnings]


def _merge_into(out: Walker, w: Walker) -> None:
    """Append a piece's records to `out`, renumbered as a serial read numbers them."""
    batch0 = out._n_batches  # noqa: SLF001
    req0 = out._requests  # noqa: SLF001
    sig_map: dict[int, int] = {}
    for sizes, local in w._sigs.items():  # noqa: SLF001 - first-seen order is the serial order
        sig_map[local] = out._sigs.setdefault(sizes, len(out._sigs))  # noqa: SLF001
    buf_map: dict[int, int] = {}
    for key, local in w.buffers.items():
        ptr, _, req = key.rpartition("@")
        gkey = f"{ptr}@{int(req) + req0}"
        if gkey not in out.buffers:
            out.buffers[gkey] = len(out.buffers)
            out.buffer_request.append(w.buffer_request[local] + req0)
        buf_map[local] = out.buffers[gkey]
    b, wb = out.batches, w.batches
    renumber = {"batch": lambda x: x + batch0, "sig": lambda x: sig_map.get(x, x),
                "buf": lambda x: x if x == NA else buf_map[x]}
    for col in fields(b):
        if col.name in renumber:
            getattr(b, col.name).extend(map(renumber[col.name], getattr(wb, col.name)))
        else:
            getattr(b, col.name).extend(getattr(wb, col.name))
    for col in fields(out.kv):
        getattr(out.kv, col.name).extend(getattr(w.kv, col.name))
    for f in w.failures:
        if f.batch is not None:
            f.batch += batch0
    out.failures.extend(w.failures)
    out.events.extend(w.events)
    out._n_batches += w._n_batches  # noqa: SLF001
    out._requests += w._requests  # noqa: SLF001
    out.n_lines = w.n_lines
    out.n_recognised += w.n_recognised
