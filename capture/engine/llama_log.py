"""Write what llama.cpp logs to raw.log byte for byte, the way llama.cpp's own common_log prints it: as text, or
as the JSON objects b11434's `--log-jsonl` writes (one per log call, docs/jsonl.md).

llama-cpp-python's handler maps an older ggml level order and drops real ERROR lines (the position
error among them), so the engine installs its own `llama_log_set` callback. The callback runs inside
the call that logs, so every line lands in call order with the engine's own server-style lines.
"""

from __future__ import annotations

import ctypes
import json
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

# enum ggml_log_level in the vendored ggml (not the order llama-cpp-python's _logger assumes).
NONE, DEBUG, INFO, WARN, ERROR, CONT = 0, 1, 2, 3, 4, 5
LETTER = {DEBUG: "D", INFO: "I", WARN: "W", ERROR: "E"}
# `--log-jsonl`'s `level` names (common/log.cpp), one for every ggml level
LEVEL_NAME = {NONE: "none", DEBUG: "debug", INFO: "info", WARN: "warn", ERROR: "error", CONT: "cont"}
LOG_FORMATS = ("text", "jsonl")


def format_timestamp(elapsed_us: int) -> str:
    """common_log's `%d.%02d.%03d.%03d`: minutes (unbounded), seconds, milliseconds, microseconds."""
    ms, us = divmod(elapsed_us, 1000)
    s, ms = divmod(ms, 1000)
    m, s = divmod(s, 60)
    return f"{m}.{s:02d}.{ms:03d}.{us:03d}"


def json_object(level: int, text: bytes, time_us: int) -> bytes:
    """One log call as b11434's `--log-jsonl` writes it: `{"type":"log","time":T,"level":L,"msg":M}` and a newline,
    keys in that order with no spaces. `msg` is escaped as nlohmann::json's dump() does it (measured on the real
    b11434 server): UTF-8 kept as it is, bytes that are no UTF-8 replaced by U+FFFD, `"` `\\` and the control
    characters escaped (`\\n`, `\\t`, ..., `\\u001b`), `/` and DEL not. Python's json.dumps with ensure_ascii off
    escapes exactly the same characters the same way."""
    msg = json.dumps(text.decode("utf-8", "replace"), ensure_ascii=False)
    name = LEVEL_NAME.get(level, "none")
    return f'{{"type":"log","time":{time_us},"level":"{name}","msg":{msg}}}\n'.encode()


class LogWriter:
    """raw.log as llama.cpp would write it, with the new-scheme `M.SS.mmm.uuu L ` prefix as an option.

    One call is one log entry: the prefix goes before the entry only, so a multi-line message is
    prefixed on its first line, a CONT piece continues whatever came before, and an entry without a
    trailing newline is glued to the next one, exactly as common_log does it. With `log_format="jsonl"` each
    entry is one JSON object on its own line instead (json_object), whatever newlines its message holds.
    """

    def __init__(self, path: Path, *, prefix: bool = True, log_format: str = "text") -> None:
        if log_format not in LOG_FORMATS:
            raise ValueError(f"unknown log format {log_format!r} (choose from {', '.join(LOG_FORMATS)})")
        self.path = Path(path)
        self.prefix = prefix
        self.jsonl = log_format == "jsonl"
        self._f: IO[bytes] = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self._t0 = time.perf_counter_ns()
        self._newlines = 0
        self.levels: Counter[int] = Counter()
        self.first_error = ""  # the first ERROR entry since watch_errors(), as one line
        self.tap: list[bytes] | None = None  # while a list: every entry is kept in it too (what a load said)

    @property
    def line(self) -> int:
        """1-based number of the line the next byte will land on."""
        return self._newlines + 1

    def write(self, level: int, text: bytes) -> None:
        self.levels[level] += 1
        if self.tap is not None:
            self.tap.append(text)
        if level == ERROR and not self.first_error and text.strip():
            self.first_error = " ".join(text.decode("utf-8", "replace").split())[:300]
        if self.jsonl:
            # --log-jsonl: every call one object, its `time` set whenever timestamps are on, whatever the level
            # (common_log stamps each entry: b11434's `none` objects carry it); 0 with them off
            elapsed_us = (time.perf_counter_ns() - self._t0) // 1000 if self.prefix else 0
            self._f.write(json_object(level, text, elapsed_us))
            self._newlines += 1
            return
        if self.prefix and level in LETTER:
            elapsed_us = (time.perf_counter_ns() - self._t0) // 1000
            self._f.write(f"{format_timestamp(elapsed_us)} {LETTER[level]} ".encode())
        self._f.write(text)
        self._newlines += text.count(b"\n")

    def watch_errors(self) -> None:
        """Forget the first ERROR entry seen so far: a call that fails next says why through first_error (a
        model load logs its reason first, then a generic `failed to load model`)."""
        self.first_error = ""

    def emit(self, level: int, message: str) -> None:
        """A line printed by the engine in place of server/speculative code (same rules as llama.cpp's)."""
        self.write(level, message.encode("utf-8"))

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


class LlamaLogCapture:
    """Routes llama.cpp's log into a LogWriter while active; restores llama-cpp-python's handler after."""

    # Keeps every installed ctypes callback alive: llama.cpp holds a raw pointer to it, and a logging
    # call after garbage collection would jump into freed memory.
    _keep: list[Any] = []

    def __init__(self, writer: LogWriter) -> None:
        import llama_cpp

        self._llama_cpp = llama_cpp
        self.writer = writer

        def _callback(level: int, text: bytes | None, _user: ctypes.c_void_p) -> None:
            if text:
                writer.write(int(level), text)

        self._callback = llama_cpp.llama_log_callback(_callback)
        LlamaLogCapture._keep.append(self._callback)

    def __enter__(self) -> LlamaLogCapture:
        self._llama_cpp.llama_log_set(self._callback, ctypes.c_void_p(0))
        return self

    def __exit__(self, *exc: object) -> None:
        from llama_cpp import _logger

        self._llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
