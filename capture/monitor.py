"""While a capture runs: one status line that updates in place, and the triage on the first error.

The live parse reads raw.log behind the pump (never the pipe itself), in a separate process: a slow parse can
fall behind, but it never loses a byte. It holds itself to a share of one core (CPU_SHARE) at the ordinary
priority: the program being captured keeps its cores, and the live view still moves when every core is busy.
(The idle scheduling class protected the program but starved the view on a loaded machine: a server on CPU uses
every core, so the live parse never ran, and neither the TRIAGE line nor the summary came.)
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from kvtrace.analyze import LiveStats
from kvtrace.capture.process import die_with_parent
from kvtrace.capture.sink import write_all

_CLEAR = b"\r\x1b[K"
# The triage reads at most this much log before the error: enough for both contexts' batches and cache sizes
# (a real capture's 1 MB holds hundreds of cycles), and a parse of 0.07 CPU s, so that the TRIAGE line comes
# within a second or so even at a sixth of a core (4 MB took 0.2 s, 1 s of wall there)
TRIAGE_WINDOW = 1 << 20
# at the end, the live parse may finish only when this little is left: a burst it fell far behind on is not
# waited for (the wrapper returns as soon as the program is done; the summary says how much was covered)
CATCH_UP_BYTES = 4 << 20
# The live parse's share of one core at most. The stream parse reads 50-70 MB per CPU second on a real capture on a
# quiet machine, 30 with every core busy, so 0.4 of a core keeps up with 5+ MB/s with a lag of a second or so; a
# faster log makes the summary lag (it says so), not the program. Not niced: under a nice, a machine whose every
# core is busy leaves it far less than its share (0.25 of a core lagged 4-5 s behind a 6 MB/s log there).
CPU_SHARE = 0.25
_BURST_S = 0.25  # CPU seconds it may run ahead of its share (one chunk's parse, the triage's window)


class Terminal:
    """Echo of the captured bytes (stdout) and the status line (stderr), kept from garbling each other."""

    def __init__(self, *, echo: bool, status: bool, err: TextIO | None = None) -> None:
        self.echo_enabled = echo
        self.status_enabled = status
        self._err = err or sys.stderr
        self._lock = threading.Lock()
        self._status_shown = False
        self._at_line_start = True

    def echo(self, chunk: bytes) -> None:
        with self._lock:
            if self._status_shown:
                self._clear()
            write_all(1, chunk)
            self._at_line_start = chunk.endswith(b"\n")

    def _clear(self) -> None:
        self._err.flush()
        write_all(self._err.fileno(), _CLEAR)
        self._status_shown = False

    def status(self, text: str) -> None:
        if not self.status_enabled:
            return
        with self._lock:
            # Drawn only between whole lines, so it never splits a line of the program's output.
            if not self._at_line_start:
                return
            self._err.flush()
            write_all(self._err.fileno(), _CLEAR + text.encode("utf-8", "replace"))
            self._status_shown = True

    def message(self, text: str) -> None:
        with self._lock:
            if self._status_shown:
                self._clear()
            if not self._at_line_start and self.echo_enabled:
                self._err.write("\n")
                self._at_line_start = True
            self._err.write(text.rstrip("\n") + "\n")
            self._err.flush()

    def end(self) -> None:
        with self._lock:
            if self._status_shown:
                self._clear()


def status_line(stats: LiveStats, bytes_read: int) -> str:
    def pos(v: int | None) -> str:
        return "-" if v is None else str(v)

    return (
        f"kvtrace: {stats.lines:,} lines  {stats.batches:,} batches  {stats.errors} errors  "
        f"target pos {pos(stats.target_pos)}  drafter pos {pos(stats.drafter_pos)}  "
        f"({bytes_read / 1e6:,.1f} MB)"
    )


def triage_text(window: bytes, name: str) -> str:
    """The reader's verdict on the log just before (and including) the first error."""
    from kvtrace import analyze

    return _triage_lines(analyze.parse(window, name=name))


def _triage_lines(result: Any) -> str:
    verdict = result.verdict
    lines = [f"kvtrace: TRIAGE: {verdict.summary}"]
    for ev in list(getattr(verdict, "evidence", []) or [])[:6]:
        text = str(ev.get("text", "")) if isinstance(ev, dict) else str(ev)
        lines.append(f"kvtrace:   | {text[:300]}")
    return "\n".join(lines)


def _live_child() -> None:
    """Before the live parse's interpreter starts: it dies with the wrapper, ignores a terminal's Ctrl-C (which
    reaches the wrapper's whole process group; the wrapper ends the live parse itself, with the log's end, so
    that its summary covers the whole log). Its share of a core is held by `follow`. Imports nothing: it runs
    between fork and exec."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# Lines that start a failure the reader reports (analyze/reader/patterns.py), found by a byte search far ahead of the
# parse: the TRIAGE line does not wait for the parse to reach them on a machine that leaves it little CPU. A hit is
# only a hint: the triage parses the window around it and speaks only if the reader finds a failure there.
ERROR_MARKERS = (b"inconsistent sequence positions", b"failed to decode", b"failed to find a memory slot",
                 b"decode: failed", b"GGML_ASSERT")
_BLOCK_BYTES = 16384  # what follows a hit before its triage (the rest of the error block), or _BLOCK_WAIT_S
_BLOCK_WAIT_S = 0.3
WARM_AFTER_S = 1.0


class ErrorScan:
    """Scans raw.log for ERROR_MARKERS ahead of the parse (a byte search, about a thousand times cheaper)."""

    def __init__(self, raw_path: Path, start: int) -> None:
        self.f = open(raw_path, "rb")  # noqa: SIM115 - closed by `close`
        self.f.seek(start)
        self.offset = start
        self._tail = b""  # the end of the last read: a marker cut between two reads is still found
        self.hits: list[int] = []

    def advance(self) -> int | None:
        """Reads what was written since; the offset just past the first marker found, else None."""
        data = self.f.read(8 << 20)
        if not data:
            return None
        hay = self._tail + data
        base = self.offset - len(self._tail)
        self.offset += len(data)
        self._tail = hay[-64:]
        found = [i for i in (hay.find(m) for m in ERROR_MARKERS) if i >= 0]
        return base + min(found) + 1 if found else None

    def close(self) -> None:
        self.f.close()


def _triage_at(raw_path: Path, hit: int) -> str | None:
    """The triage of the window ending a block past a marker; None when the reader finds no failure there."""
    from kvtrace import analyze

    with open(raw_path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        end = min(size, hit + _BLOCK_BYTES)
        start = max(0, end - TRIAGE_WINDOW)
        f.seek(start)
        window = f.read(end - start)
    cut = window.rfind(b"\n")
    window = window[: cut + 1] if cut >= 0 else window
    if start:
        first = window.find(b"\n")
        window = window[first + 1 :] if first >= 0 else window
    try:
        result = analyze.parse(window, name=raw_path.name)
    except Exception:
        return None
    return _triage_lines(result) if len(result.errors) else None


class CpuShare:
    """Holds a process to `share` of one core: after each piece of work, sleeps off what it ran ahead."""

    def __init__(self, share: float) -> None:
        self.share = share
        self.wall0, self.cpu0 = time.monotonic(), time.process_time()

    def pace(self) -> None:
        if self.share <= 0:
            return
        ahead = (time.process_time() - self.cpu0) / self.share - (time.monotonic() - self.wall0)
        if ahead > _BURST_S / self.share:
            time.sleep(ahead - _BURST_S / self.share)

    def lift(self) -> None:
        self.share = 0.0




def follow(raw_path: Path, start: int, interval_s: float) -> None:
    """The parsing side, run as `python -m kvtrace.capture.monitor RAW START INTERVAL` at low priority: tails
    raw.log, feeds analyze.LiveParser, and reports JSON lines on stdout. Its stdin says where raw.log
    ends (`end N`); stdin closing without that means the wrapper is gone."""
    # The program being captured comes first: LiveParse starts this at a nice (_live_child), and it takes no more
    # than CPU_SHARE of a core while the program runs.
    from kvtrace.analyze import LiveParser  # the walker alone: no pandas, a quarter of the reader's start-up

    parser = LiveParser()
    share = CpuShare(CPU_SHARE)
    # The triage's first parse imports the rest of the reader (pandas: 0.5 s of CPU, 3 s or more of wall at a
    # loaded machine's share), so it is loaded before an error waits: when the parse first catches up, or
    # WARM_AFTER_S after the start when it never does (the status line comes first either way)
    warm = False
    started = time.monotonic()
    control = select.poll()
    control.register(0, select.POLLIN | select.POLLHUP)
    pending = b""
    end: int | None = None
    offset = start
    last_emit = 0.0
    error_sent = False
    error_seen = False  # the parse has reached an error: its triage follows the next read (the rest of its block)

    def emit(kind: str, **fields: Any) -> None:
        sys.stdout.write(json.dumps({"t": kind, **fields}) + "\n")
        sys.stdout.flush()

    def triage() -> None:
        nonlocal error_sent
        error_sent = True  # once: a window the reader finds no failure in is not parsed again on every read
        text = _triage_from(raw_path, offset)
        if text is not None:
            emit("error", triage=text)

    scan = ErrorScan(raw_path, start)
    hit: tuple[int, float] | None = None  # a marker found ahead of the parse, and when

    def scan_ahead() -> None:
        nonlocal hit, error_sent
        if hit is None:
            at = scan.advance()
            if at is None:
                return
            hit = (at, time.monotonic())
        at, seen = hit
        if scan.offset < at + _BLOCK_BYTES and time.monotonic() - seen < _BLOCK_WAIT_S:
            scan.advance()  # the rest of its block may still be coming
            if scan.offset < at + _BLOCK_BYTES:
                return
        hit = None
        text = _triage_at(raw_path, at)
        if text is not None:
            error_sent = True
            emit("error", triage=text)

    with open(raw_path, "rb") as f:
        f.seek(start)
        while True:
            if not error_sent:
                scan_ahead()
            data = f.read(1 << 20)
            if data:
                parser.feed(data)
                offset += len(data)
                # checked on every read, so the triage's window holds the error even while the parse catches up
                # at many MB per status interval
                if not error_sent and error_seen:
                    triage()
                elif not error_sent:
                    error_seen = parser.stats().errors > 0
                share.pace()
            if end is None and control.poll(0 if data else 50):
                chunk = os.read(0, 4096)
                if not chunk:
                    return  # the wrapper died: nobody to report to
                pending += chunk
                for line in pending.split(b"\n")[:-1]:
                    if line.startswith(b"end "):
                        end = int(line[4:])
                        # the program is done: what is left of the parse is what the wrapper waits for
                        share.lift()
                pending = pending.rsplit(b"\n", 1)[-1]
            if end is not None and offset >= end:
                break
            if not warm and (not data or time.monotonic() - started >= WARM_AFTER_S):
                warm = True
                with contextlib.suppress(Exception):
                    triage_text(b"", raw_path.name)
            now = time.monotonic()
            if now - last_emit >= interval_s or not data:
                stats = parser.stats()
                if not error_sent and stats.errors and not data:  # caught up: the log ends at the error
                    triage()
                if now - last_emit >= interval_s:
                    emit("stats", offset=offset, stats=asdict(stats))
                    last_emit = now
    stats = parser.stats()
    if not error_sent and stats.errors:
        triage()
    emit("done", offset=offset, stats=asdict(stats))


def _triage_from(raw_path: Path, offset: int) -> str | None:
    """The triage of the window ending at `offset`; None where the reader finds no failure in it (the same
    rule as the final triage: a start-up notice is none)."""
    start = max(0, offset - TRIAGE_WINDOW)
    with open(raw_path, "rb") as f:
        f.seek(start)
        window = f.read(offset - start)
    if start:  # start on a line boundary so the window does not open with half a line
        cut = window.find(b"\n")
        window = window[cut + 1 :] if cut >= 0 else window
    from kvtrace import analyze

    try:
        result = analyze.parse(window, name=raw_path.name)
    except Exception as exc:
        return f"kvtrace: a decode error was seen (triage failed: {exc})"
    return _triage_lines(result) if len(result.errors) else None


class LiveParse:
    """The wrapper's side of the live parse: starts `follow` in its own process (so parsing never competes with
    the pump for the GIL, and takes at most CPU_SHARE of a core from the server), shows what it reports."""

    def __init__(self, raw_path: Path, start_offset: int, terminal: Terminal, *, interval_s: float = 0.5) -> None:
        self.raw_path = raw_path
        self.start_offset = start_offset
        self.terminal = terminal
        self.interval_s = interval_s
        self.stats = LiveStats()
        self.offset = start_offset
        self.first_error_at: float | None = None
        self.triage_printed = ""
        self.complete = False
        self.failed: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "kvtrace.capture.monitor", str(self.raw_path), str(self.start_offset),
             str(self.interval_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_live_child,
        )
        self._reader = threading.Thread(target=self._read, name="kvtrace-live", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            kind = msg.get("t")
            if kind in ("stats", "done"):
                self.stats = LiveStats(**msg["stats"])  # what `follow` sent: the same LiveStats, as JSON
                self.offset = int(msg["offset"])
                if kind == "done":
                    self.complete = True
                else:
                    self.terminal.status(status_line(self.stats, self.offset))
            elif kind == "error" and self.first_error_at is None:
                self.first_error_at = time.time()
                self.triage_printed = str(msg.get("triage", ""))
                self.terminal.message(self.triage_printed)

    def finish(self, end_offset: int, wait_s: float, abort: Callable[[], bool] = lambda: False) -> bool:
        """Tell it where raw.log ends; wait (bounded, cut short by `abort`) for it to get there when little
        is left (CATCH_UP_BYTES), else stop it where it is. True if it read everything."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            return False
        if end_offset - self.offset > CATCH_UP_BYTES:
            wait_s = 0.0
        if end_offset == self.start_offset and self.first_error_at is None:
            # Nothing was captured: nothing to wait for (it may still be importing the reader).
            proc.kill()
            proc.wait()
            self.complete = True
            return True
        with contextlib.suppress(OSError):
            proc.stdin.write(b"end %d\n" % end_offset)
            proc.stdin.flush()
        deadline = time.monotonic() + wait_s
        while proc.poll() is None and time.monotonic() < deadline and not abort():
            time.sleep(0.02)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(OSError):
            proc.stdin.close()
        if self._reader is not None:
            self._reader.join(5)
        if not self.complete:
            err = proc.stderr.read().decode("utf-8", "replace").strip() if proc.stderr else ""
            if proc.returncode not in (0, -9) and err:
                self.failed = err.splitlines()[-1][:300]
        return self.complete


if __name__ == "__main__":
    follow(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
