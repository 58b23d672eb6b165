"""What a healthy run looks like, per speculative type: the checks the scenario matrix holds real captures to.

A healthy capture has no failure, no divergence (first divergence none, no stretch apart on any sequence),
failing side none, and a drafter in step with the target (null for n-gram types, which have no drafter).
Attribution is checked against what the log's own structure says: DFlash's noise block (`<mask>` tokens)
and its `[embd]` injection rows are the drafter's; n-gram runs have no drafter at all.
"""

from __future__ import annotations

import gzip
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtrace.analyze.findings.cycles import cycle_stats
from kvtrace.analyze.findings.overview import overview
from kvtrace.analyze.findings.positions import apart, apart_stretches, choose_axis, default_tolerance, sequences
from kvtrace.analyze.reader.spec import NONE, keeping

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult


@dataclass(slots=True)
class Health:
    spec_type: str
    drafter_kv: str
    verdict: str
    failing_side: str  # "none" when nothing failed
    n_errors: int
    first_divergence: int | None  # its line
    n_apart: int  # stretches apart, all sequences
    drafter_in_step: bool | None
    in_step_fraction: float | None
    n_cycles: int
    batches: dict[str, int] = field(default_factory=dict)
    structure: dict[str, int] = field(default_factory=dict)  # attribution against the log's structure

    @property
    def healthy(self) -> bool:
        in_step_ok = self.drafter_in_step is None if self.drafter_kv == NONE else self.drafter_in_step is True
        return (self.n_errors == 0 and self.failing_side == "none" and self.first_divergence is None
                and self.n_apart == 0 and in_step_ok)

    def problems(self) -> list[str]:
        out = []
        if self.n_errors:
            out.append(f"{self.n_errors} failures ({self.verdict}, {self.failing_side})")
        if self.first_divergence is not None:
            out.append(f"first divergence at line {self.first_divergence}")
        if self.n_apart:
            out.append(f"{self.n_apart} stretches apart")
        if self.drafter_kv == NONE and self.drafter_in_step is not None:
            out.append(f"in step is {self.drafter_in_step} for a type without a drafter")
        elif self.drafter_kv != NONE and self.drafter_in_step is not True:
            out.append(f"drafter in step: {self.drafter_in_step} ({self.in_step_fraction} of {self.n_cycles})")
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"healthy": self.healthy}


def health(result: ParseResult) -> Health:
    ov = overview(result)
    axis = choose_axis(result)
    tol = default_tolerance(result)
    n_apart = sum(len(apart_stretches(result, apart(result, s, axis), tol)) for s in sequences(result))
    c = cycle_stats(result)
    v = result.verdict
    failing = v.component if len(result.errors) else "none"
    counts = result.batches["context"].astype(str).value_counts().to_dict()
    return Health(
        spec_type=str(result.meta.get("spec_type", "")), drafter_kv=keeping(result.meta), verdict=v.kind,
        failing_side=failing, n_errors=len(result.errors),
        first_divergence=None if ov.first_divergence is None else ov.first_divergence.line, n_apart=n_apart,
        drafter_in_step=c.drafter_in_step, in_step_fraction=c.in_step_fraction, n_cycles=c.n_cycles,
        batches={str(k): int(n) for k, n in counts.items()},
    )


# A batch dump's token rows: `ubatch_print:   0: id =      3 (<mask>), pos = ...` or `N: [embd], pos = ...`.
_INPUT = "input batch info"
_MASK = re.compile(r":\s+\d+: id =\s*\d+ \(<mask>\)")
_EMBD = re.compile(r":\s+\d+: \[embd\]")


def structural_drafter_lines(raw: Path) -> set[int]:
    """Line numbers of the input-batch dumps that are the drafter's by construction: a DFlash noise block
    (it holds `<mask>` tokens) or an embedding injection (`[embd]` rows). Read from the raw text, apart from
    the reader, so it can check the reader's attribution. Only the input batch is read, not its ubatches."""
    out: set[int] = set()
    current = 0
    in_input = False
    with open(raw, "rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    with (gzip.open(raw, "rb") if gz else open(raw, "rb")) as f:  # noqa: SIM115 - either kind of file
        for no, data in enumerate(f, 1):
            line = data.decode("utf-8", "replace")
            if _INPUT in line:
                current, in_input = no, True
            elif "added ubatch to split" in line or "find_slot" in line:
                in_input = False
            elif in_input and (_MASK.search(line) or _EMBD.search(line)):
                out.add(current)
    return out


def check_structure(result: ParseResult, raw: Path) -> dict[str, int]:
    """Batches the structure names (drafter by construction; for n-gram types every batch is the target's)
    against the reader's attribution: how many right, wrong and unknown."""
    b = result.batches
    ctx = b["context"].astype(str).to_numpy()
    lines = b["line"].to_numpy()
    if keeping(result.meta) == NONE:
        truth = {int(n): "target" for n in lines}
    else:
        truth = dict.fromkeys(structural_drafter_lines(raw), "drafter")
    right = wrong = unknown = 0
    for line, c in zip(lines, ctx, strict=True):
        want = truth.get(int(line))
        if want is None:
            continue
        if c == "unknown":
            unknown += 1
        elif c == want:
            right += 1
        else:
            wrong += 1
    return {"known": right + wrong + unknown, "right": right, "wrong": wrong, "unknown": unknown}
