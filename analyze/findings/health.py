"""Health findings: a drafter that stopped helping while llama.cpp refused nothing (or long before it did).

Each finding is a level the run itself set and then left, never a low level alone: tiny random drafters and
n-gram drafting on prose accept little from the start, and that is their level, not a fault.
- `acceptance_collapse`: per slot, the share of verify steps that accepted a drafted token falls at one step and
  stays far below the level of the steps before it (a change point in the log's per-step lines; requests as the
  unit where the log prints only per-request lines);
- `slot_skew`: one slot accepts far less than the others of the same server, and its requests' rates sit below
  theirs (a rank test over requests: a difference the prompts explain overlaps);
- `drafting_stopped`: a slot's requests drafted, then its later requests drafted nothing while they generated;
- `drafter_stale`: the drafter's stored position stays put over several drafter batches while the target moves
  on; the onset is where the drafter's cache last moved (where X got stuck), whether or not a refusal follows.
n-gram self-speculation has no drafter state: what it drafts and what is accepted is the text's own repetition,
so none of the four applies to it.

Where the session holds the server's own counts (metrics.parquet, requests.parquet), a finding is held against
them: `confidence` is "high" when they agree, "low" when they contradict, "medium" on the log alone. The
thresholds, and how they were chosen, are in docs/health.md (measured in benchmarks/README.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from kvtrace.analyze.findings.acceptance import step_table
from kvtrace.analyze.findings.counters import COUNTERS, line_arrivals, read_metrics
from kvtrace.analyze.findings.positions import XAxis, sequences, stored_positions
from kvtrace.analyze.reader.records import detail_of, int_or_none
from kvtrace.analyze.reader.session import REQUESTS, folder_of
from kvtrace.analyze.reader.spec import NONE, keeping

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult

FINDINGS = ("acceptance_collapse", "slot_skew", "drafting_stopped", "drafter_stale")
HIGH, MEDIUM, LOW = "high", "medium", "low"

# acceptance_collapse, per-step lines: at least this many verify steps on each side of the change
COLLAPSE_MIN_STEPS = 8
# the later level at most this share of the earlier one
COLLAPSE_RATIO = 1 / 3
# log-likelihood ratio (natural log) of "two levels" over "one level" for the steps that accepted something
COLLAPSE_LLR = 10.0
# per-request lines only: at least this many requests on each side, every later one below every earlier one
COLLAPSE_MIN_REQUESTS = 3
# slot_skew: at least this many drafting requests on the slot and on the others
SKEW_MIN_REQUESTS = 3
SKEW_RATIO = 1 / 3
SKEW_P = 0.01  # one-sided rank-sum test over the requests' rates
# drafting_stopped: later requests with no draft, each generating at least this many tokens
STOP_MIN_REQUESTS = 2
STOP_MIN_GENERATED = 8
STOP_P = 0.01  # the chance of that many draftless requests at the earlier requests' drafting rate
# drafter_stale: drafter observations at one stored position while the target moved this far on
STALE_MIN_OBSERVATIONS = 4
STALE_MIN_ADVANCE = 4


@dataclass(slots=True)
class HealthFinding:
    """One finding: which, where (sequence and slot; llama-server gives slot N sequence N), from which log line
    and time (the log's seconds, None without timestamps), the numbers in the tool's own words, and how sure."""

    finding: str
    seq_id: int | None
    slot: int | None
    onset_line: int
    onset_t: float | None
    evidence: str
    confidence: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def health(result: ParseResult, folder: Path | None = None) -> list[HealthFinding]:
    """Every finding that fires for one parsed log, in line order (`folder`: its session, else the one the log
    lies in). Computed once per result."""
    cache = getattr(result, "derived", None)
    key = ("health", str(folder))
    if cache is not None and key in cache:
        return cast(list[HealthFinding], cache[key])
    found = _health(result, folder)
    if cache is not None:
        cache[key] = found
    return found


def _health(result: ParseResult, folder: Path | None) -> list[HealthFinding]:
    if (result.verdict.acceptance or {}).get("synthetic"):  # the server chose what was accepted
        return []
    folder = folder if folder is not None else folder_of(Path(result.source)) if result.source else None
    server = _ServerSide.read(folder)
    steps = step_table(result.events)
    requests = request_table(result.events)
    found: list[HealthFinding] = []
    found += _collapses(result, steps, requests, server)
    found += _skews(result, requests)
    if keeping(result.meta or {}) != NONE:  # an n-gram drafts only where the text repeats: none is its normal
        found += _stops(result, requests, server)
    found += _stale(result)
    return sorted(found, key=lambda f: (f.onset_line, f.finding))


TITLES = {"acceptance_collapse": "acceptance collapsed", "slot_skew": "one slot accepts far less",
          "drafting_stopped": "drafting stopped", "drafter_stale": "the drafter stopped following the target"}


def health_headline(found: list[HealthFinding]) -> str:
    """A run with findings and no failure, in a few words: never "Healthy"."""
    first = found[0]
    where = f" on slot {first.slot}" if first.slot is not None else ""
    more = f" (+{len(found) - 1} more finding{'s' if len(found) > 2 else ''})" if len(found) > 1 else ""
    return f"Drafter stopped helping: {TITLES[first.finding]}{where} from line {first.onset_line}{more}"


HEALTHY_SUMMARY = "A healthy speculative run"


def restated(summary: str, found: list[HealthFinding]) -> str:
    """The verdict's summary (the reader's words, written before any finding) where a finding fired: a run whose
    drafter stopped helping is not called healthy."""
    if not found or not summary.startswith(HEALTHY_SUMMARY):
        return summary
    names = ", ".join(dict.fromkeys(f.finding for f in found))
    rest = summary[len(HEALTHY_SUMMARY):].replace(", and no failure in the log.", ".").replace(
        ": no failure in the log.", ".")
    return f"A speculative run with no failure in the log, but its drafter stopped helping ({names}; see health){rest}"


# ---- the log's acceptance, per step and per request ----------------------------------------------------------

REQUEST_COLUMNS = ["slot", "task", "line", "t", "prompt", "generated", "drafted", "accepted", "counted"]


def request_table(events: pd.DataFrame) -> pd.DataFrame:
    """One row per request (slot, task) the log opens with `new prompt`: its first line and time, its prompt's
    length in tokens (-1 where the log does not say: what tells two prompts apart here), the tokens it
    generated (`stop processing: n_tokens` less the prompt's; -1 where the log does not say), and what it
    drafted and accepted (its `draft acceptance` line, else its steps; 0 where it printed neither). `counted`:
    the log would show this request's drafts (it ended with a `stop processing` line)."""
    ev = events[events["slot"].notna() & events["task"].notna() & (events["task"] >= 0)]
    opened = ev[ev["kind"] == "new_prompt"]
    if opened.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64" if c == "t" else "bool" if c == "counted" else "int64")
                             for c in REQUEST_COLUMNS})
    key = ["slot", "task"]
    first = opened.groupby(key, sort=False).agg(line=("line", "min"), t=("t", "first"))
    prompt = opened.groupby(key, sort=False)["detail"].first().map(lambda d: int_or_none(detail_of(d).get("n_tokens")))
    stop = ev[ev["kind"] == "stop"].groupby(key, sort=False)["pos"].max()
    per_request = ev[(ev["kind"] == "draft_stats") & (ev["pattern"] == "draft_acceptance")]
    own = per_request.groupby(key)[["generated", "accepted"]].sum()
    steps = step_table(events).groupby(key)[["drafted", "accepted"]].sum()
    out = first.reset_index()
    idx = pd.MultiIndex.from_frame(out[key].astype("int64"))
    p = prompt.reindex(idx).to_numpy(dtype=object)
    s = stop.reindex(idx).to_numpy(dtype=object)
    out["prompt"] = [int(a) if a is not None and not pd.isna(a) else -1 for a in p]
    out["generated"] = [int(b) - int(a) if a is not None and not pd.isna(b) and not pd.isna(a) else -1
                        for a, b in zip(p, s, strict=True)]
    out["counted"] = [not pd.isna(b) for b in s]
    by_line = own.reindex(idx)
    by_step = steps.reindex(idx)
    out["drafted"] = by_line["generated"].fillna(by_step["drafted"]).fillna(0).to_numpy(np.int64)
    out["accepted"] = by_line["accepted"].fillna(by_step["accepted"]).fillna(0).to_numpy(np.int64)
    out = out.astype({"slot": "int64", "task": "int64", "line": "int64", "t": "float64"})
    return out[REQUEST_COLUMNS].sort_values("line", kind="stable").reset_index(drop=True)


# ---- what the server counted itself ------------------------------------------------------------------------

@dataclass(slots=True)
class _ServerSide:
    """The session's /metrics scrapes (capture clock) with the log's line arrivals, and --ping's responses."""

    folder: Path | None
    scrapes: pd.DataFrame | None  # index t; draft_tokens, accepted_tokens, drafts, predicted columns
    responses: pd.DataFrame | None  # requests.parquet: draft_n, draft_n_accepted per response, in order

    @classmethod
    def read(cls, folder: Path | None) -> _ServerSide:
        if folder is None:
            return cls(None, None, None)
        scrapes = None
        metrics = read_metrics(folder)
        if metrics is not None and len(metrics):
            names = {**{v: k for k, v in COUNTERS.items()}, "llamacpp:tokens_predicted_total": "predicted"}
            rows = metrics[metrics["name"].isin(list(names))]
            if len(rows):
                wide = rows.pivot_table(index="t", columns="name", values="value", aggfunc="last")
                scrapes = wide.rename(columns=names).sort_index().ffill().fillna(0)
        responses = None
        path = folder / REQUESTS
        if path.is_file():
            try:
                responses = pd.read_parquet(path)
            except (OSError, ValueError):
                responses = None
        return cls(folder, scrapes, responses)

    def split(self, line: int) -> tuple[pd.Series, pd.Series] | None:
        """The counters' increments before and after the moment `line` reached the capture."""
        if self.scrapes is None or self.folder is None or len(self.scrapes) < 2:
            return None
        at = line_arrivals(self.folder, np.array([line], dtype=np.int64))
        if at is None:
            return None
        t = self.scrapes.index.to_numpy(np.float64)
        i = int(np.searchsorted(t, float(at[0]), side="right")) - 1
        if i < 0:
            return None
        first, mid, last = self.scrapes.iloc[0] * 0, self.scrapes.iloc[i], self.scrapes.iloc[-1]
        return mid - first, last - mid


def _rate(accepted: float, drafted: float) -> float:
    return accepted / drafted if drafted > 0 else math.nan


def _pct(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.0%}"


# ---- acceptance_collapse ------------------------------------------------------------------------------------

def _bernoulli_ll(s: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Log-likelihood of s successes in n trials at their own rate (0 log 0 = 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(n > 0, s / np.maximum(n, 1), 0.0)
        a = np.where(s > 0, s * np.log(np.where(p > 0, p, 1.0)), 0.0)
        b = np.where(n - s > 0, (n - s) * np.log(np.where(p < 1, 1 - p, 1.0)), 0.0)
    return np.asarray(a + b)


def change_point(x: np.ndarray, min_side: int, falling: bool = True) -> tuple[int, float]:
    """The split k (x[:k] | x[k:], each side at least `min_side` long) where two Bernoulli levels explain the
    0/1 series `x` best, with the later level below (`falling`) or above the earlier; (k, log-likelihood ratio),
    k = -1 when no split qualifies."""
    n = len(x)
    if n < 2 * min_side:
        return -1, 0.0
    c = np.cumsum(x, dtype=np.float64)
    k = np.arange(min_side, n - min_side + 1)
    s1, n1 = c[k - 1], k.astype(np.float64)
    s2, n2 = c[-1] - s1, (n - k).astype(np.float64)
    llr = (_bernoulli_ll(s1, n1) + _bernoulli_ll(s2, n2)
           - _bernoulli_ll(np.array([c[-1]]), np.array([float(n)]))[0])
    wrong_way = (s2 / n2 >= s1 / n1) if falling else (s2 / n2 <= s1 / n1)
    llr = np.where(wrong_way, -np.inf, llr)
    i = int(np.argmax(llr))
    return (int(k[i]), float(llr[i])) if np.isfinite(llr[i]) else (-1, 0.0)


def _collapses(result: ParseResult, steps: pd.DataFrame, requests: pd.DataFrame,
               server: _ServerSide) -> list[HealthFinding]:
    out = []
    slots_with_steps = set()
    for key, rows in steps.groupby("slot", sort=True):
        slot = int(cast(int, key))
        slots_with_steps.add(int(slot))
        found = _step_collapse(int(slot), rows.reset_index(drop=True), server)
        if found is not None:
            out.append(found)
    for key, rows in requests[requests["drafted"] > 0].groupby("slot", sort=True):
        slot = int(cast(int, key))
        if int(slot) in slots_with_steps:
            continue
        found = _request_collapse(int(slot), rows.reset_index(drop=True), server)
        if found is not None:
            out.append(found)
    return out


def _step_collapse(slot: int, rows: pd.DataFrame, server: _ServerSide) -> HealthFinding | None:
    hit = (rows["accepted"].to_numpy(np.int64) > 0).astype(np.float64)
    k, llr = change_point(hit, COLLAPSE_MIN_STEPS)
    if k < 0 or llr < COLLAPSE_LLR:
        return None
    # where the low stretch ends, if acceptance came back later (a second change, the other way)
    end = len(rows)
    k2, llr2 = change_point(hit[k:], COLLAPSE_MIN_STEPS, falling=False)
    if k2 >= 0 and llr2 >= COLLAPSE_LLR:
        end = k + k2
    before, low = hit[:k].mean(), hit[k:end].mean()
    acc, dr = rows["accepted"].to_numpy(np.int64), rows["drafted"].to_numpy(np.int64)
    tok_before, tok_low = _rate(acc[:k].sum(), dr[:k].sum()), _rate(acc[k:end].sum(), dr[k:end].sum())
    # far below in steps that accepted anything, or in drafted tokens accepted (a longer draft that still
    # lands its first token now and then: the steps fall less than the tokens do)
    if low > COLLAPSE_RATIO * before and not tok_low <= COLLAPSE_RATIO * tok_before:
        return None
    onset = rows.iloc[k]
    came_back = f", until line {int(rows['line'].iloc[end])} where it came back" if end < len(rows) else \
        " to the end of the log"
    evidence = (f"slot {slot}: {_pct(before)} of {k} verify steps accepted a drafted token before line "
                f"{int(onset['line'])}, then {_pct(low)} of {end - k}{came_back} (drafted tokens accepted: "
                f"{_pct(tok_before)} -> {_pct(tok_low)}; log-likelihood ratio {llr:.0f})")
    confidence, said = _held(server, int(onset["line"]), tok_before)
    return _finding("acceptance_collapse", slot, int(onset["line"]), onset["t"], evidence + said, confidence)


def _request_collapse(slot: int, rows: pd.DataFrame, server: _ServerSide) -> HealthFinding | None:
    """Per-request lines only: a request from which on every request accepts less than every earlier one did,
    at most COLLAPSE_RATIO of their pooled share."""
    n = len(rows)
    rate = (rows["accepted"] / rows["drafted"]).to_numpy(np.float64)
    for k in range(COLLAPSE_MIN_REQUESTS, n - COLLAPSE_MIN_REQUESTS + 1):
        before = _rate(rows["accepted"].iloc[:k].sum(), rows["drafted"].iloc[:k].sum())
        after = _rate(rows["accepted"].iloc[k:].sum(), rows["drafted"].iloc[k:].sum())
        if rate[k:].max() < rate[:k].min() and after <= COLLAPSE_RATIO * before:
            onset = rows.iloc[k]
            evidence = (f"slot {slot}: {k} requests accepted {_pct(before)} of their drafted tokens (each at least "
                        f"{_pct(float(rate[:k].min()))}); the {n - k} from line {int(onset['line'])} on "
                        f"{_pct(after)} (each at most {_pct(float(rate[k:].max()))})")
            confidence, said = _held(server, int(onset["line"]), before)
            return _finding("acceptance_collapse", slot, int(onset["line"]), onset["t"], evidence + said, confidence)
    return None


def _held(server: _ServerSide, line: int, before: float) -> tuple[str, str]:
    """The server's counters around the onset: whether they saw the fall too."""
    split = server.split(line)
    if split is None:
        return MEDIUM, ""
    b, a = split
    server_before = _rate(b.get("accepted_tokens", 0.0), b.get("draft_tokens", 0.0))
    server_after = _rate(a.get("accepted_tokens", 0.0), a.get("draft_tokens", 0.0))
    said = f"; the server's /metrics: {_pct(server_before)} before, {_pct(server_after)} after"
    if not (math.isfinite(server_before) and math.isfinite(server_after)):
        return MEDIUM, said
    if server_after <= 0.5 * server_before:
        return HIGH, said + " (it agrees)"
    return LOW, said + " (it does not show the fall)"


# ---- slot_skew -------------------------------------------------------------------------------------------

def rank_sum_p(low: np.ndarray, high: np.ndarray) -> float:
    """One-sided p-value that `low`'s values tend to sit below `high`'s (Mann-Whitney U, normal approximation
    with the tie correction and a continuity correction)."""
    n1, n2 = len(low), len(high)
    if not n1 or not n2:
        return 1.0
    both = np.concatenate([low, high])
    ranks = pd.Series(both).rank(method="average").to_numpy()
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    _, counts = np.unique(both, return_counts=True)
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - float((counts**3 - counts).sum()) / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (u - n1 * n2 / 2 + 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(-z / math.sqrt(2))


def _skews(result: ParseResult, requests: pd.DataFrame) -> list[HealthFinding]:
    drafting = requests[requests["drafted"] > 0]
    if drafting["slot"].nunique() < 2:
        return []
    out = []
    for key, mine in drafting.groupby("slot", sort=True):
        slot = int(cast(int, key))
        others = drafting[drafting["slot"] != slot]
        # like with like: only the prompts both sides were given (slots that each got their own prompts differ
        # as the prompts do, which says nothing about the slot)
        shared = set(mine["prompt"]) & set(others["prompt"]) - {-1}
        mine, others = mine[mine["prompt"].isin(shared)], others[others["prompt"].isin(shared)]
        if len(mine) < SKEW_MIN_REQUESTS or len(others) < SKEW_MIN_REQUESTS:
            continue
        rate_mine = _rate(mine["accepted"].sum(), mine["drafted"].sum())
        rate_others = _rate(others["accepted"].sum(), others["drafted"].sum())
        if not rate_others > 0 or rate_mine > SKEW_RATIO * rate_others:
            continue
        p = rank_sum_p((mine["accepted"] / mine["drafted"]).to_numpy(np.float64),
                       (others["accepted"] / others["drafted"]).to_numpy(np.float64))
        if p > SKEW_P:
            continue
        first = mine.iloc[0]
        evidence = (f"slot {int(slot)} accepted {_pct(rate_mine)} of its drafted tokens over {len(mine)} requests; "
                    f"the other slots {_pct(rate_others)} over {len(others)}, given the same {len(shared)} "
                    f"prompt{'s' if len(shared) != 1 else ''} (rank test over the requests: p = {p:.1g})")
        out.append(_finding("slot_skew", int(slot), int(first["line"]), first["t"], evidence, MEDIUM))
    return out


# ---- drafting_stopped ----------------------------------------------------------------------------------------

def _stops(result: ParseResult, requests: pd.DataFrame, server: _ServerSide) -> list[HealthFinding]:
    out = []
    seen = requests[requests["counted"]]
    for key, rows in seen.groupby("slot", sort=True):
        slot = int(cast(int, key))
        rows = rows.reset_index(drop=True)
        drafted = rows["drafted"].to_numpy(np.int64) > 0
        generating = rows["generated"].to_numpy(np.int64) >= STOP_MIN_GENERATED
        if not drafted.any():
            continue
        last = int(np.flatnonzero(drafted)[-1])
        later = rows.iloc[last + 1:]
        m = int((later["generated"] >= STOP_MIN_GENERATED).sum())
        if m < STOP_MIN_REQUESTS or not generating[last + 1:].all():
            continue
        earlier = generating[: last + 1]
        share = float(drafted[: last + 1][earlier].mean()) if earlier.any() else 1.0
        chance = (1 - share) ** m
        if chance > STOP_P:
            continue
        onset = later.iloc[0]
        err = result.errors
        if bool(((err["component"] == "drafter") & (err["line"] >= int(onset["line"]))).any()):
            continue  # the drafts were made and refused: the failure says so, drafting did not stop
        evidence = (f"slot {int(slot)}: {int(drafted[: last + 1].sum())} of its first {last + 1} requests drafted; "
                    f"the {m} from line {int(onset['line'])} on drafted nothing while generating "
                    f"{int(later['generated'].sum())} tokens")
        confidence, said = _stop_held(server, int(onset["line"]), m)
        out.append(_finding("drafting_stopped", int(slot), int(onset["line"]), onset["t"], evidence + said,
                            confidence))
    return out


def _stop_held(server: _ServerSide, line: int, m: int) -> tuple[str, str]:
    split = server.split(line)
    said, confidence = "", MEDIUM
    if split is not None:
        _, a = split
        drafts, predicted = a.get("drafts", 0.0), a.get("predicted", 0.0)
        said = f"; the server's /metrics after it: {int(drafts)} drafts, {int(predicted)} tokens predicted"
        confidence = HIGH if drafts == 0 and predicted > 0 else LOW if drafts > 0 else MEDIUM
    r = server.responses
    if r is not None and "draft_n" in r and len(r) > m:
        tail = pd.to_numeric(r["draft_n"], errors="coerce").fillna(0).to_numpy()[-m:]
        said += f"; the last {m} responses' timings: {int(tail.sum())} drafted"
        if tail.sum() > 0:
            confidence = LOW
        elif confidence == MEDIUM:
            confidence = HIGH
    return confidence, said


# ---- drafter_stale ---------------------------------------------------------------------------------------

def _stale(result: ParseResult) -> list[HealthFinding]:
    axis = XAxis("line", "log line")
    out = []
    for seq in sequences(result):
        drafter = stored_positions(result, "drafter", seq, axis)
        if len(drafter) < STALE_MIN_OBSERVATIONS + 1:
            continue
        target = stored_positions(result, "target", seq, axis)
        found = _stuck(result, seq, drafter, target)
        if found is not None:
            out.append(found)
    return out


def _stuck(result: ParseResult, seq: int, drafter: pd.DataFrame, target: pd.DataFrame) -> HealthFinding | None:
    """The first run of drafts at one stored position (after the drafter had moved at least once) over which the
    target's stored position climbed on. A draft is the drafter's observations between two of the target's (a
    chained draft stores one token per decode, so it climbs inside a draft); its level is the lowest of them,
    where the drafter's cache stood before it drafted."""
    d_lines = drafter["line"].to_numpy(np.int64)
    t_lines, t_pos = target["line"].to_numpy(np.int64), target["pos"].to_numpy(np.float64)
    group = np.searchsorted(t_lines, d_lines, side="left")  # target observations before each drafter one
    starts_at = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    ends_at = np.r_[starts_at[1:], len(group)]
    level = np.minimum.reduceat(drafter["pos"].to_numpy(np.float64), starts_at)
    sources = drafter["source"].to_numpy(object)
    change = np.flatnonzero(np.diff(level) != 0) + 1
    runs = zip(np.r_[0, change], np.r_[change, len(level)], strict=True)
    for s, e in runs:
        if s == 0 or e - s < STALE_MIN_OBSERVATIONS:  # no earlier level: the drafter never moved before
            continue
        x = level[s]
        first, last = int(d_lines[starts_at[s]]), int(d_lines[ends_at[e - 1] - 1])
        inside = (t_lines > first) & (t_lines <= last)
        if not inside.any():
            continue
        climbed = float(np.nanmax(t_pos[inside]) - x)
        if climbed < STALE_MIN_ADVANCE:
            continue
        # where X got stuck: the drafter's last store before the run (find_slot prints the max before placing
        # a batch, so the store that reached X shows the value before it); a batch's own end is the store itself
        before = ends_at[s - 1] - 1
        onset = int(d_lines[before]) if sources[starts_at[s]] == "kv" and sources[before] == "kv" else first
        err = result.errors
        refused = err[(err["component"] == "drafter") & (pd.to_numeric(err["seq_id"], errors="coerce") == seq)
                      & (pd.to_numeric(err["last_pos"], errors="coerce") == x)]
        then = (f"; llama.cpp then refused {len(refused)} drafter batch{'es' if len(refused) != 1 else ''} with "
                f"X = {int(x)} (first at line {int(refused['line'].min())})") if len(refused) else \
            "; llama.cpp refused none of them"
        evidence = (f"sequence {seq}: the drafter's stored position stayed at {int(x)} over {e - s} drafts "
                    f"(lines {first}-{last}) while the target's climbed to {int(np.nanmax(t_pos[inside]))}{then}")
        t = _t_at(result, onset)
        return HealthFinding("drafter_stale", seq, seq, onset, t, evidence, HIGH if len(refused) else MEDIUM)
    return None


def _t_at(result: ParseResult, line: int) -> float | None:
    """The log's time at a line: the last timestamped row at or before it."""
    best: float | None = None
    best_line = -1
    for name in ("batches", "kv", "errors", "events"):
        f = getattr(result, name)
        if not len(f):
            continue
        ok = f[(f["line"] <= line) & f["t"].notna()]
        if len(ok):
            row = ok.loc[ok["line"].idxmax()]
            if int(row["line"]) > best_line:
                best_line, best = int(row["line"]), float(row["t"])
    return best


def _finding(name: str, slot: int, line: int, t: Any, evidence: str, confidence: str) -> HealthFinding:
    slot_id = None if slot < 0 else slot
    t_value = None if t is None or pd.isna(t) else float(t)
    return HealthFinding(name, slot_id, slot_id, line, t_value, evidence, confidence)
