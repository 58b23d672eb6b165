"""The embedded engine: real speculative decoding through llama-cpp-python on tiny generated models.

`config` holds the settings and needs no llama.cpp; the rest loads lazily, so the command line can show
the engine's choices without importing llama.cpp or numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from kvtrace.capture.engine.config import DRAFTING, FAULTS, SPLIT_MODES, EngineConfig, EngineError

if TYPE_CHECKING:
    from kvtrace.capture.engine.records import GROUND_TRUTH_COLUMNS, EngineResult
    from kvtrace.capture.engine.writer import engine_models, run_engine

_LAZY = {"GROUND_TRUTH_COLUMNS": "kvtrace.capture.engine.records", "EngineResult": "kvtrace.capture.engine.records",
         "engine_models": "kvtrace.capture.engine.writer", "run_engine": "kvtrace.capture.engine.writer"}

__all__ = ["DRAFTING", "FAULTS", "GROUND_TRUTH_COLUMNS", "SPLIT_MODES", "EngineConfig", "EngineError",
           "EngineResult", "engine_models", "run_engine"]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
