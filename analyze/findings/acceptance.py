"""Draft acceptance as people watch it: over time, per draft position, per request and per slot, from the log's
lines and, where the capture scraped them, the server's own counters (metrics.parquet).

The log's witnesses (docs/llama-cpp-lines.md#the-servers-lines): per verify step `accepted N/M draft tokens`
(every step with LLAMA_TRACE=1; the `-v` wording skips the step that ends a request), per request `draft
acceptance = R (A accepted / G generated)`. A request is a (slot, task) pair: the server numbers tasks once per process.

Acceptance at draft position k means what llama-server's `acc per pos` and its
`spec_decode_num_accepted_tokens_per_pos_total{position=k-1}` mean: the share of drafts whose k-th token was
accepted (all drafts in the denominator, so the positions fall off as a draft's accepted prefix ends).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from kvtrace.analyze.findings.counters import COUNTERS, line_arrivals, read_metrics
from kvtrace.analyze.reader.records import verify_steps
from kvtrace.analyze.reader.session import folder_of

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult

PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
TIME_BUCKETS = 60  # the log's steps over time, summed into about this many buckets
LISTED = 5  # the slowest and the worst requests listed
REQUEST_COLUMNS = ("slot", "task", "line", "t_start", "t_end", "seconds", "drafted", "accepted", "rate")


@dataclass(slots=True)
class Acceptance:
    """Everything the acceptance views draw. Times are seconds from `t0`: the capture's clock (unix seconds,
    the lines' arrival) when the session scraped /metrics, so both series share one axis, else the log's own
    timestamps."""

    log_over_time: pd.DataFrame  # t (bucket middle), drafted, accepted, rate
    server_over_time: pd.DataFrame | None  # t (scrape), drafted, accepted, rate: what the counters added since the last
    per_position: list[float]  # from the log's steps, position 1 first
    server_per_position: list[float] | None
    requests: pd.DataFrame  # one row per request: REQUEST_COLUMNS
    slots: pd.DataFrame  # slot, requests, drafted, accepted, rate, seconds (mean per request)
    clock: str  # "capture" (seconds since the capture's first scrape or line) or "log" (the log's timestamps)
    steps: int = 0  # verify steps the log prints
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (len(self.log_over_time) or len(self.requests) or self.per_position
                    or (self.server_over_time is not None and len(self.server_over_time)))

    def worst(self, n: int = LISTED) -> pd.DataFrame:
        """The requests that accepted the smallest share of what they drafted (those that drafted)."""
        r = self.requests[self.requests["drafted"] > 0]
        return r.sort_values(["rate", "drafted"], ascending=[True, False], kind="stable").head(n)

    def slowest(self, n: int = LISTED) -> pd.DataFrame:
        """The requests that took longest, first log line to last (on the log's own clock)."""
        r = self.requests[self.requests["seconds"].notna()]
        return r.sort_values("seconds", ascending=False, kind="stable").head(n)


def _steps(ev: pd.DataFrame) -> pd.DataFrame:
    return verify_steps(ev)  # LLAMA_TRACE's line where there, printed for every step


def _rate(accepted: np.ndarray, drafted: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(drafted > 0, accepted / np.maximum(drafted, 1), np.nan)


def _per_position(steps: pd.DataFrame) -> list[float]:
    acc = steps["accepted"].to_numpy(dtype=np.float64, na_value=np.nan)
    drafted = steps["generated"].to_numpy(dtype=np.float64, na_value=np.nan)
    ok = np.isfinite(acc) & np.isfinite(drafted) & (drafted > 0)
    acc, drafted = acc[ok], drafted[ok]
    if not acc.size:
        return []
    return [float((acc >= k).mean()) for k in range(1, int(drafted.max()) + 1)]


def _over_time(t: np.ndarray, acc: np.ndarray, drafted: np.ndarray) -> pd.DataFrame:
    ok = np.isfinite(t) & np.isfinite(acc) & np.isfinite(drafted)
    t, acc, drafted = t[ok], acc[ok], drafted[ok]
    if not t.size:
        return pd.DataFrame({"t": [], "drafted": [], "accepted": [], "rate": []}, dtype="float64")
    lo, hi = float(t.min()), float(t.max())
    width = (hi - lo) / TIME_BUCKETS if hi > lo else 1.0
    bucket = np.minimum(((t - lo) / width).astype(np.int64), TIME_BUCKETS - 1)
    g = pd.DataFrame({"b": bucket, "drafted": drafted, "accepted": acc}).groupby("b", sort=True).sum()
    mids = lo + (g.index.to_numpy(dtype=np.float64) + 0.5) * width if hi > lo else np.full(len(g), lo)
    d, a = g["drafted"].to_numpy(np.float64), g["accepted"].to_numpy(np.float64)
    return pd.DataFrame({"t": mids, "drafted": d, "accepted": a, "rate": _rate(a, d)})


def _requests(ev: pd.DataFrame, steps: pd.DataFrame, t: pd.Series) -> pd.DataFrame:
    """One row per (slot, task): the per-request line's counts where it printed one, else its steps' sums.
    `t_start` and `t_end` are on the views' clock (`t`); `seconds` is the request's span on the log's own clock
    (its lines' timestamps), since the capture's clock is when the lines arrived, which on a busy machine is
    a burst a whole request long; on the views' clock only where the log has no timestamps."""
    keyed = ev[ev["slot"].notna() & ev["task"].notna() & (ev["task"] >= 0)]
    if not len(keyed):
        return pd.DataFrame({c: [] for c in REQUEST_COLUMNS})
    times = t.loc[keyed.index]
    span = pd.DataFrame({"slot": keyed["slot"].astype("int64"), "task": keyed["task"].astype("int64"),
                         "line": keyed["line"].astype("int64"), "t": times.astype("float64"),
                         "own": keyed["t"].astype("float64")})
    g = span.groupby(["slot", "task"], sort=False)
    out = g.agg(line=("line", "min"), t_start=("t", "min"), t_end=("t", "max"), own_start=("own", "min"),
                own_end=("own", "max"))
    per_request = ev[(ev["kind"] == "draft_stats") & (ev["pattern"] == "draft_acceptance")
                     & ev["slot"].notna() & ev["task"].notna()]
    s = steps[steps["slot"].notna() & steps["task"].notna()]
    summed = s.assign(slot=s["slot"].astype("int64"), task=s["task"].astype("int64")).groupby(
        ["slot", "task"])[["generated", "accepted"]].sum()
    own = per_request.assign(slot=per_request["slot"].astype("int64"), task=per_request["task"].astype("int64"))
    own = own.groupby(["slot", "task"])[["generated", "accepted"]].last()
    counts = summed.astype("float64")
    if len(own):
        counts = own.astype("float64").combine_first(counts)
    out = out.join(counts, how="left")
    out = out[out["generated"].notna()]  # a request that drafted nothing the log counts is no row here
    out = out.rename(columns={"generated": "drafted"}).reset_index()
    out["drafted"] = out["drafted"].astype("int64")
    out["accepted"] = out["accepted"].fillna(0).astype("int64")
    out["seconds"] = (out["own_end"] - out["own_start"]).fillna(out["t_end"] - out["t_start"])
    out["rate"] = _rate(out["accepted"].to_numpy(np.float64), out["drafted"].to_numpy(np.float64))
    return out[list(REQUEST_COLUMNS)].sort_values("line", kind="stable").reset_index(drop=True)


def _slots(requests: pd.DataFrame) -> pd.DataFrame:
    if not len(requests):
        return pd.DataFrame({c: [] for c in ("slot", "requests", "drafted", "accepted", "rate", "seconds")})
    g = requests.groupby("slot", sort=True).agg(requests=("task", "size"), drafted=("drafted", "sum"),
                                                accepted=("accepted", "sum"), seconds=("seconds", "mean"))
    g["rate"] = _rate(g["accepted"].to_numpy(np.float64), g["drafted"].to_numpy(np.float64))
    return g.reset_index()[["slot", "requests", "drafted", "accepted", "rate", "seconds"]]


def _server(metrics: pd.DataFrame) -> tuple[pd.DataFrame, list[float] | None]:
    """What the counters added between scrapes, and the last scrape's acceptance per position."""
    names = [COUNTERS["draft_tokens"], COUNTERS["accepted_tokens"], COUNTERS["drafts"]]
    rows = metrics[metrics["name"].isin(names)]
    wide = rows.pivot_table(index="t", columns="name", values="value", aggfunc="last").reindex(columns=names)
    wide = wide.sort_index().ffill().fillna(0)
    d = wide[COUNTERS["draft_tokens"]].diff().to_numpy(np.float64)[1:]
    a = wide[COUNTERS["accepted_tokens"]].diff().to_numpy(np.float64)[1:]
    t = wide.index.to_numpy(np.float64)[1:]
    if len(wide) == 1:  # one scrape: its totals, at its time
        t, d, a = wide.index.to_numpy(np.float64), wide.iloc[:, 0].to_numpy(np.float64), wide.iloc[:, 1].to_numpy(
            np.float64)
    moved = d > 0
    over = pd.DataFrame({"t": t[moved], "drafted": d[moved], "accepted": a[moved], "rate": _rate(a[moved], d[moved])})
    per = metrics[metrics["name"] == PER_POS]
    positions: list[float] | None = None
    drafts = float(wide[COUNTERS["drafts"]].iloc[-1]) if len(wide) else 0.0
    if len(per) and drafts > 0:
        last = per[per["t"] == per["t"].max()]
        by_pos = {int(json.loads(str(lab)).get("position", -1)): float(v)
                  for lab, v in zip(last["labels"], last["value"], strict=True)}
        n = max(by_pos) + 1 if by_pos else 0
        positions = [by_pos.get(k, 0.0) / drafts for k in range(n)] if n > 0 else None
    return over, positions


def acceptance(result: ParseResult, folder: Path | None = None) -> Acceptance:
    """The acceptance views' data for one parsed log (`folder`: its session, else the one the log lies in)."""
    ev = result.events
    steps = _steps(ev)
    notes: list[str] = []
    if len(steps) and steps["pos"].notna().all():
        notes.append("the log's per-step lines are the -v wording, which skips the step that ends a request")
    folder = folder if folder is not None else folder_of(Path(result.source)) if result.source else None
    metrics = read_metrics(folder) if folder is not None else None
    t = ev["t"].astype("float64")
    clock = "log"
    server_over: pd.DataFrame | None = None
    server_pos: list[float] | None = None
    if metrics is not None and folder is not None and len(metrics):
        server_over, server_pos = _server(metrics)
        first_scrape = float(metrics["t"].min())
        arrivals = line_arrivals(folder, ev["line"].to_numpy(dtype=np.int64)) if len(ev) else None
        if arrivals is not None:
            t, clock = pd.Series(arrivals, index=ev.index, dtype="float64"), "capture"
            first_scrape = min(first_scrape, float(np.nanmin(arrivals)))
        else:
            notes.append("the log's lines carry no arrival times: its series keeps the log's clock, the counters "
                         "are drawn from their first scrape")
        server_over = server_over.assign(t=server_over["t"] - first_scrape)
        t0 = first_scrape if clock == "capture" else 0.0
    else:
        t0 = 0.0
    t = t - t0
    over = _over_time(t.loc[steps.index].to_numpy(np.float64), steps["accepted"].to_numpy(np.float64, na_value=np.nan),
                      steps["generated"].to_numpy(np.float64, na_value=np.nan))
    requests = _requests(ev, steps, t)
    return Acceptance(over, server_over, _per_position(steps), server_pos, requests, _slots(requests), clock,
                      len(steps), notes)


# ---- the log's verify steps, one row each, and the per-step histogram ------------------------------------

STEP_COLUMNS = ["line", "t", "slot", "task", "accepted", "drafted"]


def step_table(events: pd.DataFrame) -> pd.DataFrame:
    """One row per verify step the log prints (`accepted N/M draft tokens`): LLAMA_TRACE's line where the log
    has it (every step), else the -v wording (which skips the step that ends a request). Slot -1: none named."""
    steps = _steps(events)
    steps = steps[steps["generated"].notna() & (steps["generated"] > 0)]
    return pd.DataFrame({
        "line": steps["line"].astype("int64"), "t": steps["t"].astype("float64"),
        "slot": steps["slot"].fillna(-1).astype("int64"), "task": steps["task"].fillna(-1).astype("int64"),
        "accepted": steps["accepted"].fillna(0).astype("int64"), "drafted": steps["generated"].astype("int64"),
    }, columns=STEP_COLUMNS).sort_values("line", kind="stable").reset_index(drop=True)


def step_histogram(events: pd.DataFrame) -> list[dict[str, Any]]:
    """"Accepted exactly j of n", counted from the log's per-step lines (never made up from totals): one entry
    per draft size n, `steps[j]` the verify steps that accepted exactly j of n drafted tokens."""
    steps = step_table(events)
    out = []
    for key, rows in steps.groupby("drafted", sort=True):
        n = int(cast(int, key))
        counts = np.bincount(np.clip(rows["accepted"].to_numpy(np.int64), 0, int(n)), minlength=int(n) + 1)
        out.append({"drafted": int(n), "steps": [int(c) for c in counts]})
    return out
