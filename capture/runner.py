"""One capture from start to stop, whatever the source (a wrapped program, a followed file, stdin, a
llama-swap stream): pump bytes into raw.log, watch, apply the stop rules, always write the manifest.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from kvtrace.analyze.reader.session import (
    CHUNKS,
    KEY_END,
    KEY_LIVE,
    KEY_METRICS,
    KEY_PID,
    KEY_PROGRAM,
    KEY_STOP_REASON,
    Session,
    now_iso,
)
from kvtrace.capture.metrics import MetricsScraper, ScrapeSummary
from kvtrace.capture.monitor import LiveParse, Terminal
from kvtrace.capture.process import Child, StopPlan, read_fd, signal_name, splice_fd
from kvtrace.capture.sink import RawSink

Source = Callable[[threading.Event], Iterator[bytes]]
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Driver(Protocol):
    """What sends requests beside a capture (--ping's Pinger, a replay's Replayer): a thread that waits for the
    server, sends, and sets `done`; `stop` asks it to end early. `name` is its manifest key and the stop
    reason's word ("ping done", "replay failed")."""

    name: str
    done: threading.Event
    stop: threading.Event

    @property
    def healthy(self) -> bool: ...

    @property
    def error(self) -> str | None: ...

    def start(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...

    def summary(self) -> dict[str, Any]: ...


@dataclass(slots=True)
class StopRules:
    timeout_s: float | None = None
    until_error: bool = False
    grace_s: float = 5.0
    keep_running: bool = False  # after --ping (or a replay), leave the server up until another rule stops it
    plan: StopPlan = field(default_factory=StopPlan)
    drain_s: float = 2.0  # after the program exits, how long its helpers may keep the pipe open
    parse_wait_s: float = 15.0  # at the end, how long the live parse may take to catch up (a loaded machine)


@dataclass(slots=True)
class Outcome:
    """How a capture ended, for the caller to present (the library prints no summary)."""

    reason: str
    exit_code: int
    returncode: int | None = None
    signal: str | None = None
    bytes: int = 0
    error: str | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    session: Path | None = None
    # The program exited by itself, failing, before it served (before /health answered, or before the log
    # showed a batch or a KV cache position): its last lines, which say why. None when it got further, or
    # was stopped.
    startup_lines: list[str] | None = None

    @property
    def has_triage(self) -> bool:
        """Whether the log holds something for `kvtrace triage` (a batch, a KV cache position or a failure, as
        the live parse saw it); True when the live parse could not tell."""
        live = self.manifest.get("live") or {}
        stats = live.get("stats")
        if not stats or live.get("complete") is False:
            return True
        return bool(stats.get("batches") or stats.get("errors")) or stats.get("target_pos") is not None or \
            stats.get("drafter_pos") is not None


STARTUP_LINES = 10  # of a program that exited during start-up, this many of its last lines are kept
_TAIL_BYTES = 64 << 10


def last_lines(path: Path, start: int, n: int = STARTUP_LINES) -> list[str]:
    """The last `n` lines written to `path` after `start`, as plain text (control characters dropped, so a
    stranger's log cannot move the cursor or recolour the terminal)."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            f.seek(max(start, end - _TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if start < end - _TAIL_BYTES and lines:
        lines = lines[1:]  # the first one is cut
    text = [_CONTROL.sub("", line).rstrip() for line in lines]
    return [line for line in text if line.strip()][-n:]


class _Signals:
    """Turns SIGINT/SIGTERM/SIGHUP into a stop request; a second one makes the stop firm at once."""

    def __init__(self, child: Child | None) -> None:
        self.child = child
        self.received: list[str] = []
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in _HANDLED_SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signal.Signals(signum).name)
        if len(self.received) >= 2 and self.child is not None and self.child.running():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                import os

                os.killpg(self.child.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]


@dataclass(slots=True)
class FdSource:
    """A pipe or file descriptor: read in chunks, or spliced straight into raw.log when nothing is echoed."""

    fd: int

    def __call__(self, stop: threading.Event) -> Iterator[bytes]:
        return read_fd(self.fd, stop)


@dataclass(slots=True)
class ProgramOutput:
    """The program writes raw.log itself (Child.start): the pump only watches the file grow, for the arrival
    times and the echo. `start`: where raw.log ended before the program was given it."""

    child: Child
    start: int


def _watch_program(sink: RawSink, child: Child, stop: threading.Event, eof: threading.Event,
                   poll_s: float = 0.02) -> None:
    """Note raw.log's growth every `poll_s` until the capture stops. The output has ended (`eof`, as a pipe's
    end would say) once the program has exited and no helper it left in its process group is still there
    to write; the stop rules bound how long helpers are waited for."""
    exit_fd = child.exit_fd()
    poller = select.poll()
    if exit_fd is not None:
        poller.register(exit_fd, select.POLLIN)
    exited = False
    try:
        while not stop.is_set():
            if exited:
                stop.wait(poll_s)
            elif exit_fd is not None:
                exited = bool(poller.poll(int(poll_s * 1000)))
            else:
                exited = child.wait(poll_s) is not None
            if exited and not eof.is_set():
                child.poll()  # reaped: only helpers keep its process group alive now
                if not child.group_alive():
                    eof.set()
            sink.caught_up()
        sink.caught_up()
    finally:
        if exit_fd is not None:
            os.close(exit_fd)


def _wait_for_stop(
    rules: StopRules,
    sigs: _Signals,
    eof: threading.Event,
    t0: float,
    child: Child | None,
    monitor: LiveParse | None,
    driver: Driver | None,
) -> tuple[str, int, str | None]:
    """Block until a stop rule fires: (reason, exit code, error)."""
    child_exit_seen: float | None = None
    while True:
        if sigs.received:
            return f"signal {sigs.received[0]}", 128 + int(signal.Signals[sigs.received[0]]), None
        if child is not None and child_exit_seen is None and child.poll() is not None:
            child_exit_seen = time.monotonic()
        if eof.is_set() and (child is None or child_exit_seen is not None):
            return ("program exited" if child is not None else "end of input"), EXIT_OK, None
        if child_exit_seen is not None and time.monotonic() - child_exit_seen > rules.drain_s:
            return "program exited", EXIT_OK, None  # its helpers still hold the pipe: stop waiting
        if rules.timeout_s is not None and time.monotonic() - t0 >= rules.timeout_s:
            return "timeout", EXIT_OK, None
        if (
            rules.until_error
            and monitor is not None
            and monitor.first_error_at is not None
            and time.time() - monitor.first_error_at >= rules.grace_s
        ):
            return "until-error", EXIT_FAILED, None
        if driver is not None and driver.done.is_set():
            if driver.error and not driver.healthy:
                return f"{driver.name} failed", EXIT_FAILED, driver.error
            if not rules.keep_running:
                return f"{driver.name} done", (EXIT_FAILED if driver.error else EXIT_OK), driver.error
        if child is not None and eof.is_set():
            child.wait(0.05)  # the output has ended: the program exits next, notice it at once
        else:
            eof.wait(0.05)


def _preload_pandas() -> None:
    with contextlib.suppress(Exception):
        # behind the program: on Linux a thread can lower its own priority alone
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    with contextlib.suppress(Exception):
        import pandas  # noqa: F401
        import pyarrow.parquet  # noqa: F401


def run_capture(
    session: Session,
    source: Source | ProgramOutput,
    *,
    terminal: Terminal,
    rules: StopRules,
    child: Child | None = None,
    driver: Driver | None = None,
    live: bool = True,
    scraper: MetricsScraper | None = None,
) -> Outcome:
    """Capture until a stop rule fires; the manifest records why it stopped and how the program ended.
    `scraper` (the server's /metrics) runs beside it and scrapes a last time before the program is stopped."""
    sink = RawSink(session.raw_log, echo=terminal.echo if terminal.echo_enabled else None,
                   start=source.start if isinstance(source, ProgramOutput) else None)
    start_offset = sink.bytes_written
    # kvtrace_pid: a live view (kvtrace dashboard --follow) tells a killed capture from a running one.
    session.write_manifest({"start": now_iso(), "raw_log_offset": start_offset, KEY_PID: os.getpid()})
    stop_pump = threading.Event()
    eof = threading.Event()
    pump_error: list[str] = []

    def pump() -> None:
        try:
            if isinstance(source, ProgramOutput):
                _watch_program(sink, source.child, stop_pump, eof)
                return
            spliced = isinstance(source, FdSource) and not sink.echoing
            if spliced and isinstance(source, FdSource) and splice_fd(source.fd, sink.splice_from, stop_pump):
                return
            for chunk in source(stop_pump):
                sink.write(chunk)
        except Exception as exc:  # reported; what was written stays written
            pump_error.append(f"{type(exc).__name__}: {exc}")
        finally:
            eof.set()

    monitor = LiveParse(session.raw_log, start_offset, terminal) if live else None
    live_note = None
    pump_thread = threading.Thread(target=pump, name="kvtrace-pump", daemon=True)
    t0 = time.monotonic()
    with _Signals(child) as sigs:
        pump_thread.start()
        if monitor is not None:
            try:
                monitor.start()
            except OSError as exc:
                live_note, monitor = f"live parsing unavailable: {exc}", None
        if driver is not None:
            driver.start()
        if scraper is not None:
            scraper.start()
        # chunks.parquet is written with pandas when the capture ends: load it while the program runs, so
        # that the wrapper returns right after the program (the import took seconds after it before)
        threading.Thread(target=_preload_pandas, name="kvtrace-preload", daemon=True).start()
        try:
            reason, exit_code, error = _wait_for_stop(rules, sigs, eof, t0, child, monitor, driver)
        finally:
            # while the program still runs: the counters as the run ends (also when the wait was interrupted)
            scraped: ScrapeSummary | None = scraper.finish() if scraper is not None else None

        if driver is not None:
            driver.stop.set()
        returncode: int | None = None
        if child is not None:
            if child.running():
                terminal.message(f"kvtrace: stopping the program ({reason})")
            returncode = child.stop(rules.plan, firm=len(sigs.received) >= 2)
        stop_pump.set()
        pump_thread.join(rules.drain_s + 5)
        if driver is not None:
            driver.join(15)

        live_stats: dict[str, Any] | None = None
        live_complete = None
        if monitor is not None:
            at_end = monitor.offset - start_offset  # what the live view had read while the program ran
            live_complete = monitor.finish(
                sink.bytes_written, rules.parse_wait_s, abort=lambda: len(sigs.received) >= 2
            )
            s = monitor.stats
            live_stats = {
                "lines": s.lines,
                "batches": s.batches,
                "errors": s.errors,
                "target_pos": s.target_pos,
                "drafter_pos": s.drafter_pos,
                "bytes_parsed": monitor.offset - start_offset,
                "bytes_parsed_at_end": at_end,
            }
        terminal.end()
        sink.close(session.path / CHUNKS)

        program_failed = (
            child is not None and reason == "program exited" and returncode is not None and returncode != 0
        )
        if program_failed and exit_code == EXIT_OK:
            exit_code = EXIT_FAILED
        if pump_error and error is None:
            error = "reading the input failed: " + pump_error[0]

        final: dict[str, Any] = {
            KEY_END: now_iso(),
            "duration_s": round(time.monotonic() - t0, 3),
            KEY_STOP_REASON: reason,
            "bytes": sink.bytes_written - start_offset,
            "exit_code": exit_code,
            "signals_received": sigs.received,
            KEY_LIVE: {
                "stats": live_stats,
                "complete": live_complete,
                "note": live_note,
                "failed": monitor.failed if monitor else None,
                "triage": monitor.triage_printed if monitor else "",
            },
        }
        if child is not None:
            final[KEY_PROGRAM] = {
                "pid": child.pid,
                "returncode": returncode,
                "signal": signal_name(returncode),
                "signals_sent": child.signals_sent,
            }
        if driver is not None:
            final[driver.name] = driver.summary()
        if scraped is not None:
            final[KEY_METRICS] = scraped.manifest()
        if error:
            final["error"] = error
        session.write_manifest(final)
        startup_lines = None
        if child is not None and _exited_during_startup(child, returncode, sigs, driver, live_stats, live_complete):
            startup_lines = last_lines(session.raw_log, start_offset)
    return Outcome(
        reason=reason,
        exit_code=exit_code,
        returncode=returncode,
        signal=signal_name(returncode),
        bytes=sink.bytes_written - start_offset,
        error=error,
        manifest=session.read_manifest(),
        session=session.path,
        startup_lines=startup_lines,
    )


def _exited_during_startup(child: Child, returncode: int | None, sigs: _Signals, driver: Driver | None,
                           live_stats: dict[str, Any] | None, live_complete: bool | None) -> bool:
    """The program ended by itself, failing, before it served: before /health answered when pinged, else
    before the (complete) live parse saw a decode (a batch or a KV cache position)."""
    if returncode in (None, 0) or child.signals_sent or sigs.received:
        return False
    if driver is not None:
        return not driver.healthy
    if live_stats is None or live_complete is not True:
        return False  # the live parse cannot tell
    return not live_stats["batches"] and live_stats["target_pos"] is None and live_stats["drafter_pos"] is None
