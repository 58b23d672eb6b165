"""Write what llama.cpp logs to raw.log byte for byte, the way llama.cpp's own common_log prints it.

llama-cpp-python's handler maps an older ggml level order and drops real ERROR lines (the position
error among them), so the engine installs its own `llama_log_set` callback. The callback runs inside
the call that logs, so every line lands in call order with the engine's own server-style lines.
"""

from __future__ import annotations

import ctypes
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

# enum ggml_log_level in the vendored ggml (not the order llama-cpp-python's _logger assumes).
NONE, DEBUG, INFO, WARN, ERROR, CONT = 0, 1, 2, 3, 4, 5
LETTER = {DEBUG: "D", INFO: "I", WARN: "W", ERROR: "E"}


def format_timestamp(elapsed_us: int) -> str:
    """common_log's `%d.%02d.%03d.%03d`: minutes (unbounded), seconds, milliseconds, microseconds."""
    ms, us = divmod(elapsed_us, 1000)
    s, ms = divmod(ms, 1000)
    m, s = divmod(s, 60)
    return f"{m}.{s:02d}.{ms:03d}.{us:03d}"


class LogWriter:
    """raw.log as llama.cpp would write it, with the new-scheme `M.SS.mmm.uuu L ` prefix as an option.

    One call is one log entry: the prefix goes before the entry only, so a multi-line message is
    prefixed on its first line, a CONT piece continues whatever came before, and an entry without a
    trailing newline is glued to the next one, exactly as common_log does it.
    """

    def __init__(self, path: Path, *, prefix: bool = True) -> None:
        self.path = Path(path)
        self.prefix = prefix
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
