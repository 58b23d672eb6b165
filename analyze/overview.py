"""The numbers at the top of a triage: batches per side, errors, resets, draft acceptance, first divergence."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from analyze.positions import Divergence, choose_axis, first_divergence

RESET_KINDS = ("reset",)


@dataclass(slots=True)
class Acceptance:
    accepted: int
    drafted: int
    source: str  # which log lines it came from

    @property
    def rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


@dataclass(slots=True)
class Overview:
    n_batches: int
    n_target: int
    n_drafter: int
    n_unknown: int
    n_errors: int
    n_resets: int
    acceptance: Acceptance | None
    first_divergence: Divergence | None

    @property
    def acceptance_text(self) -> str:
        a = self.acceptance
        if a is None:
            return "not in the log"
        rate = f"{a.rate:.1%}" if a.rate is not None else "n/a"
        return f"{rate} ({a.accepted} accepted / {a.drafted} drafted, {a.source})"


def details(events: pd.DataFrame) -> list[dict]:
    """The events' `detail` JSON, decoded (a malformed one reads as empty)."""
    out = []
    for text in events["detail"]:
        try:
            value = json.loads(text) if isinstance(text, str) and text else {}
        except ValueError:
            value = {}
        out.append(value if isinstance(value, dict) else {})
    return out


def _int(d: dict, *keys: str) -> int | None:
    for key in keys:
        try:
            return int(float(d[key]))
        except (KeyError, TypeError, ValueError):
            continue
    return None


def acceptance(result: object) -> Acceptance | None:
    """Draft acceptance: the log's own totals (the last statistics line) if printed, else per-cycle sums."""
    ev = result.events  # type: ignore[attr-defined]
    stats = ev[ev["kind"] == "draft_stats"]
    for d in reversed(details(stats)):
        acc = _int(d, "accepted", "acc_tokens")
        gen = _int(d, "generated", "gen_tokens", "produced")
        if acc is not None and gen is not None:
            return Acceptance(acc, gen, "statistics line")
    cycles = ev[ev["kind"] == "accepted"]
    pairs = [(_int(d, "accepted"), _int(d, "drafted")) for d in details(cycles)]
    pairs = [(a, g) for a, g in pairs if a is not None and g is not None]
    if pairs:
        return Acceptance(sum(a for a, _ in pairs), sum(g for _, g in pairs), f"{len(pairs)} cycles")
    return None


def overview(result: object) -> Overview:
    b = result.batches  # type: ignore[attr-defined]
    ctx = b["context"].value_counts() if len(b) else pd.Series(dtype="int64")
    ev = result.events  # type: ignore[attr-defined]
    verdict = result.verdict  # type: ignore[attr-defined]
    seq = None if verdict.seq_id is None else int(verdict.seq_id)
    return Overview(
        n_batches=len(b),
        n_target=int(ctx.get("target", 0)),
        n_drafter=int(ctx.get("drafter", 0)),
        n_unknown=int(ctx.get("unknown", 0)),
        n_errors=len(result.errors),  # type: ignore[attr-defined]
        n_resets=int(ev["kind"].isin(RESET_KINDS).sum()) if len(ev) else 0,
        acceptance=acceptance(result),
        first_divergence=first_divergence(result, seq, choose_axis(result)),
    )
