"""kvtrace's reader: llama.cpp logs (raw or pasted into a bug report) -> position tables and a verdict.

    >>> from kvtrace import analyze
    >>> result = analyze.parse("sessions/…/raw.log")
    >>> result.verdict.summary, result.batches.head()

The public names load on first use, so `import analyze` (and the command line) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult, StreamParser, parse, write_tables
    from kvtrace.analyze.reader.records import LiveStats
    from kvtrace.analyze.reader.source import FileTail, InputError
    from kvtrace.analyze.reader.stream import LiveParser
    from kvtrace.analyze.reader.verdict import Verdict

_LAZY = {"ParseResult": "kvtrace.analyze.reader.parser", "StreamParser": "kvtrace.analyze.reader.parser",
         "parse": "kvtrace.analyze.reader.parser", "write_tables": "kvtrace.analyze.reader.parser",
         "LiveParser": "kvtrace.analyze.reader.stream",  # the walker alone, no pandas: a capture's live parse
         "FileTail": "kvtrace.analyze.reader.source", "InputError": "kvtrace.analyze.reader.source",
         "Verdict": "kvtrace.analyze.reader.verdict",
         # light: a capture's wrapper reads it without loading the reader
         "LiveStats": "kvtrace.analyze.reader.records"}

__all__ = ["FileTail", "InputError", "LiveParser", "LiveStats", "ParseResult", "StreamParser", "Verdict", "parse",
           "write_tables"]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
