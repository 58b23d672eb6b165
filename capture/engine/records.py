"""What the engine records: one row per llama_decode call (ground_truth.parquet), one per draft/verify cycle,
and the result a capture returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtrace.capture.engine.config import EngineConfig

GROUND_TRUTH_COLUMNS = (
    "decode",
    "line",
    "context",
    "seq_id",
    "n_tokens",
    "pos_min",
    "pos_max",
    "ret",
    "target_kv_min",
    "target_kv_max",
    "drafter_kv_min",
    "drafter_kv_max",
    "step",
    "fault",
)
# What each decode was: the target's prompt chunks and verify batches; DFlash's injection of the target's
# layer inputs (an embedding batch) and its noise block; draft-simple's draft and commit decodes.
STEPS = ("prompt", "verify", "inject", "noise", "draft", "commit")
# `fault`: the silent fault (config.SILENT_FAULTS) in force at this decode, "" before its onset and for the others:
# the onset the health findings are held to is its first row


@dataclass(slots=True)
class DecodeRecord:
    """One `llama_decode` call, as the API saw it (a row of ground_truth.parquet)."""

    decode: int
    line: int
    context: str
    seq_id: int
    n_tokens: int
    pos_min: int
    pos_max: int
    ret: int
    target_kv_min: int
    target_kv_max: int
    drafter_kv_min: int
    drafter_kv_max: int
    step: str
    fault: str = ""


@dataclass(slots=True)
class CycleRecord:
    """One draft/verify cycle: what was drafted and accepted, and both caches' max position after it."""

    request: int
    task: int
    cycle: int
    pos: int  # n_past at the start of the cycle: where the draft and verify batches start
    n_draft: int  # tokens drafted (0 when the drafter's batch was refused)
    n_accepted: int
    draft_ret: int
    target_kv_max: int
    drafter_kv_max: int


@dataclass(slots=True)
class EngineResult:
    session: Path
    config: EngineConfig
    decodes: list[DecodeRecord]
    cycles: list[CycleRecord]
    n_requests: int
    duration_s: float
    drafted: int
    accepted: int
    layout: dict[str, Any] = field(default_factory=dict)  # RunDevices.layout: the RPC devices, what each model got

    @property
    def n_decodes(self) -> int:
        return len(self.decodes)

    @property
    def n_failures(self) -> int:
        return sum(1 for d in self.decodes if d.ret != 0)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "session": str(self.session),
            "fault": self.config.fault,
            "requests": self.n_requests,
            "cycles": len(self.cycles),
            "decodes": self.n_decodes,
            "failures": self.n_failures,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": round(self.acceptance, 5),
            "duration_s": round(self.duration_s, 3),
        } | ({"layout": self.layout} if self.layout else {})
