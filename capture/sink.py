"""Where captured bytes go: raw.log (byte-exact, unbuffered), the terminal echo, and per-chunk arrival times.

Each chunk goes straight to the kernel (os.write or splice), so killing the wrapper (even with -9) loses
nothing that was already received: the page cache keeps what the process wrote. Arrival times go the same
way into a small journal (24 bytes a chunk), turned into chunks.parquet at the end; after a kill -9 the
journal is still there and `load_chunks` reads it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kvtrace.analyze.reader.session import CHUNKS_JOURNAL, JOURNAL_RECORD, RAW_LOG, load_chunks


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class RawSink:
    """Appends chunks to raw.log and remembers when each one arrived.

    Single writer (the pump thread); `bytes_written` may be read from any thread.
    """

    def __init__(self, path: Path, *, echo: Callable[[bytes], None] | None = None, start: int | None = None) -> None:
        self.path = Path(path)
        # Not O_APPEND: splice(2) refuses append-mode files. Only this sink writes the file, or only the
        # program does (`start`: where raw.log ended when the program was given it; see `caught_up`).
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        end = os.lseek(self._fd, 0, os.SEEK_END)
        self.bytes_written = end if start is None else start
        self._read_fd = -1
        self._echo = echo
        self.first_offset = self.bytes_written
        self.journal = self.path.with_name(CHUNKS_JOURNAL)
        self._journal_fd = os.open(self.journal, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._lock = threading.Lock()
        self.echo_failed = False

    def write(self, chunk: bytes) -> None:
        if not chunk:
            return
        t = time.time()
        # The lock keeps a late writer (a source that could not be interrupted) off a closed descriptor.
        with self._lock:
            if self._fd < 0:
                raise OSError(f"{RAW_LOG} is closed")
            write_all(self._fd, chunk)
            write_all(self._journal_fd, JOURNAL_RECORD.pack(t, self.bytes_written, len(chunk)))
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
                raise OSError(f"{RAW_LOG} is closed")
            n = os.splice(fd, self._fd, max_bytes)
            if n:
                write_all(self._journal_fd, JOURNAL_RECORD.pack(time.time(), self.bytes_written, n))
                self.bytes_written += n
        return n

    def caught_up(self) -> int:
        """When the program writes raw.log itself: note what it added since the last call (its arrival time
        is now) and echo it. Returns the count of new bytes."""
        with self._lock:
            if self._fd < 0:
                return 0
            size = os.fstat(self._fd).st_size
            start = self.bytes_written
            if size <= start:
                return 0
            write_all(self._journal_fd, JOURNAL_RECORD.pack(time.time(), start, size - start))
            self.bytes_written = size
        if self._echo is not None and not self.echo_failed:
            if self._read_fd < 0:
                self._read_fd = os.open(self.path, os.O_RDONLY)
            at = start
            while at < size:
                try:
                    data = os.pread(self._read_fd, min(size - at, 1 << 20), at)
                    if not data:
                        break
                    at += len(data)
                    self._echo(data)
                except OSError:  # a closed terminal must not stop the capture itself
                    self.echo_failed = True
                    break
        return size - start

    @property
    def echoing(self) -> bool:
        return self._echo is not None

    def close(self, chunks_path: Path | None = None) -> None:
        with self._lock:
            if self._fd < 0:
                return
            # No fsync: what was written survives the wrapper's own death in the page cache, as a plain
            # `CMD > file` does; forcing 200 MB to disk at the end cost the run 0.2 s for nothing more.
            os.close(self._fd)
            os.close(self._journal_fd)
            if self._read_fd >= 0:
                os.close(self._read_fd)
            self._fd = -1
        if chunks_path is not None:
            tmp = Path(str(chunks_path) + ".tmp")
            load_chunks(self.path.parent).to_parquet(tmp, index=False)
            os.replace(tmp, chunks_path)
            self.journal.unlink()
