"""kvtrace's capture side: wrap a llama.cpp program or attach to a running one, keep its log byte-exact in a
session folder with a manifest, and reproduce the failure with the embedded engine.

    >>> from kvtrace import capture
    >>> outcome = capture.run_wrapped(["llama-server", "-m", "t.gguf"], capture.RunOptions())
    >>> outcome = capture.run_attach(capture.FileSource(Path("server.log")), capture.CaptureOptions())
    >>> outcome.reason, outcome.session, outcome.startup_lines

Nothing here prints a summary: the calls return an Outcome, and what happens while a capture runs goes to
the Terminal passed in (by default, messages on stderr and no echo).
The public names load on first use, so the command line's `--help` never imports the capture machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvtrace.analyze.reader.session import Session, is_session, list_sessions, load_chunks, new_session
    from kvtrace.capture.attach import FileSource, LlamaSwapStream, StdinSource, UrlSource
    from kvtrace.capture.engine import EngineConfig, EngineError, EngineResult, run_engine
    from kvtrace.capture.models import ModelPair, ensure_models
    from kvtrace.capture.monitor import Terminal
    from kvtrace.capture.runner import Outcome
    from kvtrace.capture.wrap import CaptureOptions, RunOptions, UsageError, run_attach, run_llama_swap, run_wrapped

_LAZY = {
    **dict.fromkeys(("FileSource", "LlamaSwapStream", "StdinSource", "UrlSource"), "kvtrace.capture.attach"),
    **dict.fromkeys(("EngineConfig", "EngineError", "EngineResult", "run_engine"), "kvtrace.capture.engine"),
    **dict.fromkeys(("ModelPair", "ensure_models"), "kvtrace.capture.models"),
    "Terminal": "kvtrace.capture.monitor",
    "Outcome": "kvtrace.capture.runner",
    **dict.fromkeys(("Session", "is_session", "list_sessions", "load_chunks", "new_session"),
                    "kvtrace.analyze.reader.session"),
    **dict.fromkeys(("CaptureOptions", "RunOptions", "UsageError", "run_attach", "run_llama_swap", "run_wrapped"),
                    "kvtrace.capture.wrap"),
}

__all__ = [
    "CaptureOptions", "EngineConfig", "EngineError", "EngineResult", "FileSource", "LlamaSwapStream", "ModelPair",
    "Outcome", "RunOptions", "Session", "StdinSource", "Terminal", "UrlSource", "UsageError", "ensure_models",
    "is_session", "list_sessions", "load_chunks", "new_session", "run_attach", "run_engine", "run_llama_swap",
    "run_wrapped",
]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
