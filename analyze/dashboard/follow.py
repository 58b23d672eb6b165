"""Following a log while it is written: new bytes go once through the streaming parser, and a live view
asks for the tables so far.

A session folder's raw.log is followed until the capture writes its end into manifest.json (then the
parse is finished, as for a finished log), or until the capture is gone without writing it (killed).
A plain file is followed through truncation and rotation by the same FileTail as `kvtrace capture attach
--follow`.
Nothing here raises for a missing, deleted or cut file: it becomes a notice, and what was read stays.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvtrace.analyze.reader.parser import ParseResult, StreamParser
from kvtrace.analyze.reader.session import (
    KEY_END,
    KEY_ENDED,
    KEY_HOST,
    KEY_OUTCOME,
    KEY_PID,
    KEY_STOP_REASON,
    log_named,
    read_manifest,
)
from kvtrace.analyze.reader.source import FileTail

READ_BUDGET = 32 << 20  # bytes parsed per poll at most, so a page update never waits on a whole big log
READ_SIZE = 4 << 20
SNAPSHOT_SHARE = 0.25  # tables are rebuilt at most this share of the time (a big live log costs more each time)


@dataclass(slots=True)
class LiveState:
    """What a live view shows: the tables so far, how far the file was read, and why it may have stopped."""

    result: ParseResult | None
    version: int  # grows each time `result` changes (a key for anything drawn from it)
    bytes_read: int
    ended: bool  # the capture wrote its end (or is gone): `result` is the finished parse
    stop_reason: str | None
    notices: list[str] = field(default_factory=list)  # plain text, never Markdown
    idle_s: float = 0.0  # seconds since the last new byte
    waiting: bool = False  # raw.log does not exist (yet)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def capture_end(manifest: dict[str, object]) -> tuple[bool, str | None]:
    """(ended, why) from a session's manifest: `kvtrace capture` writes `end`, the engine `ended`; a capture
    whose own process is gone without writing either was killed."""
    if KEY_END in manifest or KEY_ENDED in manifest:
        reason = manifest.get(KEY_STOP_REASON)
        outcome = manifest.get(KEY_OUTCOME)
        if reason is None and isinstance(outcome, dict):
            reason = outcome.get("status")
        return True, None if reason is None else str(reason)
    pid = manifest.get(KEY_PID)
    host = manifest.get(KEY_HOST)
    same_host = isinstance(host, dict) and host.get("hostname") == socket.gethostname()
    if isinstance(pid, int) and same_host and not _pid_alive(pid):
        return True, "killed"
    return False, None


class Follower:
    """Tails one log (a session folder's raw.log or a file). `poll` is safe to call from many page runs."""

    def __init__(self, path: Path, *, interval_s: float = 1.0, share: float = SNAPSHOT_SHARE) -> None:
        path = Path(path)
        self.path = path
        self.session = path if path.is_dir() else None
        self.log = log_named(path)
        self.interval_s = interval_s
        self.share = share
        self.parser = StreamParser(self.log.name)
        self._lock = threading.Lock()
        self.tail = FileTail(self.log)
        self._offset = 0
        self._result: ParseResult | None = None
        self._version = 0
        self._parsed_at = -1  # bytes_read when `_result` was built
        self._next_snapshot = 0.0
        self._last_data = time.monotonic()
        self._ended = False
        self._reason: str | None = None
        self._notices: list[str] = []
        self._gone = False

    # -- reading ----------------------------------------------------------------------------------
    def _open(self) -> bool:
        try:
            self.tail.open()
        except OSError:
            return False
        return True

    def _feed(self, data: bytes) -> None:
        self.parser.feed(data)
        self._offset += len(data)

    def _read(self) -> int:
        """Parse what the file got since the last poll (at most READ_BUDGET); follow truncation and rotation."""
        got = 0
        while got < READ_BUDGET and self.tail.is_open:
            data = self.tail.read(READ_SIZE)
            if data:
                self._feed(data)
                got += len(data)
                continue
            self._check_file()
            break
        if got:
            self._last_data = time.monotonic()
        return got

    def _check_file(self) -> None:
        change, rest = self.tail.check()
        if rest:  # what the old file got after the last read, then the new file
            self._feed(rest)
        if change == FileTail.GONE and not self._gone:
            self._gone = True
            self._notices.append(f"{self.log.name} was deleted or moved away: what was read stays on screen.")
        elif change == FileTail.ROTATED and self.tail.is_open:
            self._gone = False
            self._notices.append(f"{self.log.name} was rotated (a new file at the same name): following it.")
        elif change == FileTail.TRUNCATED:
            self._notices.append(f"{self.log.name} was truncated: reading it again from the start.")

    def _manifest(self) -> dict[str, object]:
        return {} if self.session is None else read_manifest(self.session)

    # -- the one entry point ----------------------------------------------------------------------
    def poll(self) -> LiveState:
        with self._lock:
            if not self._ended:
                self._advance()
            return LiveState(
                result=self._result, version=self._version, bytes_read=self._offset, ended=self._ended,
                stop_reason=self._reason, notices=list(self._notices), idle_s=time.monotonic() - self._last_data,
                waiting=not self.tail.is_open and not self._ended,
            )  # fmt: skip

    def _locate(self) -> None:
        """A path that did not exist when following began (a capture started beside the dashboard has not made
        its folder yet) is a session folder once it appears as one."""
        if self.session is None and self.log == self.path and self.path.is_dir():
            self.session, self.log = self.path, log_named(self.path)
            self.parser.name = self.log.name
            self.tail = FileTail(self.log)

    def _advance(self) -> None:
        if not self.tail.is_open:
            self._locate()
        if not self.tail.is_open and not self._open():
            ended, reason = capture_end(self._manifest())
            if ended:  # a capture that ended without ever writing raw.log
                self._ended, self._reason = True, reason
                self._notices.append(f"The capture ended ({reason or 'no reason given'}) without writing "
                                     f"{self.log.name}: there is nothing to show.")
            return
        # The end is read before the last bytes, so everything written before it is in the final parse.
        ended, reason = capture_end(self._manifest()) if self.session is not None else (False, None)
        got = self._read()
        if ended and got < READ_BUDGET:  # read to the end of the file: nothing more will come
            self._finish(reason)
            return
        start = time.monotonic()
        if self._offset != self._parsed_at and start >= self._next_snapshot:
            self._result = self.parser.snapshot()
            cost = time.monotonic() - start
            self._parsed_at = self._offset
            self._version += 1
            # A big log costs more per snapshot: building tables takes at most `share` of the time.
            self._next_snapshot = start + max(self.interval_s * 0.8, cost / self.share)

    def _finish(self, reason: str | None) -> None:
        self._ended, self._reason = True, reason
        if reason == "killed":
            self._notices.append("The capture stopped without finishing (its process is gone: killed?). "
                                 f"{self.log.name} holds everything written up to then.")
        self._result = self.parser.finish()
        self._parsed_at = self._offset
        self._version += 1
        self.tail.close()
