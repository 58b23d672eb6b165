"""A log's chunks into the walker, in either format: text as it is, llama.cpp's JSON log (analyze/reader/jsonl.py)
converted to the text it stands for from its first object on, and at the end the records put on the file's lines."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kvtrace.analyze.reader.jsonl import JsonlLog, holds_objects
from kvtrace.analyze.reader.normalize import clean_chunk
from kvtrace.analyze.reader.walker import Walker


def feed_log(w: Walker, text: str) -> None:
    """A chunk of the log into the walker: as it is, or from the first JSON object on, converted."""
    j = w.jsonl
    if j is None:
        if not holds_objects(text):
            w.feed_text(text)
            return
        w.jsonl = j = JsonlLog(w.n_lines, w.n_lines)
    converted = j.convert(text)
    if converted:
        w.feed_text(clean_chunk(converted))


def close_log(w: Walker) -> None:
    """The end of the log: the line still open handed on, the walker closed, its records put on the file's lines."""
    j = w.jsonl
    if j is not None and (rest := j.flush()):
        w.feed_text(clean_chunk(rest))
    w.close()
    if j is not None:
        _renumber(w, j)


@contextmanager
def file_numbered(w: Walker) -> Iterator[None]:
    """The walker's records on the file's lines while the block runs, back on the read lines after it (a live
    snapshot: feeding goes on afterwards)."""
    j = w.jsonl
    if j is None or not j.lines.read:
        yield
        return
    saved = (w.batches.line, w.kv.line, w.failures, w.events, w.n_lines)
    _renumber(w, j, copy=True)
    try:
        yield
    finally:
        w.batches.line, w.kv.line, w.failures, w.events, w.n_lines = saved


def _renumber(w: Walker, j: JsonlLog, copy: bool = False) -> None:
    """Every record's line numbers from read lines to file lines (`copy`: new records, the walker's own left as
    they were)."""
    from array import array
    from copy import copy as shallow

    w.n_lines = j.file_line
    if not j.lines.read:
        return
    to_file = j.lines.file_line
    w.batches.line = array("q", j.lines.file_lines(w.batches.line))
    w.kv.line = array("q", j.lines.file_lines(w.kv.line))
    failures = [shallow(f) for f in w.failures] if copy else w.failures
    for f in failures:
        f.line, f.last_line = to_file(f.line), to_file(f.last_line)
        if f.evidence_line is not None:
            f.evidence_line = to_file(f.evidence_line)
        f.lines = [(to_file(n), text) for n, text in f.lines]
    w.failures = failures
    events = [shallow(e) for e in w.events] if copy else w.events
    for e in events:
        e.line = to_file(e.line)
    w.events = events


def merged(first: JsonlLog | None, other: JsonlLog | None) -> JsonlLog | None:
    """Two pieces' JSONL records as one (either may have seen no object)."""
    if other is None:
        return first
    if first is None:
        return other
    first.merge(other)
    return first


__all__ = ["close_log", "feed_log", "file_numbered", "merged"]
