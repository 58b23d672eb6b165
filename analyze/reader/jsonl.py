"""llama.cpp's structured log (`--log-jsonl`, in b11434): one JSON object per log call, on stdout. It is read as
the text llama.cpp would have printed for the same calls, so every line the reader knows reads the same in
either format (docs/jsonl.md):

- `{"type":"log","time":T,"level":L,"msg":M}` becomes llama.cpp's own `M.SS.mmm.uuu L ` prefix and M: `time`
  (microseconds since the logger started) is the line's time, `level` its letter; a `msg` that holds several lines
  (the X/Y block is one call) is those lines in order, the prefix on the first only, as the text log prints it;
  a `cont` piece goes on with the line before it, whatever came between in the file;
- typed events (`{"type": T, "data": {...}}`, b11434's `fit_memory_breakdown` and the types to come) are kept
  for the meta, and their line is read on as it is;
- any other line (stderr's plain text merged into the same raw.log, a paste's prose, a cut object) is read as
  it is; where it comes between a call and its `cont` piece it is read after the call's line.

So the read text can hold more lines than the file (a message of several lines) or fewer (cont pieces joined).
`LineMap` says which file line each read line started on, and analyze/reader/feed.py puts the records on the file's
lines:
line N of a table is line N of raw.log whatever the format. Nothing here runs for a text log but one substring
test per chunk.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvtrace.analyze.reader.normalize import parse_prefix

LOG_FORMAT = "jsonl"  # meta["log_format"] of a log written with --log-jsonl
FIT_EVENT = "fit_memory_breakdown"  # b11434's one typed event (common/fit.cpp): {"unit": "MiB", "rows": [...]}
MAX_ASIDE = 1000  # lines that wait for an open line to end (a `cont` piece may yet continue it)
MAX_EVENTS = 200  # typed events of other types kept in the meta (each with its line)
_LETTER = {"debug": "D", "info": "I", "warn": "W", "error": "E"}  # common_log's letters; `none` prints none
_OBJECT = re.compile(r'\{\s*"type"\s*:')
# the shape llama.cpp writes for nearly every call: one line ending in `\n`, nothing in it escaped
_PLAIN = re.compile(r'\{"type":"log","time":(?P<time>\d+),"level":"(?P<level>[a-z]+)","msg":"(?P<msg>[^"\\]*)\\n"\}')
_HINT = '"type"'  # a chunk without it holds no object: the text path pays this one test


@dataclass(slots=True)
class LineMap:
    """The file line each read line started on, where the two part: from read line `read[i]` on, file line =
    read line + `shift[i]` (until the next entry). Before the first entry they are the same."""

    read: list[int] = field(default_factory=list)
    shift: list[int] = field(default_factory=list)

    def file_line(self, line: int) -> int:
        i = bisect_right(self.read, line) - 1
        return line if i < 0 else line + self.shift[i]

    def file_lines(self, lines: Iterable[int]) -> list[int]:
        read, shift, find = self.read, self.shift, bisect_right
        out = []
        for n in lines:
            i = find(read, n) - 1
            out.append(n if i < 0 else n + shift[i])
        return out


@dataclass(slots=True)
class JsonlLog:
    """The conversion of one JSONL log (or one piece of it, analyze/reader/split.py) into llama.cpp's text, and what
    it found on the way: object counts and typed events, for the meta."""

    file_line: int  # file lines read so far
    read_line: int  # read lines handed on so far
    lines: LineMap = field(default_factory=LineMap)
    objects: int = 0  # `"type":"log"` objects
    text_lines: int = 0  # lines that were no object (plain text beside the JSON)
    types: Counter[str] = field(default_factory=Counter)  # typed events by type
    fit: list[Any] = field(default_factory=list)  # the fit_memory_breakdown events' data
    events: list[dict[str, Any]] = field(default_factory=list)  # other typed events: type, line, data
    _shift: int = 0
    _open: bool = False  # a read line was started and not ended (a message without its newline yet)
    _held: str = ""  # its text, handed on once it ends
    _aside_lines: list[tuple[str, int]] = field(default_factory=list)  # lines read after the open line ends

    def convert(self, text: str) -> str:
        """The whole lines of `text` (a chunk ending on a line break; at the end of a log the last line may have
        none) as llama.cpp's text. A line still open at the end (a `msg` without its newline, which a `cont`
        piece may yet continue) is held back until it ends."""
        out: list[str] = [self._held] if self._held else []
        self._held = ""
        lines = text.split("\n")
        if not lines[-1]:
            lines.pop()
        put = out.append
        for line in lines:
            self.file_line += 1
            f = self.file_line
            if line.endswith("\r"):
                line = line[:-1]
            m = _PLAIN.fullmatch(line) if line[:2] == '{"' else None
            if m is not None and m["level"] != "cont":
                self.objects += 1
                if self._open:
                    self._end(put)
                self._start(f)
                put(_prefix(int(m["time"]), m["level"]))
                put(m["msg"])
                put("\n")
                self.read_line += 1
                continue
            obj = _object(line) if _HINT in line else None
            if obj is None:
                self.text_lines += 1
                self._aside(line + "\n", f, put)
                continue
            kind = obj["type"]
            if kind == "log":
                self.objects += 1
                level, msg = obj.get("level"), obj["msg"]
                if level == "cont":
                    self._emit(msg, f, put)
                    continue
                if self._open:
                    self._end(put)
                self._emit(_prefix(obj.get("time"), level) + msg, f, put)
                continue
            self.types[kind] += 1
            if kind == FIT_EVENT:
                self.fit.append(obj.get("data"))
            elif len(self.events) < MAX_EVENTS:
                self.events.append({"type": kind, "line": f, "data": obj.get("data")})
            self._aside(line + "\n", f, put)  # read on as it is: it may say something the table knows
        joined = "".join(out)
        if self._open:
            head, _, self._held = joined.rpartition("\n")
            return head + "\n" if head or joined.startswith("\n") else ""
        return joined

    def flush(self) -> str:
        """The line still open at the end of the log, ended."""
        if not self._open:
            return ""
        out: list[str] = [self._held]
        self._held = ""
        self._end(out.append)
        return "".join(out)

    def _start(self, f: int) -> None:
        """Read line `read_line + 1` starts on file line `f`."""
        r = self.read_line + 1
        if f - r != self._shift:
            self._shift = f - r
            self.lines.read.append(r)
            self.lines.shift.append(self._shift)

    def _end(self, put: Any) -> None:
        put("\n")
        self.read_line += 1
        self._open = False
        aside, self._aside_lines = self._aside_lines, []
        for s, f in aside:
            self._emit(s, f, put)

    def _aside(self, s: str, f: int, put: Any) -> None:
        """A line that is no log call (stderr's text, a typed event) from file line `f`: read after the open
        line ends, so that a `cont` piece still joins the call it continues."""
        if not self._open:
            self._emit(s, f, put)
            return
        self._aside_lines.append((s, f))
        if len(self._aside_lines) > MAX_ASIDE:  # no `cont` is coming after that much: the line ends here
            self._end(put)

    def _emit(self, s: str, f: int, put: Any) -> None:
        """`s` as the text stream has it, from file line `f`: each line it starts is numbered there."""
        parts = s.split("\n")
        for i, part in enumerate(parts):
            if i:
                if not self._open:
                    self._start(f)  # an empty line
                put("\n")
                self.read_line += 1
                self._open = False
            if part:
                if not self._open:
                    self._start(f)
                    self._open = True
                put(part)

    def meta(self) -> dict[str, Any]:
        """What the meta says of the log's format and its typed events (the keys `text_meta` gives a text log)."""
        counts: dict[str, Any] = {"objects": self.objects, "text_lines": self.text_lines, "events": dict(self.types)}
        if self.events:
            counts["other_events"] = self.events
        return {"log_format": LOG_FORMAT, "log_jsonl": counts, FIT_EVENT: self.fit}

    def merge(self, other: JsonlLog) -> None:
        """Another piece's counts and events after this one's (analyze/reader/split.py)."""
        self.objects += other.objects
        self.text_lines += other.text_lines
        self.types.update(other.types)
        self.fit.extend(other.fit)
        self.events.extend(other.events[: max(0, MAX_EVENTS - len(self.events))])


def text_meta() -> dict[str, Any]:
    """The same keys for a text log: one set of meta keys whatever the format."""
    return {"log_format": "text", "log_jsonl": {}, FIT_EVENT: []}


def _prefix(time: Any, level: Any) -> str:
    """llama.cpp's `M.SS.mmm.uuu L ` for a call at `time` microseconds; no time (0 or none: timestamps off) gives
    no prefix, as the text log prints none, and `none` (LOG()'s output level) gives no letter."""
    if not isinstance(time, int) or isinstance(time, bool) or time <= 0:
        return ""
    ms, us = divmod(time, 1000)
    s, ms = divmod(ms, 1000)
    m, s = divmod(s, 60)
    letter = _LETTER.get(level) if isinstance(level, str) else None
    return f"{m}.{s:02d}.{ms:03d}.{us:03d} {letter} " if letter else f"{m}.{s:02d}.{ms:03d}.{us:03d} "


def _object(line: str) -> dict[str, Any] | None:
    """The llama.cpp object a line holds (behind any prefix a paste or a log collector put in front), None for
    any other line. `msg` comes back in the reader's text (normalize.decode: one character per byte)."""
    m = _OBJECT.search(line)
    if m is None:
        return None
    at = m.start()
    if at and parse_prefix(line[:at] + "\x00").start != at:
        return None  # text before it that is no line prefix: a request body or prose quoting one
    try:
        text = line[at:].rstrip().encode("latin-1").decode("utf-8", "surrogateescape")
        obj = json.loads(text)
    except (UnicodeError, ValueError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        return None
    if obj["type"] == "log":
        msg = obj.get("msg")
        if not isinstance(msg, str):
            return None
        try:
            obj["msg"] = msg.encode("utf-8", "surrogateescape").decode("latin-1")
        except UnicodeError:
            obj["msg"] = msg.encode("utf-8", "replace").decode("latin-1")
        return obj
    return obj if "data" in obj else None


def holds_objects(text: str) -> bool:
    """Whether a chunk holds one of llama.cpp's JSON log objects (a cheap test first: most chunks hold none)."""
    if _HINT not in text:
        return False
    return any(_object(line) is not None for line in text.split("\n") if _HINT in line)


__all__ = ["FIT_EVENT", "LOG_FORMAT", "JsonlLog", "LineMap", "holds_objects", "text_meta"]
