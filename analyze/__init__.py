"""kvtrace's reader: llama.cpp logs (raw or pasted into a bug report) -> position tables and a verdict.

    >>> import analyze
    >>> result = analyze.parse("sessions/…/raw.log")
    >>> result.verdict.summary, result.batches.head()

The public names load on first use, so `import analyze` (and the command line) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analyze.reader.parser import ParseResult, StreamParser, parse, write_tables
    from analyze.reader.records import LiveStats
    from analyze.reader.source import FileTail, InputError
    from analyze.reader.stream import LiveParser
    from analyze.reader.verdict import Verdict

_LAZY = {"ParseResult": "analyze.reader.parser", "StreamParser": "analyze.reader.parser",
         "parse": "analyze.reader.parser", "write_tables": "analyze.reader.parser",
         "LiveParser": "analyze.reader.stream",  # the walker alone, no pandas: a capture's live parse
         "FileTail": "analyze.reader.source", "InputError": "analyze.reader.source",
         "Verdict": "analyze.reader.verdict",
         "LiveStats": "analyze.reader.records"}  # light: a capture's wrapper reads it without loading the reader

__all__ = ["FileTail", "InputError", "LiveParser", "LiveStats", "ParseResult", "StreamParser", "Verdict", "parse",
           "write_tables"]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
