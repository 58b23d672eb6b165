"""The streaming reader: any source (path, `-`, bytes, a file object, `.gz`, a session folder) as chunks
of whole lines of text, in bounded memory whatever the input (no newline for 100 MB, NUL bytes, invalid
UTF-8, a truncated gzip).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, cast

from kvtrace.analyze.reader.normalize import clean_chunk, decode
from kvtrace.analyze.reader.session import RAW_LOG, log_of

if TYPE_CHECKING:
    from kvtrace.analyze.reader.links import LinkPolicy
    from kvtrace.analyze.reader.thread import Thread

CHUNK = 64 << 10  # small enough to stay in cache: 4 MB chunks cost a third more on page faults alone
MAX_LINE = 1 << 20  # longer lines are cut here: no llama.cpp line is anywhere near this long

Source = str | os.PathLike[str] | bytes | bytearray | BinaryIO


class InputError(Exception):
    """The input could not be read at all. The message is one line that says what to do."""


@dataclass(slots=True)
class Opened:
    stream: BinaryIO
    name: str
    size: int | None  # bytes on disk, for progress; None when unknown (stdin, pipes)
    raw: BinaryIO  # the underlying file, whose position tracks progress through a .gz
    warnings: list[str] = field(default_factory=list)
    truncated: bool = False  # only part of the input could be read (a .gz cut short, a read error, a shrunk file)
    thread: Thread | None = None  # a GitHub thread's JSON: `stream` is then its parts' text (analyze/reader/thread.py)

    def read_in_part(self, what: str) -> None:
        """The input stopped early: say so once per cause and keep what was read."""
        self.truncated = True
        self.warnings.append(f"{self.name}: {what}; read what was there")


def resolve_path(source: str | os.PathLike[str]) -> Path:
    """A path to a log; a session folder means its raw.log."""
    path = Path(source)
    if path.is_dir():
        raw = log_of(path)
        if raw.is_file():
            return raw
        raise InputError(f"{path} is a folder without {RAW_LOG}; pass a log file or a session folder")
    if not path.exists():
        raise InputError(f"{path}: no such file; pass a log file, a session folder or - for stdin")
    return path


def open_source(source: Source, name: str | None = None, links: LinkPolicy | None = None) -> Opened:
    """`links`: a GitHub thread's linked logs are fetched into it under this policy (never by default)."""
    if isinstance(source, bytes | bytearray):
        raw: BinaryIO = io.BytesIO(bytes(source))
        return _maybe_gzip(Opened(raw, name or "<bytes>", len(source), raw), links=links)
    if hasattr(source, "read"):
        stream = cast(BinaryIO, source)
        return _maybe_gzip(Opened(stream, name or str(getattr(stream, "name", "<stream>")), None, stream),
                           links=links)
    if str(source) == "-":
        stdin = sys.stdin.buffer
        return _maybe_gzip(Opened(stdin, name or "<stdin>", None, stdin), links=links)
    given, issue = str(source), None
    if "#" in given and not Path(given).exists() and Path(given.rsplit("#", 1)[0]).is_file():
        given, issue = given.rsplit("#", 1)  # `issues.json#28`: one issue of a list of issues
    path = resolve_path(given)
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the caller through Opened.stream
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    label = f"{path}#{issue}" if issue is not None else str(path)
    return _maybe_gzip(Opened(fh, name or label, path.stat().st_size, fh), issue, links)


def _maybe_gzip(opened: Opened, issue: str | None = None, links: LinkPolicy | None = None) -> Opened:
    """Decompress when the bytes say gzip (not the file name: pastes get renamed)."""
    stream = opened.stream
    if not hasattr(stream, "peek"):  # anything with peek will do (BufferedReader, GzipFile, ...)
        stream = cast(BinaryIO, io.BufferedReader(cast(io.RawIOBase, stream)))
    head = cast(io.BufferedReader, stream).peek(2)[:2]
    opened.stream = cast(BinaryIO, GzipReader(stream, opened)) if head == b"\x1f\x8b" else stream
    return _maybe_thread(opened, issue, links)


def _maybe_thread(opened: Opened, issue: str | None = None, links: LinkPolicy | None = None) -> Opened:
    """A GitHub thread's JSON (by content) is read as its parts' text, `issue` the one of a list of issues to read;
    any other input is left as it is. (A gzip is not looked into: its reader keeps what a truncation left, and a
    thread is never that big.)"""
    from kvtrace.analyze.reader.thread import MAX_THREAD, decode_json, issues_of, looks_like_json, thread_of

    stream = opened.stream
    if isinstance(stream, GzipReader) or not looks_like_json(cast(io.BufferedReader, stream).peek(64)[:64]):
        if issue is not None:
            stream.close()
            raise InputError(f"{opened.name}: not a list of GitHub issues; pass the file without #{issue}")
        return opened
    data = stream.read(MAX_THREAD + 1)
    doc = decode_json(data) if len(data) <= MAX_THREAD else None  # decoded once: a thread, a list of issues, or none
    issues = issues_of(doc)
    if issue is not None:
        thread = issues.get(issue)
        if thread is None:
            stream.close()
            if issues:
                raise InputError(f"{opened.name}: no issue {issue} in this list of GitHub issues; pass the file "
                                 "alone to read every issue in it")
            if thread_of(doc) is not None:
                raise InputError(f"{opened.name}: this file is one GitHub thread, not a list of issues; pass it "
                                 f"without #{issue}")
            raise InputError(f"{opened.name}: not a list of GitHub issues; pass the file without #{issue}")
    else:
        thread = thread_of(doc)
        if thread is None and issues:
            opened.warnings.append(f"{opened.name}: a list of {len(issues)} GitHub issues, read here as one text; "
                                   "kvtrace triage --table FILE reads each issue as its own report")
    if thread is None:  # JSON of another kind, or too big to be a thread: its bytes are the log
        opened.stream = cast(BinaryIO, io.BufferedReader(_Chain(data, stream)))
        return opened
    if links is not None:
        from kvtrace.analyze.reader.links import fetch_links

        fetch_links(thread, links)
    text = thread.text().encode("utf-8")
    if stream is not sys.stdin.buffer:
        stream.close()
    opened.stream = opened.raw = io.BytesIO(text)
    opened.size = len(text)
    opened.thread = thread
    return opened


class _Chain(io.RawIOBase):
    """Bytes already read, then the rest of the stream they came from."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        self._head = memoryview(head)  # handed out by offset: slicing bytes copied the rest on every read
        self._at = 0
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._at < len(self._head):
            n = min(len(buffer), len(self._head) - self._at)
            buffer[:n] = self._head[self._at: self._at + n]
            self._at += n
            return n
        data = self._rest.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if self._rest is not sys.stdin.buffer:
            self._rest.close()
        super().close()


class GzipReader(io.RawIOBase):
    """gzip decompression that keeps every byte it got before a truncation or corruption (GzipFile
    throws away the block it was decoding), and reads concatenated members."""

    def __init__(self, raw: BinaryIO, opened: Opened) -> None:
        self._raw = raw
        self._opened = opened
        self._z = zlib.decompressobj(wbits=31)
        self._fed = False  # the current member got bytes (a complete file ends between members)
        self._done = False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        out = b""
        while not self._done and (size < 0 or len(out) < size):
            data = self._z.unconsumed_tail or self._raw.read(1 << 20)
            if not data:
                if self._fed and not self._z.eof:
                    self._warn("compressed data ends early")
                self._done = True
                break
            self._fed = True
            try:
                out += self._z.decompress(data, max(0, size - len(out)) if size > 0 else 0)
            except zlib.error as exc:
                self._warn(f"corrupt compressed data ({exc})")
                self._done = True
                break
            if self._z.eof:
                rest = self._z.unused_data
                self._z = zlib.decompressobj(wbits=31)
                self._fed = bool(rest.lstrip(b"\x00"))
                if self._fed:
                    out += self._z.decompress(rest)
        return out

    def _warn(self, what: str) -> None:
        self._opened.read_in_part(what)

    def close(self) -> None:
        self._raw.close()
        super().close()


def iter_chunks(opened: Opened, chunk_size: int = CHUNK) -> Iterator[str]:
    """Text in chunks that end on a line break (the last one may not), bounded line length."""
    carry = b""
    overlong = False
    read = opened.stream.read
    plain = opened.stream is opened.raw or not isinstance(opened.stream, GzipReader)
    n_read = 0
    while True:
        try:
            data = read(chunk_size)
        except OSError as exc:
            opened.read_in_part(f"read failed ({exc})")
            data = b""
        if not data:
            if plain and opened.size is not None and n_read < opened.size:
                opened.read_in_part(f"the file shrank while it was read ({n_read} of {opened.size} bytes)")
            break
        n_read += len(data)
        cut = data.rfind(b"\n")
        if cut < 0:
            if overlong:
                continue
            carry += data
            if len(carry) > MAX_LINE:
                carry = carry[:MAX_LINE]
                overlong = True
            continue
        head, tail = data[: cut + 1], data[cut + 1 :]
        if overlong:
            # the rest of an overlong line up to its end is dropped; the line itself is kept
            nl = head.find(b"\n")
            head = head[nl:]
            overlong = False
        yield clean_chunk(decode(carry + head))
        carry = tail[:MAX_LINE]
        overlong = len(tail) > MAX_LINE
    if carry:
        yield clean_chunk(decode(carry))


class FileTail:
    """One log file read while something writes it, whatever happens to it meanwhile: truncated in place
    (copytruncate) it is read again from the start; rotated (a new file at the same name) the old one's last
    bytes come first, then the new file; removed, it is waited for. `kvtrace capture attach --follow` and the
    dashboard's live view both read a followed file through this."""

    ROTATED, TRUNCATED, GONE = "rotated", "truncated", "gone"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._f: BinaryIO | None = None

    @property
    def is_open(self) -> bool:
        return self._f is not None

    def open(self, *, at_end: bool = False) -> None:
        """Open the file now; OSError when it cannot be read. `at_end`: skip what it already holds."""
        self._f = open(self.path, "rb")  # noqa: SIM115 - kept open between reads, closed by close()
        if at_end:
            self._f.seek(0, os.SEEK_END)

    def read(self, size: int) -> bytes:
        """What the file got since the last read, at most `size` bytes; b"" when nothing new (then `check`)."""
        return self._f.read(size) if self._f is not None else b""

    def check(self) -> tuple[str | None, bytes]:
        """At the end of the file for now: did it change under us? (ROTATED, TRUNCATED, GONE or None, and the
        bytes the old file got after the last read, which come before anything of the new one.) After
        ROTATED the new file is open, unless it went away again at once: then `is_open` is False until a
        later check opens it."""
        try:
            st = os.stat(self.path)
        except OSError:
            return self.GONE, b""  # moved away or deleted; a new file may come
        if self._f is None:  # the new file after a rotation could not be opened at once (already told)
            with contextlib.suppress(OSError):
                self.open()
            return None, b""
        cur = os.fstat(self._f.fileno())
        if (st.st_ino, st.st_dev) != (cur.st_ino, cur.st_dev):
            rest = self._f.read()
            self._f.close()
            self._f = None
            with contextlib.suppress(OSError):
                self.open()
            return self.ROTATED, rest
        if st.st_size < self._f.tell():
            self._f.seek(0)
            return self.TRUNCATED, b""
        return None, b""

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
