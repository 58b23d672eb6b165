"""The reader's public entry points: parse a whole source, or feed a live stream."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
import tempfile
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from kvtrace.analyze.reader.feed import close_log, feed_log, file_numbered
from kvtrace.analyze.reader.normalize import decode
from kvtrace.analyze.reader.session import KEY_COMMAND_LINE, VERDICT, folder_of, read_manifest, table_file
from kvtrace.analyze.reader.source import (
    CHUNK,
    GzipReader,
    InputError,
    Opened,
    Source,
    iter_chunks,
    open_source,
    resolve_path,
)
from kvtrace.analyze.reader.stream import LiveParser
from kvtrace.analyze.reader.tables import build_all
from kvtrace.analyze.reader.thread import Thread
from kvtrace.analyze.reader.verdict import Verdict, decide
from kvtrace.analyze.reader.walker import Walker

if TYPE_CHECKING:
    from kvtrace.analyze.reader.links import LinkPolicy
    from kvtrace.analyze.reader.records import Meta
    from kvtrace.analyze.reader.split import PieceMap

TABLES = ("batches", "kv", "errors", "events")


@dataclass(slots=True)
class ParseResult:
    batches: pd.DataFrame
    kv: pd.DataFrame
    errors: pd.DataFrame
    events: pd.DataFrame
    meta: Meta
    verdict: Verdict
    source: str = ""
    warnings: list[str] = field(default_factory=list)
    truncated: bool = False  # the input was read only in part (its warnings say why)
    thread: Thread | None = None  # the input was a GitHub thread's JSON: which lines came from which part
    # derived tables computed once per result (positions per sequence and axis): the dashboard, the report and
    # the overview ask for the same ones several times in one page run
    derived: dict[Hashable, pd.DataFrame] = field(default_factory=dict, repr=False, compare=False)

    @property
    def lines(self) -> int:
        return int(self.meta.get("lines", 0))

    def tables(self) -> dict[str, pd.DataFrame]:
        return {name: getattr(self, name) for name in TABLES} | {"meta": meta_table(self.meta)}


def meta_table(meta: Meta) -> pd.DataFrame:
    return pd.DataFrame({"key": list(meta), "value": [json.dumps(v, default=str) for v in meta.values()]})


class StreamParser(LiveParser):
    """Feed bytes as they arrive (a live capture); ask for running stats; finish into a ParseResult."""

    def snapshot(self) -> ParseResult:
        """The tables so far, without finishing: feeding goes on afterwards as if it had not been asked.

        A live view calls this while the log grows. A failure still open (its caller lines may yet come) is
        included as it stands; the table builders fill in failure sides, so they get copies, and the
        walker's own records stay as the next `feed` expects them. The last, unterminated line waits.
        """
        w = self.walker
        kept = w.failures
        shown = [copy.copy(f) for f in kept]
        if w.open_failure is not None:  # an open failure is already an error seen
            shown.append(copy.copy(w.open_failure))
        w.failures = shown
        try:
            with file_numbered(w):
                return _result(w, self.name, self.n_bytes, list(self.warnings))
        finally:
            w.failures = kept

    def finish(self) -> ParseResult:
        if self._carry:
            self.feed_text(decode(self._carry) + "\n")
            self._carry = b""
        close_log(self.walker)
        return _result(self.walker, self.name, self.n_bytes, self.warnings)


def _result(w: Walker, name: str, n_bytes: int, warnings: list[str], truncated: bool = False,
            thread: Thread | None = None) -> ParseResult:
    t = build_all(w, name, n_bytes, warnings)
    verdict = decide(t["errors"], t["events"], t["meta"], int(t["batches"].batch.nunique()), name,
                     truncated=truncated)
    if thread is not None:  # the deciding line first: the part it was pasted in is where the evidence is from
        lines = [verdict.component_evidence] if verdict.component_evidence is not None else []
        verdict.thread = thread.describe(lines + [int(e["line"]) for e in verdict.evidence])
    return ParseResult(t["batches"], t["kv"], t["errors"], t["events"], t["meta"], verdict, name, warnings, truncated,
                       thread)


def parse(source: Source, *, name: str | None = None, progress: bool = False, jobs: int = 1,
          piece_bytes: int | None = None, map_pieces: PieceMap | None = None,
          links: LinkPolicy | None = None) -> ParseResult:
    """Parse a whole log: a path (a session folder means its raw.log), `-`, bytes or a binary file.

    `jobs` > 1 reads a big log file on that many processes (analyze/reader/split.py; a .gz is unpacked to a
    temporary file first), with the same tables as a serial read; `piece_bytes` forces its pieces' size
    (tests cut small logs into many pieces); `map_pieces` runs the pieces elsewhere (a cluster's workers);
    `links`: a GitHub thread's linked logs are fetched and read with it (analyze/reader/links.py), never by default."""
    opened = open_source(source, name, links)
    if ((jobs > 1 or piece_bytes) and opened.thread is None and isinstance(source, str | os.PathLike)
            and str(source) != "-"):
        from kvtrace.analyze.reader.split import split_walk

        with contextlib.ExitStack() as stack:
            if isinstance(opened.stream, GzipReader):
                plain = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvtrace-"))) / "unpacked.log"
                _unpack(opened, plain)
            else:
                opened.stream.close()
                plain = resolve_path(source)
            split = split_walk(plain, jobs, piece_bytes, map_pieces)
        if split is not None:
            walker, warnings = split
            _manifest_flags(source, walker)
            return _result(walker, opened.name, opened.size or 0, opened.warnings + warnings, opened.truncated)
        # too small to split, or one of the cases only a serial read gets right
        opened = open_source(source, name, links)
    walker = Walker()
    if opened.thread is not None:
        walker.part_starts = frozenset(opened.thread.first_lines)
    bar = None
    if progress and (opened.size is None or opened.size > 32 << 20):
        from tqdm import tqdm

        bar = tqdm(total=opened.size, unit="B", unit_scale=True, desc=Path(opened.name).name, file=sys.stderr,
                   leave=False)
    n_bytes = 0
    try:
        for text in iter_chunks(opened):  # chunks end on a line break, all but the log's last
            feed_log(walker, text)
            if bar is not None:
                pos = opened.raw.tell() if hasattr(opened.raw, "tell") else 0
                bar.update(pos - bar.n)
            n_bytes += len(text)
    except MemoryError:
        raise InputError(f"{opened.name}: out of memory while reading") from None
    finally:
        if bar is not None:
            bar.close()
        if opened.stream is not sys.stdin.buffer:
            opened.stream.close()
    close_log(walker)
    _manifest_flags(source, walker)
    size = opened.size if opened.size is not None else n_bytes
    return _result(walker, opened.name, size, opened.warnings, opened.truncated, opened.thread)


@dataclass(slots=True)
class Head:
    """The start of a log parsed as if the log ended there (`parse_head`): what a chart of it so far shows."""

    result: ParseResult
    read: int  # bytes of the log's text read (a .gz's unpacked bytes)
    size: int | None  # the source's bytes in all (a .gz's packed bytes; None when unknown)
    whole: bool  # the source ended within the head: `result` is the whole log


def parse_head(source: Source, *, max_bytes: int, name: str | None = None) -> Head:
    """Parse a log's first `max_bytes` of text (whole lines, a little past it) as a log that ends there.

    A big upload's first chart is drawn from it while the whole log is parsed (the dashboard); its verdict and
    tables are of the head only, so nothing but a chart labelled as partial should read them. A GitHub thread is
    read whole (its parts are one document)."""
    opened = open_source(source, name)
    walker = Walker()
    if opened.thread is not None:
        walker.part_starts = frozenset(opened.thread.first_lines)
    n_bytes, whole = 0, True
    try:
        for text in iter_chunks(opened):
            feed_log(walker, text)
            n_bytes += len(text)
            if n_bytes >= max_bytes and opened.thread is None:
                whole = False
                break
    except MemoryError:
        raise InputError(f"{opened.name}: out of memory while reading") from None
    finally:
        if opened.stream is not sys.stdin.buffer:
            opened.stream.close()
    close_log(walker)
    size = opened.size if opened.size is not None else n_bytes
    return Head(_result(walker, opened.name, size, opened.warnings, not whole or opened.truncated, opened.thread),
                n_bytes, opened.size, whole)


def _unpack(opened: Opened, path: Path) -> None:
    """A .gz's bytes into a plain file the split parse can cut (what GzipReader reads, warnings and all)."""
    try:
        with open(path, "wb") as out:
            while data := opened.stream.read(CHUNK):
                out.write(data)
    except OSError as exc:
        raise InputError(f"{opened.name}: cannot unpack it to read it in pieces ({exc.strerror or exc})") from None
    finally:
        opened.stream.close()


def _manifest_flags(source: Source, walker: Walker) -> None:
    """A capture session's raw.log does not hold the command line; its manifest does. The flags the log never
    prints (`-sm`, `-ts`, `-devd`) are read from there, where the log did not show them itself."""
    if not isinstance(source, str | os.PathLike) or str(source) == "-":
        return
    folder = folder_of(Path(source))
    line = read_manifest(folder).get(KEY_COMMAND_LINE) if folder is not None else None
    if not isinstance(line, str):
        return
    walker.add_flags(line, only_new=True, told=False)


def write_tables(result: ParseResult, out_dir: Path) -> list[Path]:
    """One Parquet file per table, plus the verdict as JSON."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, df in result.tables().items():
        path = out_dir / table_file(name)
        df.to_parquet(path, index=False)
        written.append(path)
    path = out_dir / VERDICT
    path.write_text(json.dumps(result.verdict.to_dict(), indent=2) + "\n", encoding="utf-8")
    written.append(path)
    return written
