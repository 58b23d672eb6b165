"""kvtrace's reader: llama.cpp logs (raw or pasted into a bug report) -> position tables and a verdict.

    >>> import analyze
    >>> result = analyze.parse("sessions/…/raw.log")
    >>> result.verdict.summary, result.batches.head()
"""

from analyze.parse import ParseResult, StreamParser, parse, write_tables
from analyze.reader import InputError
from analyze.verdict import Verdict

__all__ = ["InputError", "ParseResult", "StreamParser", "Verdict", "parse", "write_tables"]
