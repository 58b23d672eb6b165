"""Random access to a log's raw lines by line number, for "show me the log around this row".

Line numbers count `\\n` from 1, as the reader does. A plain file on disk is memory-mapped and indexed
once (one vectorised scan for newlines), so a 100 MB log costs a few MB of offsets, not a copy; bytes
and gzip sources are held in memory.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from kvtrace.analyze.reader.normalize import clean_chunk
from kvtrace.analyze.reader.source import open_source, resolve_path


class RawText:
    """The lines of one log, addressable by their 1-based line number."""

    def __init__(self, data: bytes | np.ndarray) -> None:
        buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes | bytearray) else data
        self._buf = buf
        # starts[i] = byte offset of line i + 1; one extra entry marks the end of the last line.
        newlines = np.flatnonzero(buf == 0x0A)
        self._starts = np.concatenate([[0], newlines + 1]).astype(np.int64)
        self._size = int(buf.size)

    @classmethod
    def open(cls, source: str | os.PathLike[str] | bytes) -> RawText:
        """A path (plain, .gz, or a session folder) or bytes (gzip detected from the content)."""
        if isinstance(source, bytes | bytearray):
            if bytes(source[:2]) != b"\x1f\x8b":
                return cls(bytes(source))
            opened = open_source(bytes(source))
            return cls(opened.stream.read())
        path = resolve_path(source)
        with open(path, "rb") as fh:
            compressed = fh.read(2) == b"\x1f\x8b"
        if compressed or path.stat().st_size == 0:
            opened = open_source(path)
            try:
                return cls(opened.stream.read())
            finally:
                opened.raw.close()
        return cls(np.memmap(Path(path), dtype=np.uint8, mode="r"))

    @property
    def n_lines(self) -> int:
        # A final newline ends the last line; it does not start an empty one.
        n = self._starts.size
        return n - 1 if self._starts[-1] >= self._size else n

    def line(self, number: int) -> str:
        return self.lines(number, number)[0][1] if 1 <= number <= self.n_lines else ""

    def lines(self, first: int, last: int) -> list[tuple[int, str]]:
        """(number, text) for lines first..last inclusive, clipped to the log; text cleaned of ANSI and CR."""
        first, last = max(1, first), min(self.n_lines, last)
        if first > last:
            return []
        lo = int(self._starts[first - 1])
        hi = int(self._starts[last]) if last < self._starts.size else self._size
        text = clean_chunk(bytes(self._buf[lo:hi]).decode("utf-8", "replace"))
        parts = text.split("\n")[: last - first + 1]
        return list(zip(range(first, first + len(parts)), parts, strict=True))

    def around(self, number: int, before: int = 20, after: int = 20) -> list[tuple[int, str]]:
        return self.lines(number - before, number + after)

    def line_bytes_offsets(self, numbers: np.ndarray) -> np.ndarray:
        """Byte offset where each (1-based) line starts."""
        idx = np.clip(np.asarray(numbers, dtype=np.int64) - 1, 0, self._starts.size - 1)
        return self._starts[idx]


def format_excerpt(rows: list[tuple[int, str]], mark: int | None = None) -> str:
    """Numbered plain text with the chosen line marked by `>>`: for st.code / st.text, never Markdown."""
    if not rows:
        return ""
    width = len(str(rows[-1][0]))
    return "\n".join(f"{'>>' if n == mark else '  '} {str(n).rjust(width)} | {text}" for n, text in rows)


def capture_seconds(raw: RawText, chunks: pd.DataFrame) -> np.ndarray:
    """Seconds since the first captured chunk at which each line arrived, indexed by line number.

    `chunks` is a session's chunks.parquet (t, offset, nbytes), written by the capture wrapper: it is the
    time axis for logs that carry no timestamps of their own.
    """
    n = raw.n_lines
    if not len(chunks) or n == 0:
        return np.zeros(n + 1)
    order = np.argsort(chunks["offset"].to_numpy(np.int64), kind="stable")
    offs = chunks["offset"].to_numpy(np.int64)[order]
    ts = chunks["t"].to_numpy(np.float64)[order]
    starts = raw.line_bytes_offsets(np.arange(1, n + 1))
    which = np.clip(np.searchsorted(offs, starts, side="right") - 1, 0, offs.size - 1)
    out = np.empty(n + 1)
    out[1:] = ts[which] - ts[0]
    out[0] = 0.0
    return out
