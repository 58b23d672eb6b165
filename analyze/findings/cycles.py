"""Draft/verify cycles: is the drafter in step with the target, and how well do its drafts fare.

In step means the DFlash invariant: when the target verifies a block starting at T + 1 (its stored max
is T), the drafter drafted that block from the same place, so one of the drafter's stores since the
previous verification had max T too. Block drafting (one `[id_last, mask x k]` batch) and chain drafting
(k one-token batches, the first at T + 1) both satisfy it; a stale drafter (its batch refused, so no
store at all) or one that was not rolled back (its max above T) does not. From the kv table when the
log has LLAMA_KV_CACHE_DEBUG lines, else from the batch dumps (a batch's first position - 1 is the max
stored before it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from kvtrace.analyze.reader.definitions import CYCLE_BOUNDARIES
from kvtrace.analyze.reader.records import NGRAM_DRAFT, detail_of, int_or_none, verify_steps
from kvtrace.analyze.reader.spec import NONE, keeping

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult


@dataclass(slots=True)
class CycleStats:
    n_cycles: int  # target verifications with a drafter attempt since the previous one
    in_step: int
    source: str  # "kv", "batches" or "" (neither table has both sides)
    first_out_of_step_line: int | None = None
    last_in_step: bool | None = None  # the log's final cycle
    n_verify_steps: int = 0  # server `accepted N/M draft tokens` lines
    mean_accepted_len: float | None = None  # 1 + accepted / verify steps, as llama-server prints it
    acceptance_rate: float | None = None
    accepted_per_position: list[float] = field(default_factory=list)

    @property
    def in_step_fraction(self) -> float | None:
        return round(self.in_step / self.n_cycles, 5) if self.n_cycles else None

    @property
    def drafter_in_step(self) -> bool | None:
        """Every cycle in step (None: no cycles to judge)."""
        return None if not self.n_cycles else self.in_step == self.n_cycles

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"in_step_fraction": self.in_step_fraction, "drafter_in_step": self.drafter_in_step}


def _verifies(b: pd.DataFrame) -> np.ndarray:
    """Whether each batch row verifies drafted tokens: two or more positions of its sequence, and logits for
    more than one token. A prompt wants one output; a target step without a draft decodes one position."""
    span = (pd.to_numeric(b["pos_max"], errors="coerce") - pd.to_numeric(b["pos_min"], errors="coerce")).fillna(0)
    outputs = pd.to_numeric(b["n_outputs"], errors="coerce").fillna(2)  # a paste without the field: assume so
    return ((span >= 1) & (outputs >= 2)).to_numpy(bool)


def _stores(result: ParseResult) -> tuple[pd.DataFrame, str]:
    """Columns line, context, seq_id, stored (the max held just before a store), ok and verify (a target
    store that verifies drafted tokens), from kv or batches."""
    kv = result.kv
    b = result.batches
    b = b[b["pos_min"].notna() & b["seq_id"].notna()]
    if len(kv) and {"target", "drafter"} <= set(kv["context"].astype(str)):
        verify = np.ones(len(kv), dtype=bool)  # no batch dumps: every target store counts
        if len(b):
            # a find_slot row places the latest batch of its sequence dumped above it
            v = _verifies(b)
            seqs = b["seq_id"].to_numpy(np.int64)
            kv_seq = kv["seq_id"].to_numpy(np.int64)
            kv_line = kv["line"].to_numpy(np.int64)
            for seq in np.unique(kv_seq):
                sel = np.flatnonzero(kv_seq == seq)
                mine = np.flatnonzero(seqs == seq)
                lines = b["line"].to_numpy(np.int64)[mine]
                at = np.searchsorted(lines, kv_line[sel], side="right") - 1
                verify[sel] = np.where(at >= 0, v[mine][np.clip(at, 0, None)], True)
        return pd.DataFrame({"line": kv["line"].to_numpy(np.int64), "context": kv["context"].astype(str).to_numpy(),
                             "seq_id": kv["seq_id"].to_numpy(np.int64),
                             "stored": kv["pos_max"].to_numpy(np.int64), "ok": True, "verify": verify}), "kv"
    if len(b) and {"target", "drafter"} <= set(b["context"].astype(str)):
        return pd.DataFrame({"line": b["line"].to_numpy(np.int64), "context": b["context"].astype(str).to_numpy(),
                             "seq_id": b["seq_id"].to_numpy(np.int64),
                             "stored": b["pos_min"].to_numpy(np.int64) - 1,
                             "ok": b["ok"].to_numpy(bool), "verify": _verifies(b)}), "batches"
    return pd.DataFrame(columns=["line", "context", "seq_id", "stored", "ok", "verify"]), ""


def _attempts(result: ParseResult) -> pd.DataFrame:
    """Every drafter batch the log shows, refused or not (a refused one leaves no kv row)."""
    b = result.batches
    d = b[b["context"].astype(str) == "drafter"]
    return pd.DataFrame({"line": d["line"].to_numpy(np.int64),
                         "seq_id": pd.to_numeric(d["seq_id"], errors="coerce").fillna(-1).to_numpy(np.int64)})


def _between(sorted_lines: np.ndarray, lo: int, hi: int) -> bool:
    """Any line strictly between lo and hi (binary search: logs have millions of rows)."""
    return bool(np.searchsorted(sorted_lines, hi, "left") > np.searchsorted(sorted_lines, lo, "right"))


def _in_step(result: ParseResult) -> tuple[int, int, str, int | None, bool | None]:
    stores, source = _stores(result)
    if not source or keeping(result.meta) == NONE:  # n-gram drafting: no drafter context to be in step with
        return 0, 0, "", None, None
    attempts = _attempts(result)
    err = result.errors
    failed = err[(err["component"] == "drafter")]
    ev = result.events
    # A new request (prompt, reset, a cleared cache) is not a draft/verify cycle: the target goes first.
    bounds = np.sort(ev.line[ev["kind"].isin(CYCLE_BOUNDARIES)].to_numpy(dtype=np.int64))
    # a comma-combined type (`ngram-simple,draft-simple`): a step the n-gram implementation drafted is verified
    # with the drafter idle, so it is no drafter cycle (the log does not say whose slot it drafted for: any slot's
    # cycle with one in it is left unjudged)
    ngram = np.sort(ev.line[ev["kind"] == NGRAM_DRAFT].to_numpy(dtype=np.int64))
    n = good = 0
    first_bad: int | None = None
    last: bool | None = None
    for seq, rows in stores.groupby("seq_id", sort=True):
        rows = rows.sort_values("line", kind="stable")
        prev_line = -1
        drafter_stored: list[int] = []
        a_lines = np.sort(attempts.line[attempts.seq_id == seq].to_numpy())
        f_lines = np.sort(failed.line[pd.to_numeric(failed.seq_id, errors="coerce") == seq].to_numpy(dtype=np.int64))
        r_lines = np.sort(rows.line[(rows.context == "drafter") & ~rows.ok.astype(bool)].to_numpy(dtype=np.int64))
        for line, ctx, stored, ok, verify in zip(rows.line, rows.context, rows.stored, rows.ok, rows.verify,
                                                 strict=True):
            if ctx == "drafter":
                if ok:
                    drafter_stored.append(int(stored))
                continue
            if ctx != "target" or not ok:
                continue
            tried = bool(drafter_stored) or _between(a_lines, prev_line, line) or _between(f_lines, prev_line, line)
            # a target step that verifies no draft (the prompt, a token decoded alone) is a cycle only when the
            # drafter's attempt since the previous step was refused (its draft never reached the target)
            refused = _between(f_lines, prev_line, line) or _between(r_lines, prev_line, line)
            if ((verify or refused) and tried and prev_line >= 0 and not _between(bounds, prev_line, line)
                    and not _between(ngram, prev_line, line)):
                n += 1
                hit = int(stored) in drafter_stored
                good += hit
                last = hit
                if not hit and first_bad is None:
                    first_bad = int(line)
            prev_line = int(line)
            drafter_stored = []
    return n, good, source, first_bad, last


def _acceptance_details(result: ParseResult) -> tuple[int, float | None, list[float]]:
    ev = result.events
    steps = verify_steps(ev)  # one per step: LLAMA_TRACE's and -v's lines are the same steps
    n_steps = len(steps)
    mean_len: float | None = None
    per_pos: list[float] = []
    by_impl: dict[str, dict[str, Any]] = {}  # each implementation's last `statistics` line (running totals)
    for text in ev.loc[ev["kind"] == "draft_stats", "detail"]:  # a few lines per request
        d = detail_of(text)
        for key in ("mean_len", "mean_acc_len"):
            if d.get(key):
                mean_len = float(d[key])
        if d.get("acc_per_pos"):
            try:
                per_pos = [float(v) for v in str(d["acc_per_pos"]).split(",") if v.strip()]
            except ValueError:
                per_pos = []
        if d.get("impl") and d.get("calls_a"):
            by_impl[str(d["impl"])] = d
    if len(by_impl) > 1:  # several types (`ngram-simple,draft-simple`): each line is one type's, the run is all
        mean_len, per_pos = _all_types(list(by_impl.values()), mean_len, per_pos)
    if mean_len is None and n_steps:
        acc = int(steps["accepted"].fillna(0).sum())
        mean_len = round(1 + acc / n_steps, 3)
    return n_steps, mean_len, per_pos


def _all_types(lines: list[dict[str, Any]], mean_len: float | None,
               per_pos: list[float]) -> tuple[float | None, list[float]]:
    """The mean accepted length and per-position rates of every type together, from each type's statistics: a
    type's rate at position k is its steps that accepted k or more over its steps (`calls_a`), so weighting each by
    its steps gives the run's (`mean_len` and `per_pos` as they were where a line does not parse)."""
    try:
        steps = [int(d["calls_a"]) for d in lines]
        accepted = [int(d.get("acc_tokens") or 0) for d in lines]
        rates = [[float(v) for v in str(d.get("acc_per_pos") or "").split(",") if v.strip()] for d in lines]
    except ValueError:
        return mean_len, per_pos
    total = sum(steps)
    if not total:
        return mean_len, per_pos
    width = max(len(r) for r in rates)
    combined = [round(sum(r[k] * n for r, n in zip(rates, steps, strict=True) if k < len(r)) / total, 3)
                for k in range(width)]
    return round(1 + sum(accepted) / total, 3), combined


def cycle_stats(result: ParseResult) -> CycleStats:
    n, good, source, first_bad, last = _in_step(result)
    n_steps, mean_len, per_pos = _acceptance_details(result)
    rate = (result.verdict.acceptance or {}).get("rate")
    return CycleStats(n, good, source, first_bad, last, n_steps, mean_len, rate, per_pos)


# ---- adaptive draft depth over time, per slot (`--spec-type draft-mtp-adaptive`): how many tokens the drafter
# drafts, from each `adaptive n : A -> B (seq S, ...)` or `adaptive draft depth seq S: A -> B (...)` line
DEPTH_PATTERNS = ("adaptive_depth", "adaptive_depth_seq")
DEPTH_COLUMNS = ["line", "t", "seq_id", "depth_from", "depth", "n_draft", "n_accepted"]


def depth_series(events: pd.DataFrame) -> pd.DataFrame:
    """One row per depth change, in log order: the slot's depth before and after it, and the draft that decided."""
    rows = events[events["pattern"].isin(DEPTH_PATTERNS)].reset_index(drop=True)
    details = [detail_of(text) for text in rows["detail"]]
    return pd.DataFrame({
        "line": rows["line"].astype("Int64"),
        "t": rows["t"].astype("float64"),
        "seq_id": rows["seq_id"].astype("Int64"),
        "depth_from": pd.array([int_or_none(d.get("n_from")) for d in details], dtype="Int64"),
        "depth": pd.array([int_or_none(d.get("n_to")) for d in details], dtype="Int64"),
        "n_draft": rows["generated"].astype("Int64"),
        "n_accepted": rows["accepted"].astype("Int64"),
    }, columns=DEPTH_COLUMNS)


def depth_text(series: pd.DataFrame) -> str:
    """Per slot: its first and last depth and how often it changed (`seq 0: 1 -> 4, 12 changes`)."""
    parts = []
    for seq, rows in series.groupby("seq_id", sort=True):
        n = len(rows)
        parts.append(f"seq {seq}: {rows['depth_from'].iloc[0]} -> {rows['depth'].iloc[-1]}, "
                     f"{n} change{'s' if n != 1 else ''}")
    return "; ".join(parts)
