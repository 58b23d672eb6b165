"""While a capture runs: one status line that updates in place, and the triage on the first position error.

The monitor reads raw.log behind the pump (never the pipe itself), so a slow parse can fall behind but
can never slow the program being captured or lose a byte.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from capture.sink import write_all

_CLEAR = b"\r\x1b[K"
TRIAGE_WINDOW = 4 << 20  # the triage reads at most this much log before the error


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


@dataclass(slots=True)
class LiveStats:
    lines: int = 0
    batches: int = 0
    errors: int = 0
    target_pos: int | None = None
    drafter_pos: int | None = None

    def line(self, bytes_read: int) -> str:
        def pos(v: int | None) -> str:
            return "-" if v is None else str(v)

        return (
            f"kvtrace: {self.lines:,} lines  {self.batches:,} batches  {self.errors} errors  "
            f"target pos {pos(self.target_pos)}  drafter pos {pos(self.drafter_pos)}  "
            f"({bytes_read / 1e6:,.1f} MB)"
        )


def _get(stats: Any, *names: str) -> Any:
    for name in names:
        if isinstance(stats, dict) and name in stats:
            return stats[name]
        if hasattr(stats, name):
            return getattr(stats, name)
    return None


def to_live_stats(stats: Any) -> LiveStats:
    """Read analyze.StreamParser.stats() whatever its container (dict or dataclass)."""

    def num(*names: str) -> int | None:
        v = _get(stats, *names)
        try:
            return None if v is None else int(v)
        except (TypeError, ValueError):
            return None

    return LiveStats(
        lines=num("lines") or 0,
        batches=num("batches") or 0,
        errors=num("errors", "n_errors") or 0,
        target_pos=num("target_pos", "latest_target_pos", "target_pos_max"),
        drafter_pos=num("drafter_pos", "latest_drafter_pos", "drafter_pos_max"),
    )


def triage_text(window: bytes, name: str) -> str:
    """The reader's verdict on the log just before (and including) the first error."""
    import analyze

    result = analyze.parse(window, name=name)
    verdict = result.verdict
    lines = [f"kvtrace: TRIAGE: {verdict.summary}"]
    for ev in list(getattr(verdict, "evidence", []) or [])[:6]:
        text = str(ev.get("text", "")) if isinstance(ev, dict) else str(ev)
        lines.append(f"kvtrace:   | {text[:300]}")
    return "\n".join(lines)


class Monitor(threading.Thread):
    """Follows raw.log as the pump writes it; feeds analyze.StreamParser."""

    def __init__(
        self,
        raw_path: Path,
        written: Callable[[], int],
        terminal: Terminal,
        *,
        start_offset: int = 0,
        interval_s: float = 0.5,
        triage: bool = True,
    ) -> None:
        super().__init__(name="kvtrace-monitor", daemon=True)
        from analyze import StreamParser

        self.parser = StreamParser()
        self.raw_path = raw_path
        self.written = written
        self.terminal = terminal
        self.offset = start_offset
        self.interval_s = interval_s
        self.triage = triage
        self.stats = LiveStats()
        self.first_error_at: float | None = None
        self.triage_printed = ""
        self._stop_when_caught_up = threading.Event()
        self._abandon = threading.Event()
        self.failed: str | None = None

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # a parse bug must not end the capture; raw.log is what counts
            self.failed = f"{type(exc).__name__}: {exc}"
            self.terminal.message(f"kvtrace: live parsing stopped ({self.failed}); the capture goes on")

    def _run(self) -> None:
        last_draw = 0.0
        with open(self.raw_path, "rb") as f:
            f.seek(self.offset)
            while not self._abandon.is_set():
                end = self.written()
                if self.offset < end:
                    data = f.read(min(end - self.offset, 1 << 20))
                    self.offset += len(data)
                    self.parser.feed(data)
                    # Let the pump thread take the GIL between pieces: the capture comes first.
                    time.sleep(0)
                else:
                    if self._stop_when_caught_up.is_set():
                        break
                    time.sleep(0.05)
                now = time.monotonic()
                if now - last_draw >= self.interval_s or self.offset >= end:
                    self.stats = to_live_stats(self.parser.stats())
                    if self.stats.errors and self.first_error_at is None:
                        self.first_error_at = time.time()
                        self._on_first_error()
                    if now - last_draw >= self.interval_s:
                        self.terminal.status(self.stats.line(self.offset))
                        last_draw = now
        self.stats = to_live_stats(self.parser.stats())

    def _on_first_error(self) -> None:
        if not self.triage:
            return
        start = max(0, self.offset - TRIAGE_WINDOW)
        with open(self.raw_path, "rb") as f:
            f.seek(start)
            window = f.read(self.offset - start)
        # Start on a line boundary so the window does not open with half a line.
        if start:
            cut = window.find(b"\n")
            window = window[cut + 1 :] if cut >= 0 else window
        try:
            self.triage_printed = triage_text(window, self.raw_path.name)
        except Exception as exc:
            self.triage_printed = f"kvtrace: a decode error was seen (triage failed: {exc})"
        self.terminal.message(self.triage_printed)

    def finish(self, timeout_s: float = 30.0) -> bool:
        """Let it catch up with raw.log (bounded); True if it read everything."""
        self._stop_when_caught_up.set()
        self.join(timeout_s)
        if self.is_alive():
            self._abandon.set()
            self.join(5)
            return False
        return self.offset >= self.written()


def raw_size(path: Path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
