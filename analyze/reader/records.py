"""The records the walker produces, before they become tables.

Batches and find_slot rows can number in the millions for a big log, so they are kept column-wise in
compact arrays; failures and events are few and kept as small records.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    import pandas as pd

NA = -(2**63)  # a missing integer inside an array('q')

# severity of a failure kind: a failure keeps the most serious kind any of its lines showed
SEVERITY = {"inconsistent_positions": 4, "decode_failed": 3, "kv_slot": 2, "load": 1, "assert": 1, "error": 1}

MAX_EVIDENCE = 12
PROSE_ACCEPTANCE = "prose_acceptance"  # an event: a draft acceptance told in the report's words, not a log line's
# an event: an n-gram implementation drafted a step of a log that also runs a drafter (a comma-combined type)
NGRAM_DRAFT = "ngram_draft"
KEEP_LINES_FOR = 1000  # failures that keep their text; later ones keep only counts and evidence (flat memory)


@dataclass(slots=True)
class Failure:
    """One failed decode (or crash): the lines that llama.cpp and its caller printed for it."""

    line: int
    t: float
    kind: str
    variant: str = ""
    words: str = ""  # what its first line says, in the words that tell one bug from another (patterns.failure_words)
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
    # what shows it (analyze/reader/proof.py): a llama.cpp line ("log", every table entry's), a runtime's own log
    # words ("runtime") or only a sentence of the report ("prose"), as the concept layer tells them apart
    proof: str = "log"

    def add_line(self, no: int, text: str) -> None:
        self.last_line = no
        if self.keep_lines and len(self.lines) < MAX_EVIDENCE:
            self.lines.append((no, text))


@dataclass(slots=True)
class Event:
    """One event line. What consumers read is decoded here, once; `detail` keeps every field as JSON text
    for export (a dict per event would dominate memory on a big log)."""

    line: int
    t: float
    kind: str
    context: str
    seq_id: int | None
    pos: int | None
    detail: str  # JSON object
    pattern: str = ""  # the pattern table entry that matched
    slot: int | None = None  # the server slot and task the line names
    task: int | None = None
    accepted: int | None = None  # draft tokens accepted and drafted, whatever the wording (draft_counts)
    generated: int | None = None


@dataclass(slots=True)
class LiveStats:
    """A live parse's running counts (`StreamParser.stats`): what a capture's status line shows."""

    lines: int = 0
    batches: int = 0
    errors: int = 0  # failures seen, the one still being assembled included
    position_errors: int = 0  # of those, the ones with a position-error block
    target_pos: int | None = None  # the latest stored KV max (or batch position) of each context, once seen
    drafter_pos: int | None = None


# The wordings a log may tell its draft totals in besides the per-request line, each the patterns that together make
# one count (a pretty-printed response's `draft_n` and `draft_n_accepted` lines, the 2023 example's `n_drafted` and
# `n_accept`), in the order one is chosen where no draft_acceptance line is there: one wording counts, never two,
# since they tell the same drafts again. `statistics <impl>:` (spec_statistics) is the implementation's running
# total (b11434 prints it server-wide after each request), so its last line per implementation counts.
WORDINGS: tuple[tuple[str, ...], ...] = (
    ("spec_statistics",), ("json_draft_n", "json_draft_accepted"), ("dflash_histogram",),
    ("cli_drafted", "cli_accept"), ("adaptive_depth", "adaptive_depth_seq"),
    ("template_stats",), ("prose_stats",), ("json_n_draft",),  # a script, a wrapper or a fork, its own way
)
RUNNING_TOTALS = "spec_statistics"
SUMMED_STATS: tuple[str, ...] = tuple(p for wording in WORDINGS for p in wording)


class ContextSeen(TypedDict):
    """A context (or KV cache) the log created, in order: `meta["contexts"]`."""

    kind: str  # "context" or "kv_cache": the line that told its size
    size: int
    after_draft_marker: bool  # created after speculative decoding was announced (the drafter's, likely)


class Meta(TypedDict, total=False):
    """What a log says about its run, keyed as ParseResult.meta and the meta table hold it. The walker fills the
    first group from meta lines; the table builder adds the second (tables.build_meta)."""

    versions: list[dict[str, str]]  # each version or build line's fields
    backends: list[str]
    gpus: list[dict[str, Any]]  # a device as its lines told it: index, name, backend, device, memory... (devices.py)
    contexts: list[ContextSeen]
    spec_impls: list[str]
    flags: dict[str, str | bool]  # command-line flags the log shows: a flag's value, True for a bare one
    told_flags: list[str]  # those of `flags` only a sentence of the report named, never a command (walker.add_flags)
    placement: dict[str, Any]  # split mode, tensor split, and per model its devices' layers and buffers (devices.py)
    rope: list[str]
    arch: list[str]
    mrope: bool
    n_devices: dict[str, int]  # per backend, the device count its init line printed
    source: str
    bytes: int
    lines: int
    recognised_lines: int
    speculative: bool
    spec_type: str
    drafter_kv: str
    context_sizes: dict[str, str]  # a find_slot cache size -> the context it was mapped to
    context_attribution: str
    n_gpus: int
    batch_debug: bool
    kv_cache_debug: bool
    warnings: list[str]
    spec_none: bool  # the server said it chose no speculative type (spec.py's NO_TYPE)
    log_format: str  # "jsonl" (llama.cpp's --log-jsonl, analyze/reader/jsonl.py) or "text"
    log_jsonl: dict[str, Any]  # a JSON log's object counts and typed events ({} for text)
    fit_memory_breakdown: list[Any]  # the data of each fit_memory_breakdown event


def verify_steps(events: pd.DataFrame) -> pd.DataFrame:
    """The events of the log's verify steps, one per step. Under LLAMA_TRACE the server prints every step at
    INFO, `accepted  A/ N draft tokens` (no position); with `-v` it also prints most of them again at DEBUG,
    `accepted A/N draft tokens, new n_tokens = P` (it skips the step that ends a request). So where the first
    wording is there it alone counts the steps, else the second."""
    steps = events[events["kind"] == "accepted"]
    traced = steps[steps["pos"].isna()]
    return traced if len(traced) else steps


def int_or_none(v: Any) -> int | None:
    """A detail field as an int, or None where it is missing or not a number."""
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def draft_counts(kind: str, pattern: str, detail: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(accepted, generated) draft tokens of a draft statistic or a verify step, from its own wording's fields;
    None where the line does not say."""
    if kind == "accepted":  # the server's per-step `accepted N/M draft tokens`
        return int_or_none(detail.get("accepted")), int_or_none(detail.get("drafted"))
    if kind != "draft_stats":
        return None, None
    if pattern == "spec_statistics":
        return int_or_none(detail.get("acc_tokens")), int_or_none(detail.get("gen_tokens"))
    if pattern == "draft_acceptance":
        return int_or_none(detail.get("accepted")), int_or_none(detail.get("generated"))
    if pattern in SUMMED_STATS:
        generated = detail.get("generated", 0) or detail.get("produced", 0) or detail.get("generated_n", 0)
        return int_or_none(detail.get("accepted", 0) or detail.get("accepted_n", 0)), int_or_none(generated)
    return None, None


def detail_of(text: object) -> dict[str, Any]:
    """An event's `detail` JSON, decoded (a missing or malformed one reads as empty): for consumers that
    need a field no column carries, or the whole thing (trace export)."""
    try:
        value = json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def lines_of(text: object) -> list[tuple[int, str]]:
    """A failure's `lines` JSON (line number, text), decoded (a missing or malformed one reads as empty)."""
    try:
        value = json.loads(text) if isinstance(text, str) and text else []
    except ValueError:
        return []
    return [(int(n), str(t)) for n, t in value] if isinstance(value, list) else []


# analyze/reader/_skim.c appends rows to BatchColumns and KvColumns column by column, in these orders
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
    import pandas as pd  # here, not above: a capture's wrapper reads LiveStats from this module, not tables

    return None if v is None or pd.isna(v) else int(v)


CONTEXT_CODES = {"unknown": 0, "target": 1, "drafter": 2}
CONTEXT_NAMES = {v: k for k, v in CONTEXT_CODES.items()}
