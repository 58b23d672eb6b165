"""Where captured bytes go: raw.log (byte-exact, unbuffered), the terminal echo, and per-chunk arrival times.

Each chunk goes straight to the kernel with os.write, so killing the wrapper (even with -9) loses nothing
that was already received: the page cache keeps what the process wrote.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from array import array
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class RawSink:
    """Appends chunks to raw.log and remembers when each one arrived.

    Single writer (the pump thread); `bytes_written` may be read from any thread.
    """

    def __init__(self, path: Path, *, echo: Callable[[bytes], None] | None = None) -> None:
        self.path = Path(path)
        # Not O_APPEND: splice(2) refuses append-mode files. Only this sink writes the file.
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        self.bytes_written = os.lseek(self._fd, 0, os.SEEK_END)
        self._echo = echo
        self.first_offset = self.bytes_written
        # Compact columns: a capture of hours may have millions of chunks.
        self._t_wall = array("d")
        self._offset = array("q")
        self._size = array("q")
        self._lock = threading.Lock()
        self.echo_failed = False

    def write(self, chunk: bytes) -> None:
        if not chunk:
            return
        t = time.time()
        # The lock keeps a late writer (a source that could not be interrupted) off a closed descriptor.
        with self._lock:
            if self._fd < 0:
                raise OSError("raw.log is closed")
            write_all(self._fd, chunk)
            self._t_wall.append(t)
            self._offset.append(self.bytes_written)
            self._size.append(len(chunk))
            self.bytes_written += len(chunk)
        if self._echo is not None and not self.echo_failed:
            try:
                self._echo(chunk)
            except OSError:
                # A closed terminal must not stop the capture itself.
                self.echo_failed = True

    def splice_from(self, fd: int, max_bytes: int) -> int:
        """Move up to `max_bytes` from a pipe straight into raw.log inside the kernel (no copy through
        Python). Returns the count, 0 at end of input. Raises OSError(EINVAL) when `fd` is not a pipe."""
        with self._lock:
            if self._fd < 0:
                raise OSError("raw.log is closed")
            n = os.splice(fd, self._fd, max_bytes)
            if n:
                self._t_wall.append(time.time())
                self._offset.append(self.bytes_written)
                self._size.append(n)
                self.bytes_written += n
        return n

    @property
    def echoing(self) -> bool:
        return self._echo is not None

    def fsync(self) -> None:
        with contextlib.suppress(OSError):
            os.fsync(self._fd)

    def close(self, chunks_path: Path | None = None) -> None:
        with self._lock:
            if self._fd < 0:
                return
            self.fsync()
            os.close(self._fd)
            self._fd = -1
        if chunks_path is not None:
            self.write_chunks(chunks_path)

    def write_chunks(self, path: Path) -> None:
        """chunks.parquet: one row per received chunk: arrival time (unix seconds), byte offset, size."""
        table = pa.table(
            {
                "t": pa.array(self._t_wall, type=pa.float64()),
                "offset": pa.array(self._offset, type=pa.int64()),
                "nbytes": pa.array(self._size, type=pa.int64()),
            }
        )
        tmp = Path(str(path) + ".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)
