"""The log's draft counts held against the server's own: llama-server's /metrics, scraped by the capture into
the session's metrics.parquet (capture/metrics.py).

What each side counts (measured on llama-server b11434, draft-simple, three requests: 70 drafted, 43 accepted,
25 drafts on all three witnesses):
- /metrics: `spec_decode_num_draft_tokens_total` (tokens drafted), `..._num_accepted_tokens_total` (accepted by
  the target) and `..._num_drafts_total` (verify steps), added when a request ends.
- the log, per verify step: `accepted N/M draft tokens` (INF, printed only with LLAMA_TRACE=1) counts every
  step: N and M sum to the counters, the lines to the drafts. The `-v` wording (`accepted N/M draft tokens,
  new n_tokens = P`) is not printed for the step that ends a request, so it undercounts; it is not compared.
- the log, per request: `draft acceptance = R (A accepted / G generated)` sums to the token counters exactly;
  it does not count steps (its `mean len` is rounded), so drafts are left uncompared. A request cancelled
  mid-stream (`stop: cancel task`) prints none, though the counters hold its drafts: its steps count it (measured
  on the matrix's draft-simple-cancel without LLAMA_TRACE: 2499 drafted, 1185 accepted on both sides).
Each response's `timings.draft_n` / `draft_n_accepted` sum to the same two token counters (the scenario matrix,
tests/tools/test_scenarios.py, holds all three equal on every drafting type; the n-gram types draft nothing
from its short prompts: counters 0, no `accepted` line, no `draft_n`).

What the drafts counter says the batches add up to (measured on the matrix, b11434): one target verification
per draft, that sequence's rows (the draft plus the sampled token) in a batch whose every row is an output;
fewer such shapes only where slots share a batch with another's prompt. DFlash's drafter decodes one noise
block of the same shape per draft; draft-simple's drafter wants one output per step, so none has that shape;
EAGLE3's drafter has a few more than its drafts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from kvtrace.analyze.reader.records import verify_steps
from kvtrace.analyze.reader.session import KEY_METRICS, METRICS, folder_of, load_chunks, log_of, read_manifest
from kvtrace.analyze.reader.verdict import per_request_counts

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult

COUNTERS: dict[str, str] = {
    "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "llamacpp:spec_decode_num_accepted_tokens_total",
    "drafts": "llamacpp:spec_decode_num_drafts_total",
}
_SLACK_S = 0.1  # a line's arrival time is when the capture noticed it (it polls the file), a little late
PER_STEP = "per-step lines (LLAMA_TRACE=1)"
PER_REQUEST = "per-request `draft acceptance` lines"
NO_STEPS = ("the log counts verify steps only with LLAMA_TRACE=1 (the -v line `accepted N/M draft tokens, new "
            "n_tokens` is not printed for the step that ends a request)")


@dataclass(slots=True)
class ServerCounters:
    """Each count as {"log": N, "server": M} (None where that side does not count it); `agree` over the counts
    both sides have (None when none can be compared, `note` says why)."""

    draft_tokens: dict[str, int | None]
    accepted_tokens: dict[str, int | None]
    drafts: dict[str, int | None]
    agree: bool | None
    window: str  # "whole run", or the part both cover
    log_source: str | None  # which log lines were counted
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def disagreements(self) -> list[str]:
        """The counts that differ, as `name: log N, server M`."""
        return [f"{name.replace('_', ' ')}: log {c['log']}, server {c['server']}"
                for name, c in (("draft_tokens", self.draft_tokens), ("accepted_tokens", self.accepted_tokens),
                                ("drafts", self.drafts))
                if c["log"] is not None and c["server"] is not None and c["log"] != c["server"]]


def read_metrics(folder: Path) -> pd.DataFrame | None:
    """A session's metrics.parquet (t, name, labels, value), None when the capture recorded none."""
    path = Path(folder) / METRICS
    if not path.is_file():
        return None
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError):
        return None


def _scrapes(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per scrape (t), one column per counter of COUNTERS (NaN where a scrape lacked it)."""
    rows = metrics[metrics["name"].isin(list(COUNTERS.values()))]
    wide = rows.pivot_table(index="t", columns="name", values="value", aggfunc="last")
    return wide.reindex(columns=list(COUNTERS.values())).sort_index()


def line_arrivals(folder: Path, lines: np.ndarray) -> np.ndarray | None:
    """When each of these log lines (1-based) reached the capture (unix s), from its chunk arrival times;
    None when the session has none."""
    chunks = load_chunks(folder)
    raw = log_of(folder)
    if chunks.empty or not raw.is_file() or raw.stat().st_size == 0:
        return None
    data = np.memmap(raw, dtype=np.uint8, mode="r")
    newlines = np.flatnonzero(data == 10)
    idx = np.clip(lines.astype(np.int64) - 1, 0, None)
    ends = np.where(idx < len(newlines), newlines[np.minimum(idx, max(len(newlines) - 1, 0))], len(data) - 1)
    chunk_ends = (chunks["offset"] + chunks["nbytes"]).to_numpy(dtype=np.int64)
    at = np.minimum(np.searchsorted(chunk_ends, ends, side="right"), len(chunk_ends) - 1)
    return np.asarray(chunks["t"].to_numpy(dtype=np.float64)[at])


def _log_rows(result: ParseResult) -> tuple[pd.DataFrame, str | None, list[str]]:
    ev = result.events
    steps = ev[ev["kind"] == "accepted"]
    traced = verify_steps(ev)
    if len(traced) and traced["pos"].isna().all():  # LLAMA_TRACE's lines: every step
        return traced, PER_STEP, []
    per_request, from_steps = per_request_counts(ev)
    if len(per_request):
        notes = [NO_STEPS]
        if from_steps:
            notes.append(f"{from_steps} request{'s' if from_steps > 1 else ''} printed no per-request line (a "
                         f"cancelled request prints none) and {'are' if from_steps > 1 else 'is'} counted from "
                         "the per-step lines")
        return per_request, PER_REQUEST, notes
    if len(steps):
        return steps.iloc[0:0], None, [NO_STEPS + "; the log has no per-request lines either"]
    return steps, None, ["the log has no acceptance lines"]


def server_counters(result: ParseResult, folder: Path | None = None) -> ServerCounters | None:
    """The log's drafted, accepted and draft counts beside the server's; None when the session recorded no
    /metrics (`folder`: the session folder, else the one the parsed log lies in)."""
    folder = folder if folder is not None else folder_of(Path(result.source)) if result.source else None
    metrics = read_metrics(folder) if folder is not None else None
    if metrics is None or folder is None:
        return None
    scrapes = _scrapes(metrics).dropna(how="all")
    if scrapes.empty:
        return None
    first, last = scrapes.iloc[0].fillna(0), scrapes.iloc[-1].fillna(0)
    t_first, t_last = float(scrapes.index[0]), float(scrapes.index[-1])
    rows, source, notes = _log_rows(result)
    scraped = read_manifest(folder).get(KEY_METRICS) or {}
    from_start = isinstance(scraped, dict) and scraped.get("from_start") is True
    ended_early = isinstance(scraped, dict) and bool(scraped.get("note"))
    # a server running before the capture had counted drafts already: only what both saw can be compared
    started_before = not from_start and bool((first > 0).any())
    window = "whole run"
    if (started_before or ended_early) and source is not None:
        times = line_arrivals(folder, rows["line"].to_numpy(dtype=np.int64))
        if times is None:
            source = None
            notes.append("the log's lines carry no arrival times to cut the window the scrapes cover")
        else:
            lo = t_first if started_before else -np.inf
            rows = rows[(times > lo) & (times <= t_last + _SLACK_S)]
            window = f"{'from the first' if started_before else 'up to the last'} scrape"
            notes.append("a request in flight at the window's edge may be counted on one side only")
    if ended_early:
        notes.append(f"the scraping ended early: {scraped['note']}")
    if result.truncated:
        notes.append("the log was read only in part: its counts miss what was not read")
    server = {name: int(last[c] - first[c]) if started_before else int(last[c]) for name, c in COUNTERS.items()}
    log: dict[str, int | None] = {"draft_tokens": None, "accepted_tokens": None, "drafts": None}
    if source is not None:
        log["draft_tokens"] = int(rows["generated"].fillna(0).sum())
        log["accepted_tokens"] = int(rows["accepted"].fillna(0).sum())
        log["drafts"] = len(rows) if source == PER_STEP else None
    pairs = {name: {"log": log[name], "server": server[name]} for name in COUNTERS}
    compared = [p["log"] == p["server"] for p in pairs.values() if p["log"] is not None]
    agree = (all(compared) if compared else None) if not result.truncated else None
    return ServerCounters(pairs["draft_tokens"], pairs["accepted_tokens"], pairs["drafts"], agree, window, source,
                          notes)
