"""The records the walker produces, before they become tables.

Batches and find_slot rows can number in the millions for a big log, so they are kept column-wise in
compact arrays; failures and events are few and kept as small records.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

NA = -(2**63)  # a missing integer inside an array('q')

# severity of a failure kind: a failure keeps the most serious kind any of its lines showed
SEVERITY = {"inconsistent_positions": 4, "decode_failed": 3, "kv_slot": 2, "load": 1, "assert": 1, "error": 1}

MAX_EVIDENCE = 12
KEEP_LINES_FOR = 1000  # failures that keep their text; later ones keep only counts and evidence (flat memory)


@dataclass(slots=True)
class Failure:
    """One failed decode (or crash): the lines that llama.cpp and its caller printed for it."""

    line: int
    t: float
    kind: str
    variant: str = ""
    seq_id: int | None = None
    last_pos: int | None = None
    batch_start: int | None = None
    ret: int | None = None
    component: str = "unknown"
    evidence: str = ""
    evidence_line: int | None = None
    stage: int = 0
    last_line: int = 0
    has_block: bool = False
    block_open: bool = False
    block_closed: bool = False
    batch: int | None = None
    lines: list[tuple[int, str]] = field(default_factory=list)
    keep_lines: bool = True

    def add_line(self, no: int, text: str) -> None:
        self.last_line = no
        if self.keep_lines and len(self.lines) < MAX_EVIDENCE:
            self.lines.append((no, text))


@dataclass(slots=True)
class Event:
    line: int
    t: float
    kind: str
    context: str
    seq_id: int | None
    pos: int | None
    detail: str  # JSON object


@dataclass(slots=True)
class BatchColumns:
    batch: array[int] = field(default_factory=lambda: array("q"))
    line: array[int] = field(default_factory=lambda: array("q"))
    t: array[float] = field(default_factory=lambda: array("d"))
    seq_id: array[int] = field(default_factory=lambda: array("q"))
    n_tokens: array[int] = field(default_factory=lambda: array("q"))
    pos_min: array[int] = field(default_factory=lambda: array("q"))
    pos_max: array[int] = field(default_factory=lambda: array("q"))
    n_outputs: array[int] = field(default_factory=lambda: array("q"))
    embd: array[int] = field(default_factory=lambda: array("b"))
    ok: array[int] = field(default_factory=lambda: array("b"))
    sig: array[int] = field(default_factory=lambda: array("q"))  # which find_slot cache sizes followed it
    hint: array[int] = field(default_factory=lambda: array("b"))  # context named by a caller or slot line
    buf: array[int] = field(default_factory=lambda: array("q"))  # the caller's batch buffer (its `pos` pointer)

    def __len__(self) -> int:
        return len(self.line)


@dataclass(slots=True)
class KvColumns:
    line: array[int] = field(default_factory=lambda: array("q"))
    t: array[float] = field(default_factory=lambda: array("d"))
    cache_size: array[int] = field(default_factory=lambda: array("q"))
    stream: array[int] = field(default_factory=lambda: array("q"))
    seq_id: array[int] = field(default_factory=lambda: array("q"))
    pos_min: array[int] = field(default_factory=lambda: array("q"))
    pos_max: array[int] = field(default_factory=lambda: array("q"))

    def __len__(self) -> int:
        return len(self.line)


def opt_int(v: Any) -> int | None:
    """A table cell as a plain int, or None where it is missing (None, NaN, pd.NA)."""
    return None if v is None or pd.isna(v) else int(v)


CONTEXT_CODES = {"unknown": 0, "target": 1, "drafter": 2}
CONTEXT_NAMES = {v: k for k, v in CONTEXT_CODES.items()}
