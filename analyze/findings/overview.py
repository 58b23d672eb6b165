"""The numbers at the top of a triage: batches per side, errors, resets, draft acceptance, first divergence.

Counts and acceptance come from the reader's verdict (one definition); this adds the per-side batch
counts and the first divergence, which need the position tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from kvtrace.analyze.findings.positions import Divergence, choose_axis, first_divergence
from kvtrace.analyze.reader.definitions import SYNTHETIC_NOTE

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult
    from kvtrace.analyze.reader.verdict import AcceptanceSummary



@dataclass(slots=True)
class Overview:
    n_batches: int
    n_target: int
    n_drafter: int
    n_unknown: int
    n_errors: int
    n_resets: int
    acceptance: AcceptanceSummary
    first_divergence: Divergence | None

    @property
    def acceptance_text(self) -> str:
        a = self.acceptance
        if not a:
            return "not in the log"
        rate = f"{a['rate']:.1%}" if a.get("rate") is not None else "n/a"
        text = f"{rate} ({a.get('accepted')} accepted / {a.get('generated')} drafted)"
        return f"{text}: {SYNTHETIC_NOTE}" if a.get("synthetic") else text


def overview(result: ParseResult) -> Overview:
    b = result.batches
    # per batch, not per row: a batch of several sequences has a row each, and the parts should add up to
    # the batch count beside them
    ctx = b.drop_duplicates("batch")["context"].value_counts() if len(b) else pd.Series(dtype="int64")
    verdict = result.verdict
    seq = None if verdict.seq_id is None else int(verdict.seq_id)
    return Overview(
        n_batches=int(verdict.n_batches or len(b)),
        n_target=int(ctx.get("target", 0)),
        n_drafter=int(ctx.get("drafter", 0)),
        n_unknown=int(ctx.get("unknown", 0)),
        n_errors=int(verdict.n_errors),
        n_resets=int(verdict.n_resets),
        acceptance=verdict.acceptance.copy(),
        first_divergence=first_divergence(result, seq, choose_axis(result)),
    )
