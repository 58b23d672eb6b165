"""A Markdown triage report for one parsed log, ready to paste into a GitHub issue.

Logs come from strangers: every piece of text taken from a log (evidence lines, build strings, flags)
goes inside a code fence longer than any backtick run it contains, so nothing in it can close the fence
or render as Markdown or HTML. Only the tool's own words and numbers appear as prose.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from kvtrace.analyze.findings.chart import chart_axis
from kvtrace.analyze.findings.counters import ServerCounters, server_counters
from kvtrace.analyze.findings.cycles import depth_series, depth_text
from kvtrace.analyze.findings.health import health, health_headline, restated
from kvtrace.analyze.findings.overview import Overview, overview
from kvtrace.analyze.findings.positions import XAxis, stored_positions
from kvtrace.analyze.findings.rules import Env, env_of, plain_summary
from kvtrace.analyze.findings.signatures import SignatureMatch, match_signature
from kvtrace.analyze.reader.definitions import SYNTHETIC_NOTE
from kvtrace.analyze.reader.devices import device_rows, layout_line, placement_rows
from kvtrace.analyze.reader.patterns import PATTERNS
from kvtrace.analyze.reader.proof import headline_of
from kvtrace.analyze.reader.records import lines_of
from kvtrace.analyze.reader.thread import OWN_MARKER

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult
    from kvtrace.analyze.reader.records import Meta
    from kvtrace.analyze.reader.thread import Part
    from kvtrace.analyze.reader.verdict import Verdict

# Characters that can start emphasis, code, links, HTML, tables or headings inside one line.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~#&$])")

# Plain words per verdict kind: what it means and what to try next. The signature catalogue
# (kvtrace report) may refine these; the dashboard and this report read them from here.
_ADVICE: dict[str, str] = {
    "inconsistent_positions": (
        "llama.cpp refused a batch because its first position did not follow the last position stored "
        "in that context's KV cache. {side_sentence}"
        "Rerun with LLAMA_BATCH_DEBUG=1 LLAMA_KV_CACHE_DEBUG=1 GGML_DFLASH_DEBUG=1 and -v (or capture with "
        "`kvtrace capture run`) so every batch and stored position is in the log; then try a single GPU, "
        "--parallel 1 and without --kv-unified to see which setting matters."
    ),
    "decode_failed": (
        "A decode failed without the X/Y detail that says which positions disagreed. {side_sentence}"
        "Rerun with LLAMA_BATCH_DEBUG=1 LLAMA_KV_CACHE_DEBUG=1 and -v so the failing batch is printed."
    ),
    "kv_slot": (
        "The KV cache had no room for a batch (context full or fragmented). Try a larger --ctx-size, fewer "
        "--parallel slots, or a smaller batch; check whether context shift is on."
    ),
    "draft_stats_only": (
        "No failure in the lines read, and the log has draft statistics: acceptance shows how well the drafter "
        "matches the target. A log with no failure is not proof that nothing is wrong: output that goes bad "
        "without a crash shows in acceptance over time, not in a failure line."
    ),
    "other": (
        "The log has a failure that is not a position or KV-room error (an assert, an abort or a warning). "
        "Read the evidence lines; a backtrace usually names the code path."
    ),
    # `other` with nothing failed: llama.cpp lines, no failure and no draft statistics (the headline's "No
    # failure found"; never the failure paragraph above under it)
    "other_none": (
        "The log holds llama.cpp lines but no failure and no draft statistics. A log with no failure is not proof "
        "that nothing is wrong: a run that goes bad without a crash needs the debug lines and the draft "
        "statistics to show it."
    ),
    "no_log": (
        "No llama.cpp log lines were found. Paste or upload the server's stderr (the lines that start with "
        "the llama.cpp prefixes), or capture one with `kvtrace capture run -- llama-server ...`."
    ),
}

_SIDE: dict[str, str] = {
    "drafter": (
        "The failing decode belongs to the drafter (the draft model's context): its KV cache still holds "
        "an older position while the draft batch arrives at the target's current position, which is the "
        "stale-drafter pattern. A build that clears stale drafter KV before drafting (beellama.cpp v0.3.0+) "
        "is the known fix. "
    ),
    "target": "The failing decode belongs to the target (main) context. ",
    "unknown": "The log does not say which context failed. ",
}


READ_IN_PART = ("the input ended early (a compressed file cut short, a read error or a file that shrank); the "
                "verdict covers only the lines that were read, and what is missing may hold more.")


def advice(kind: str, component: str = "unknown") -> str:
    """One plain paragraph: what this verdict means and what to try next."""
    if kind == "other" and component == "none":  # nothing failed: the failure paragraph would contradict
        kind = "other_none"
    text = _ADVICE.get(kind, _ADVICE["other"])
    return text.format(side_sentence=_SIDE.get(component or "unknown", _SIDE["unknown"]))


def headline(result: ParseResult) -> str:
    """The verdict in a few words (the report's and the dashboard's): a run with nothing failed reads as healthy,
    not by the verdict's kind, and says so when the build trimmed a stale drafter's memory on the way; unless a
    health finding fired, which then heads it (the verdict's kind stays what the log's failures make it)."""
    v = result.verdict
    told = headline_of(v.proof)
    if told is not None:  # a sentence of the report, not a log, stands behind it: said before anything else
        return told
    if not len(result.errors) and (found := health(result)):
        return health_headline(found)
    if not len(result.errors) and v.kind == "draft_stats_only":
        n = len(v.stale_trims)
        return f"Healthy, drafter memory trimmed {n} time{'s' if n != 1 else ''}" if n else "Healthy"
    if not len(result.errors) and v.kind == "other":
        return "No failure found"
    return f"Verdict: {v.kind.replace('_', ' ')}"


def what_to_do(result: ParseResult, sig: SignatureMatch | None = None) -> tuple[str, list[str]]:
    """What the verdict means and the next steps, filled from this log (its build, devices, flags and spec
    type): the one source of advice for the report and the dashboard. A named signature's explanation fits
    the log better than the per-kind paragraph. Markdown of the tool's own (log values only in code spans)."""
    sig = sig if sig is not None else match_signature(result)
    side = (result.verdict.component or "unknown") if len(result.errors) else "none"
    text = escape(sig.signature.explanation) if sig.name != "unclassified" else advice(result.verdict.kind, side)
    if (result.verdict.acceptance or {}).get("synthetic"):  # what acceptance would say does not hold here
        text += " " + escape(f"This run's acceptance is {SYNTHETIC_NOTE}.")
    return text, list(sig.steps)


def fence(lines: Iterable[str], info: str = "text") -> str:
    """A fenced code block that no content can break out of (CommonMark: a longer fence wins)."""
    body = [line.replace("\r", "") for line in lines]
    longest = max((len(run) for line in body for run in re.findall(r"`+", line)), default=0)
    ticks = "`" * max(3, longest + 1)
    return "\n".join([ticks + info, *body, ticks])


def escape(text: str) -> str:
    """Escape Markdown punctuation in the tool's own short strings (names, kinds)."""
    return _MD_SPECIAL.sub(r"\\\1", str(text).replace("\n", " "))


def _num(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# Bookkeeping about the file itself rather than the run; `source` may be a private local path.
_NOT_ENVIRONMENT = frozenset({"source", "bytes", "lines", "recognised_lines", "warnings"})


def _meta_lines(meta: Mapping[str, Any], skip: frozenset[str] = frozenset()) -> list[str]:
    lines = []
    for key in sorted(meta):
        if key in _NOT_ENVIRONMENT or key in skip:
            continue
        value = meta[key]
        if value in (None, "", [], {}):
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
        lines.append(f"{key}: {text}")
    return lines


# ---- one report, two renderings ---------------------------------------------------------------------
# The report is built once as blocks, then written as Markdown or HTML. Prose blocks hold the tool's own
# words in a tiny Markdown subset (escaped text, `code`, **bold**); Code blocks hold log text, which is
# fenced in Markdown and html.escape'd in HTML, never interpreted.


@dataclass(slots=True)
class Prose:
    text: str


@dataclass(slots=True)
class Code:
    lines: list[str]


@dataclass(slots=True)
class Table:
    header: list[str] | None  # None: a two-column key/value table with an empty header row
    rows: list[list[str]]


@dataclass(slots=True)
class Bullets:
    items: list[str]


Block = Prose | Code | Table | Bullets

# Rows of the position table: a few before the first divergence, the rest after it.
TABLE_BEFORE, TABLE_ROWS = 4, 12


def position_rows(result: ParseResult, seq_id: int | None, around: int | None,
                  axis: XAxis | None = None) -> list[dict[str, Any]]:
    """Target and drafter stored max (kv table, else batch spans; X of a refused batch) line by line, with
    the refused batch's Y, in a window of TABLE_ROWS rows around line `around` (the first divergence).
    Rows go by line; `axis` (default: the chart's) only names the stored positions the chart keeps on the parse."""
    axis = axis or chart_axis(result)
    frames = [stored_positions(result, ctx, seq_id, axis).assign(side=ctx) for ctx in ("target", "drafter")]
    err = result.errors
    err = err[(err["kind"] == "inconsistent_positions") & err["batch_start"].notna()]
    if seq_id is not None:
        err = err[pd.to_numeric(err["seq_id"], errors="coerce") == seq_id]
    ys = pd.DataFrame({"line": err["line"].astype("int64"), "y": err["batch_start"].astype("float64")})
    obs = pd.concat([f[["line", "pos", "side", "source"]] for f in frames] + [ys.assign(side="y", source="error")],
                    ignore_index=True)
    if obs.empty:
        return []
    obs = obs.sort_values("line", kind="stable", ignore_index=True)
    # The state of both caches after each line: each side's last stored max, carried forward.
    state = pd.DataFrame({
        "line": obs["line"].astype("int64"),
        "target": obs["pos"].where(obs["side"] == "target").ffill(),
        "drafter": obs["pos"].where(obs["side"] == "drafter").ffill(),
        "refused": obs["source"] == "error",
    }).groupby("line", sort=True).agg({"target": "last", "drafter": "last", "refused": "any"}).reset_index()
    y_at = dict(zip(ys["line"], ys["y"], strict=True))
    at = 0 if around is None else int(np.searchsorted(state["line"].to_numpy(), around))
    at = min(at, len(state) - 1)
    start = max(0, min(at - TABLE_BEFORE, len(state) - TABLE_ROWS))
    rows = []
    r: Any  # itertuples rows are namedtuples built at run time
    for r in state.iloc[start:start + TABLE_ROWS].itertuples():
        notes = (["refused batch"] if r.refused else []) + (["first divergence"] if r.line == around else [])
        rows.append({"line": int(r.line), "target": None if pd.isna(r.target) else r.target,
                     "drafter": None if pd.isna(r.drafter) else r.drafter, "y": y_at.get(r.line),
                     "note": ", ".join(notes)})
    return rows


def _position_table(rows: list[dict[str, Any]]) -> Table:
    def diff(r: dict[str, Any]) -> str:
        if r["target"] is None or r["drafter"] is None or pd.isna(r["target"]) or pd.isna(r["drafter"]):
            return ""
        return _num(float(r["drafter"]) - float(r["target"]))

    return Table(["line", "target stored max", "drafter stored max", "drafter - target", "batch start Y", "note"],
                 [[str(r["line"]), _num(r["target"]), _num(r["drafter"]), diff(r), _num(r["y"]), r["note"]]
                  for r in rows])


def _evidence_by_line(verdict: Verdict, sig: SignatureMatch) -> dict[int, str]:
    by_line: dict[int, str] = {}
    for e in list(verdict.evidence or []):
        by_line.setdefault(int(e.get("line", 0)), str(e.get("text", "")))
    for n, text in sig.match.evidence:
        by_line.setdefault(int(n), text)
    return dict(sorted(by_line.items()))


def _evidence_lines(verdict: Verdict, sig: SignatureMatch) -> list[str]:
    by_line = _evidence_by_line(verdict, sig)
    if not by_line:
        return []
    width = max(len(str(n)) for n in by_line)
    return [f"{str(n).rjust(width)} | {t}" for n, t in sorted(by_line.items())]


# What newer builds print when they repair or skip the drafter, counted in the report
# (docs/llama-cpp-lines.md#stale-draft-trims and #dflash-clamps-adaptive-depth-and-chained-mtp).
_DRAFTER_REPAIRS = (
    ("stale_trim", "drafter memory found stale and trimmed by the build (a turboquant-derived fork)"),
    ("not_mirrored", "times the draft mirror gave a sequence up (not mirrored)"),
    ("draft_clamp", "draft size clamped to fit the draft batch"),
    ("draft_rejected", "drafter rows rejected (no draft that round)"),
)


# Meta keys the environment summary (rules.Env.lines) already states.
_SUMMARISED = frozenset({"backends", "n_gpus", "mrope", "batch_debug", "kv_cache_debug", "gpus", "placement"})


def _cell(text: str) -> str:
    """A table cell holding log text: escaped, and without the characters a table or code span would take."""
    return escape(text.replace("`", "").replace("|", "/"))


def device_blocks(meta: Meta) -> list[Block]:
    """The devices the log lists and where the target's and the drafter's layers and buffers sat."""
    out: list[Block] = []
    devices = device_rows(meta)
    if devices:
        out += [Prose("**Devices** (from the log):"),
                Table(["device", "backend", "description", "memory"],
                      [[_cell(v) for v in r.values()] for r in devices])]
    placed = placement_rows(meta)
    line = layout_line(meta)
    if placed or line:
        out.append(Prose("**Placement**" + (f" ({escape(line)})" if line else "") + ":"))
    if placed:
        out.append(Table(list(placed[0]), [[_cell(v) for v in r.values()] for r in placed]))
    return out


def report_blocks(result: ParseResult, *, name: str | None = None, axis: XAxis | None = None) -> list[Block]:
    """The triage report for one ParseResult, as blocks (see markdown_report / html_report); `axis`: the chart's
    beside it (the dashboard's), so the report reads what the chart worked out (default: `chart_axis`)."""
    verdict = result.verdict
    ov: Overview = overview(result, axis)
    sig = match_signature(result)
    # Only the file name of a source path: a report is pasted in public, a home folder should not be.
    title = name or Path(str(getattr(result, "source", "") or "log")).name
    out: list[Block] = [Prose(f"### kvtrace triage: {escape(title)}")]
    side = (verdict.component or "unknown") if len(result.errors) else "none"  # nothing failed: no failing side
    if side == "none" or verdict.proof == "prose":  # a failure's headline would only repeat the verdict line
        out.append(Prose(f"**{escape(headline(result))}**"))
    out.append(Prose(f"**Verdict:** {escape(verdict.kind)}, failing side: **{escape(side)}**"
                     + (f", sequence {_num(verdict.seq_id)}" if verdict.seq_id is not None else "")))
    out.append(Prose(f"**Signature:** `{sig.name}` ({escape(sig.signature.title)}): {escape(sig.match.detail)}"))
    if result.truncated:
        out.append(Prose(f"**Read in part:** {READ_IN_PART}"))
    out += health_blocks(result)
    if verdict.last_pos is not None and verdict.batch_start is not None:
        out.append(Prose(
            f"**First position error:** the KV cache held up to X = {_num(verdict.last_pos)}, the batch "
            f"started at Y = {_num(verdict.batch_start)} (expected {_num(int(verdict.last_pos) + 1)}; "
            f"gap {_num(int(verdict.batch_start) - int(verdict.last_pos) - 1)})."
        ))
    elif ov.first_divergence is not None:
        div = ov.first_divergence
        out.append(Prose(
            f"**First divergence:** at line {div.line}, drafter {_num(div.drafter)} vs target {_num(div.target)} "
            f"(drafter minus target {_num(div.delta)})."
        ))
    c = sig.cycles
    rows = [
        ["lines read", _num(getattr(result, "lines", None))],
        ["batches (target / drafter / unknown)", f"{ov.n_batches} ({ov.n_target} / {ov.n_drafter} / {ov.n_unknown})"],
        ["position errors", _num(verdict.n_position_errors)],
        ["all errors", str(ov.n_errors)],
        ["resets", str(ov.n_resets)],
        ["draft acceptance", ov.acceptance_text],
    ]
    made_up = " (synthetic)" if (verdict.acceptance or {}).get("synthetic") else ""
    if c.mean_accepted_len is not None:
        rows.append(["mean accepted length" + made_up, _num(c.mean_accepted_len)])
    if c.accepted_per_position:
        rows.append(["acceptance per draft position" + made_up,
                     ", ".join(f"{p:.2f}" for p in c.accepted_per_position)])
    ev = result.events
    for kind, label in _DRAFTER_REPAIRS:
        n = int((ev["kind"] == kind).sum()) if len(ev) else 0
        if n:
            rows.append([label, str(n)])
    depth = depth_series(result.events)
    if len(depth):
        rows.append(["adaptive draft depth (per slot)", depth_text(depth)])
    if c.n_cycles:
        rows.append(["drafter in step (cycles)", f"{c.in_step} of {c.n_cycles}"])
    counters = server_counters(result)
    if counters is not None:
        rows.append(["server counters (/metrics)", counters_text(counters)])
    out.append(Table(None, rows))
    if counters is not None and counters.agree is False:
        out.append(Prose(disagreement_text(counters)))
    summary = restated(plain_summary(verdict), health(result))  # never a quote from the log outside a fence
    if summary:
        out.append(Prose(escape(summary)))
    explanation, steps = what_to_do(result, sig)
    out.append(Prose(explanation))
    evidence = _evidence_lines(verdict, sig)
    if evidence:
        out += [Prose("**Evidence** (line numbers in the log):"), Code(evidence)]
    d = ov.first_divergence
    seq = verdict.seq_id if verdict.seq_id is not None else (d.seq_id if d is not None else None)
    table = position_rows(result, seq, d.line if d is not None else None, axis)
    if table and any(r["target"] is not None or r["drafter"] is not None for r in table):
        where = ("around the first divergence" if d is not None or verdict.last_pos is not None
                 else "at the start (no divergence)")
        out += [Prose(f"**Positions {where}** (stored max per context; log line numbers):"),
                _position_table(table)]
    env = sig.env.lines() + _meta_lines(result.meta or {}, _SUMMARISED)
    if env:
        out += [Prose("**Environment** (from the log):"), Code(env)]
    out += device_blocks(result.meta or {})
    out += acceptance_blocks(result)
    if steps:
        out += [Prose("**Next steps:**"), Bullets(steps)]
    out.append(Prose("<sub>made with kvtrace</sub>"))
    return out


HEALTH_SHOWN = 10  # findings listed in a report or comment (a run rarely has more than one per slot)
HEALTH_HEADER = ["finding", "slot", "onset line", "onset (s)", "confidence", "evidence"]


def health_rows(result: ParseResult) -> list[list[str]]:
    """The health findings (analyze/findings/health.py) as table rows of the tool's own words, escaped."""
    rows = []
    for f in health(result)[:HEALTH_SHOWN]:
        rows.append([f"`{f.finding}`", _num(f.slot), str(f.onset_line),
                     "n/a" if f.onset_t is None else f"{f.onset_t:.3f}", f.confidence,
                     escape(f.evidence[:600])])
    return rows


def health_blocks(result: ParseResult) -> list[Block]:
    rows = health_rows(result)
    if not rows:
        return []
    n = len(health(result))
    more = f" ({n - HEALTH_SHOWN} more not shown)" if n > HEALTH_SHOWN else ""
    return [Prose(f"**Health findings**{more}: the drafter stopped helping while llama.cpp refused nothing (or "
                  "long before it did); the onset is the line where it started."), Table(HEALTH_HEADER, rows)]


def counters_text(c: ServerCounters) -> str:
    """The server's counts beside the log's, in one cell."""
    server = (f"{c.draft_tokens['server']} drafted, {c.accepted_tokens['server']} accepted, "
              f"{c.drafts['server']} drafts ({c.window})")
    verdict = {True: "the log agrees", False: "the log disagrees", None: "not compared"}[c.agree]
    # a note may quote the server's address from the manifest: escaped, as all text the tool did not write
    return f"{server}; {verdict}" + (f" ({_cell('; '.join(c.notes))})" if c.agree is None and c.notes else "")


def disagreement_text(c: ServerCounters) -> str:
    """The finding when the log's draft counts differ from the server's own."""
    return ("**Server counters disagree:** the server's /metrics and the log count different drafts ("
            + "; ".join(c.disagreements()) + "). Either the log is incomplete (cut short, lines lost, captured "
            "late) or it holds an acceptance line kvtrace does not read.")


def _share(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.0%}"


ACCEPTANCE_STRETCHES = 5  # acceptance over time in the report: the run in this many equal stretches
_REQUEST_INTS = ["slot", "task", "line", "drafted", "accepted"]


def _stretches(over: pd.DataFrame) -> str:
    """A series of (t, drafted, accepted) as the acceptance of each of a few equal stretches of time."""
    t = over["t"].to_numpy(np.float64)
    lo, hi = float(t.min()), float(t.max())
    part = np.minimum(((t - lo) / ((hi - lo) / ACCEPTANCE_STRETCHES)).astype(np.int64), ACCEPTANCE_STRETCHES - 1) \
        if hi > lo else np.zeros(t.size, dtype=np.int64)
    g = over.assign(part=part).groupby("part")[["drafted", "accepted"]].sum().reindex(range(ACCEPTANCE_STRETCHES))
    return " → ".join(_share(a / d) if d > 0 else "-" for d, a in zip(g["drafted"], g["accepted"], strict=True))


def _int_rows(frame: pd.DataFrame, ints: list[str]) -> list[list[str]]:
    """Each row's integer columns as text, then its seconds (where it has them) and its accepted share."""
    cols = [frame[c].to_numpy(dtype=np.int64) for c in ints]
    seconds = frame["seconds"].to_numpy(dtype=np.float64) if "seconds" in frame and "task" in ints else None
    rates = frame["rate"].to_numpy(dtype=np.float64)
    rows = []
    for i in range(len(frame)):
        row = [str(int(c[i])) for c in cols]
        if seconds is not None:
            row.insert(3, f"{seconds[i]:.3f}" if math.isfinite(seconds[i]) else "n/a")
        rows.append([*row, _share(float(rates[i]))])
    return rows


def acceptance_blocks(result: ParseResult) -> list[Block]:
    """Acceptance over time, per draft position, per slot, and the worst and slowest requests (the numbers the
    dashboard draws; analyze/findings/acceptance.py)."""
    from kvtrace.analyze.findings.acceptance import acceptance

    acc = acceptance(result)
    if acc.empty:
        return []
    clock = "the capture's clock" if acc.clock == "capture" else "the log's clock"
    rows: list[list[str]] = []
    if len(acc.log_over_time):
        rows.append([f"over time, log ({ACCEPTANCE_STRETCHES} equal stretches of {clock})",
                     _stretches(acc.log_over_time)])
    if acc.server_over_time is not None and len(acc.server_over_time):
        rows.append([f"over time, server counters ({ACCEPTANCE_STRETCHES} equal stretches)",
                     _stretches(acc.server_over_time)])
    if acc.per_position:
        rows.append(["per draft position, log", ", ".join(_share(v) for v in acc.per_position)])
    if acc.server_per_position:
        rows.append(["per draft position, server counters", ", ".join(_share(v) for v in acc.server_per_position)])
    out: list[Block] = [Prose("**Acceptance**")]
    if rows:
        out.append(Table(None, rows))
    if len(acc.slots):
        out += [Prose("Per slot:"), Table(["slot", "requests", "drafted", "accepted", "accepted share"],
                                          _int_rows(acc.slots, ["slot", "requests", "drafted", "accepted"]))]
    head = ["slot", "task", "first line", "seconds", "drafted", "accepted", "accepted share"]
    if len(acc.requests) > 1:
        out += [Prose(f"Lowest acceptance (of {len(acc.requests)} requests):"),
                Table(head, _int_rows(acc.worst(), _REQUEST_INTS))]
        slowest = acc.slowest()
        if len(slowest):
            out += [Prose("Slowest requests (first line to last):"), Table(head, _int_rows(slowest, _REQUEST_INTS))]
    return out


def _md_table(t: Table) -> str:
    head = t.header or ["", ""]
    lines = ["| " + " | ".join(head) + " |" if t.header else "| | |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in t.rows]
    return "\n".join(lines)


def markdown_report(result: ParseResult, *, name: str | None = None, axis: XAxis | None = None) -> str:
    """The triage report for one ParseResult, as GitHub-flavoured Markdown (`axis`: see `report_blocks`)."""
    parts = []
    for b in report_blocks(result, name=name, axis=axis):
        if isinstance(b, Prose):
            parts.append(b.text)
        elif isinstance(b, Code):
            parts.append(fence(b.lines))
        elif isinstance(b, Table):
            parts.append(_md_table(b))
        else:
            parts.append("\n".join(f"- {item}" for item in b.items))
    return "\n\n".join(parts) + "\n"


_UNESCAPE = re.compile(r"\\([\\`*_\[\]<>|~#&$])")


def _html_inline(text: str) -> str:
    """The tool's Markdown subset as HTML: everything escaped first, then `code` and **bold** only."""
    out = []
    for i, part in enumerate(re.split(r"(`[^`]*`)", text)):
        if i % 2:
            out.append(f"<code>{html.escape(part[1:-1])}</code>")
            continue
        part = html.escape(_UNESCAPE.sub(r"\1", part))
        out.append(re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", part))
    return "".join(out)


_CSS = ("body{font:14px/1.5 system-ui,sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
        "pre{background:#f6f8fa;padding:.8em;overflow-x:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #d0d7de;padding:.2em .6em;text-align:left}")


def html_report(result: ParseResult, *, name: str | None = None) -> str:
    """The same report as a standalone HTML page; log text is html.escape'd inside <pre>, never markup."""
    blocks = report_blocks(result, name=name)
    body = []
    for b in blocks:
        if isinstance(b, Prose):
            if b.text.startswith("### "):
                body.append(f"<h3>{_html_inline(b.text[4:])}</h3>")
            elif b.text == "<sub>made with kvtrace</sub>":
                body.append("<p><small>made with kvtrace</small></p>")
            else:
                body.append(f"<p>{_html_inline(b.text)}</p>")
        elif isinstance(b, Code):
            body.append("<pre><code>" + html.escape("\n".join(b.lines)) + "</code></pre>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{_html_inline(h)}</th>" for h in b.header) if b.header else ""
            rows = "".join("<tr>" + "".join(f"<td>{_html_inline(c)}</td>" for c in r) + "</tr>" for r in b.rows)
            body.append(f"<table>{'<tr>' + head + '</tr>' if head else ''}{rows}</table>")
        else:
            body.append("<ul>" + "".join(f"<li>{_html_inline(i)}</li>" for i in b.items) + "</ul>")
    title = html.escape(_UNESCAPE.sub(r"\1", blocks[0].text[4:])) if isinstance(blocks[0], Prose) else ""
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{title}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


# ---- the GitHub comment -------------------------------------------------------------------------------
# What a workflow posts on an issue (samples/github/): GitHub Markdown, found again by its marker, never
# longer than GitHub allows. Log text sits in fences only; prose from the log is escaped and cannot mention.

GITHUB_MARKER = OWN_MARKER  # the thread reader leaves a comment that opens with it unread
GITHUB_LIMIT = 65_536  # characters in one comment body
EVIDENCE_WIDTH = 300  # characters kept of one evidence line
EVIDENCE_MAX = 24  # evidence lines shown
LINKS_MAX = 20  # linked logs listed
_COMMENT_URL = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/issues/\d+#issuecomment-\d+")
_FAILURE_KINDS = frozenset({"inconsistent_positions", "decode_failed", "kv_slot"})


def measured_text(result: ParseResult, sig: SignatureMatch) -> str:
    """What was measured in a log with no failure, in one sentence of the tool's own words (issue 36: a healthy
    log is not proof, so the comment says what it rests on, never that there is nothing to fix)."""
    ov, c = overview(result), sig.cycles
    parts = [f"{_num(getattr(result, 'lines', None))} lines read", f"{ov.n_batches} batches "
             f"({ov.n_target} target / {ov.n_drafter} drafter / {ov.n_unknown} unknown)", "no failure",
             f"draft acceptance {ov.acceptance_text}"]
    if c.n_cycles:
        parts.append(f"drafter in step in {c.in_step} of {c.n_cycles} draft/verify cycles")
    if c.mean_accepted_len is not None:
        parts.append(f"mean accepted length {_num(c.mean_accepted_len)}")
    return "**Measured:** " + escape("; ".join(parts) + ".")


def not_proof_note(result: ParseResult) -> list[str]:
    """What a log with no failure and no health finding does not prove (a finding that fired is listed with
    the verdict instead, by health_blocks)."""
    if health(result):
        return []
    return ["A log with no failure is not proof that nothing is wrong: if the output went bad (garbage, repeats) "
            "with no failure line, say after how many tokens, and attach a capture of that run."]


def gh_text(text: str) -> str:
    """Text from a log or a thread as GitHub prose: Markdown escaped, and `@name` never a mention."""
    return escape(text).replace("@", "@&#8203;")


def rerun_line(result: ParseResult) -> str:
    """The `kvtrace capture` command to rerun with, built from what the report shows of its command: a
    pasted llama-swap config's model under `capture llama-swap`, else the flags the log printed under
    `capture run` (the model, which the flags table does not keep, as a placeholder)."""
    import shlex

    model = result.thread.llama_swap_model() if result.thread is not None else None
    if model is not None:
        return f"kvtrace capture llama-swap config.yaml {shlex.quote(model)} --ping 3 --until-error"
    inert = ["--dflash-debug", "off"] if env_of(result).fork == "beellama>=0.4" else []  # gone in beellama v0.4
    words = ["kvtrace", "capture", "run", *inert, "--until-error", "--", "llama-server", "-m", "MODEL.gguf"]
    for flag, value in command_flags(result.meta).items():
        words += [flag] if value is True else [flag, str(value)]
    return " ".join(shlex.quote(w) for w in words)


def command_flags(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The flags the log's own command line (or the session's manifest) gave: never one only a sentence of the
    report named (meta["told_flags"], analyze/reader/walker.py's add_flags)."""
    told = set(meta.get("told_flags") or ())
    return {f: v for f, v in (meta.get("flags") or {}).items() if f not in told}


# what each debug switch prints, as the checklist names it
_DEBUG_LINES = {"LLAMA_BATCH_DEBUG": "every input batch: `init: input batch info` and its `ubatch_print` rows",
                "LLAMA_KV_CACHE_DEBUG": "every stored position: the `find_slot` lines",
                "GGML_DFLASH_DEBUG": "beellama.cpp v0.2-v0.3's DFlash `key=value` lines: `DFLASH_DBG ...`"}
# DFlash as only beellama.cpp v0.2.0-v0.3.x had it: the pattern table's entries for its own lines (their
# `builds` name those versions or a fork line's F- code, or they are the fork's `dflash...` lines)
_FORK_DFLASH = tuple(p for p in PATTERNS if "v0.2" in p.builds or "v0.3" in p.builds or "(F-" in p.builds
                     or (p.name.startswith("dflash") and p.builds.startswith("beellama")))
_FORK_DFLASH_PATTERNS = frozenset(p.name for p in _FORK_DFLASH)


def fork_dflash(result: ParseResult) -> bool:
    """Whether the log's DFlash is beellama.cpp v0.2-v0.3's, the only one with `GGML_DFLASH_DEBUG`: upstream's
    `draft-dflash` (b11434 on) and beellama v0.4+ (which took upstream's, `dflash` a warned alias) never print
    its lines (docs/proof.md). Told by the type's name in the command (`draft-dflash`, upstream's, rules it
    out; `dflash`, the fork's, on a run that shows nothing of upstream's), else by the fork's own lines."""
    spec = str(command_flags(result.meta or {}).get("--spec-type") or "").lower()
    if spec.startswith("draft-"):
        return False
    ev, err = result.events, result.errors
    if len(ev) and bool(ev["pattern"].isin(_FORK_DFLASH_PATTERNS).any()):
        return True
    for text in err["lines"] if len(err) else ():  # a failure's lines: the fork's `dflash: ... failed` among them
        if any(p.regex.search(t) for _, t in lines_of(text) if "dflash" in t.lower() for p in _FORK_DFLASH):
            return True
    return spec == "dflash" and not _upstream_dflash(result)


def _upstream_dflash(result: ParseResult) -> bool:
    """The log shows upstream's draft-dflash (or beellama v0.4+'s, which is it): its implementation's name or a
    build number of llama.cpp's own numbering."""
    meta = result.meta or {}
    return any("draft" in str(i) for i in meta.get("spec_impls") or ()) or any(
        str(v.get("build", "")).isdigit() and int(v["build"]) >= 11434 for v in meta.get("versions") or ())


def debug_switches(result: ParseResult, env: Env) -> list[tuple[str, bool, str]]:
    """The debug switches this log's build and type have, each with whether the log holds its lines: (the
    variable, present, what it prints). `GGML_DFLASH_DEBUG` only for beellama v0.2-v0.3's DFlash."""
    out = [("LLAMA_BATCH_DEBUG", env.batch_debug, _DEBUG_LINES["LLAMA_BATCH_DEBUG"]),
           ("LLAMA_KV_CACHE_DEBUG", env.kv_cache_debug, _DEBUG_LINES["LLAMA_KV_CACHE_DEBUG"])]
    if fork_dflash(result) and env.fork != "beellama>=0.4":  # v0.4 dropped the switch with its own DFlash
        ev = result.events
        have = bool(len(ev) and (ev["kind"] == "dflash").any())
        out.append(("GGML_DFLASH_DEBUG", have, _DEBUG_LINES["GGML_DFLASH_DEBUG"]))
    return out


def missing_items(result: ParseResult, sig: SignatureMatch) -> list[tuple[bool, str]]:
    """The checklist of what a report of this kind of failure needs: (present in the thread, item)."""
    meta, env, kind = result.meta or {}, sig.env, result.verdict.kind
    flags = command_flags(meta)
    speculative = bool(meta.get("speculative"))
    started = bool(meta.get("contexts")) and (not speculative or bool(meta.get("spec_impls")))
    items = [
        (bool(env.build), "the version line (`llama-server --version`)"),
        (bool(flags) and any(f in flags for f in ("--spec-type", "--spec-draft-model", "--model-draft", "-md"))
         or (not speculative and bool(flags)), "the full command, every flag as it was run"),
        (started, "the start-up log through the speculative init (model loads, contexts, "
                  "`common_speculative_init`)"),
    ]
    if kind in _FAILURE_KINDS or kind == "no_log":
        # ik_llama.cpp has none of these switches (docs/llama-cpp-lines.md#versions-forks-and-their-debug-switches)
        if env.fork == "ik_llama":
            items.append((False, "the debug lines: ik_llama.cpp has no `LLAMA_BATCH_DEBUG`, `LLAMA_KV_CACHE_DEBUG` "
                                 "or position check; the same run on llama.cpp shows them"))
        else:
            items += [(have, f"`{var}=1` ({what})") for var, have, what in debug_switches(result, env)]
    items.append((bool(meta.get("gpus")), "the device list (`ggml_cuda_init: found ... devices` or "
                                          "`--list-devices`)"))
    return items


def _part_name(part: Part) -> str:
    """`the issue body`, or `comment 3 by @&#8203;login` (linked when its URL is a GitHub comment's)."""
    if part.label == "body":
        return "the issue body"
    name = part.label + (f" by {gh_text('@' + part.author)}" if part.author else "")
    return f"[{name}]({part.url})" if _COMMENT_URL.fullmatch(part.url) else name


def _evidence_blocks(result: ParseResult, sig: SignatureMatch) -> list[str]:
    by_line = list(_evidence_by_line(result.verdict, sig).items())[:EVIDENCE_MAX]
    groups: list[tuple[str, list[tuple[int, str]]]] = []
    for n, text in by_line:
        hit = result.thread.part_of(n) if result.thread is not None else None
        where, k = (_part_name(hit[0]), hit[1]) if hit is not None else ("the log", n)
        cut = text if len(text) <= EVIDENCE_WIDTH else text[:EVIDENCE_WIDTH] + " [cut]"
        if not groups or groups[-1][0] != where:
            groups.append((where, []))
        groups[-1][1].append((k, cut))
    out = []
    for where, rows in groups:
        width = max(len(str(k)) for k, _ in rows)
        out += [f"**Evidence** from {where} (its line numbers):",
                fence([f"{str(k).rjust(width)} | {t}" for k, t in rows])]
    return out


def attach_line(picture: str) -> str:
    """How to put a picture written by `--png` into the comment (GitHub's API uploads no images: a person
    drags the file into the comment box). The file's name is reduced to a safe alphabet."""
    name = re.sub(r"[^A-Za-z0-9._-]", "", picture.replace("\\", "/").rsplit("/", 1)[-1])[:80] or "the picture"
    return (f"**Picture:** the position chart is in `{name}`: drag the file into this comment's box to attach "
            "it (GitHub's API cannot upload images).")


def github_comment(result: ParseResult, picture: str | None = None) -> str:
    """The triage as a GitHub comment: the marker first, verdict, signature, X/Y, evidence, next steps, and
    what the report is missing for this kind of failure with the capture line to rerun with; with `picture`
    (the file `--png` wrote), one line on how to attach it. At most GITHUB_LIMIT characters, whatever the size
    of the thread: every piece of it is bounded."""
    v = result.verdict
    sig = match_signature(result)
    side = (v.component or "unknown") if len(result.errors) else "none"
    told = headline_of(v.proof)  # a verdict a sentence stands on says so first
    out = [GITHUB_MARKER, f"### kvtrace triage: {escape(told if told is not None else v.kind)}"]
    verdict = f"**Verdict:** {escape(v.kind)}, failing side: **{escape(side)}**"
    if v.seq_id is not None:
        verdict += f", sequence {_num(v.seq_id)}"
    lines = [verdict, f"**Signature:** `{sig.name}` ({escape(sig.signature.title)})"]
    if v.last_pos is not None or v.batch_start is not None:
        xy = f"**Positions:** X = {_num(v.last_pos)}, Y = {_num(v.batch_start)}"
        if v.last_pos is not None:
            xy += f" (Y must be {_num(int(v.last_pos) + 1)})"
        lines.append(xy + f", {v.n_position_errors} position error{'s' if v.n_position_errors != 1 else ''}")
    if side == "none" and health(result):
        lines.insert(0, f"**{escape(headline(result))}**")
    out.append("\\\n".join(lines))  # a backslash at a line's end: a line break (CommonMark)
    for block in health_blocks(result):
        out.append(block.text if isinstance(block, Prose) else _md_table(block) if isinstance(block, Table) else "")
    summary = restated(plain_summary(v), health(result))
    if summary:
        out.append(gh_text(summary))
    if result.truncated:
        out.append(f"**Read in part:** {READ_IN_PART}")
    out += _evidence_blocks(result, sig)
    if not len(result.errors) and v.proof != "prose":  # what a log with no failure rests on, and its health
        out += [measured_text(result, sig), *not_proof_note(result)]
    explanation, steps = what_to_do(result, sig)
    out.append(explanation.replace("@", "@&#8203;"))
    if steps:
        out += ["**Next steps:**", "\n".join(f"- {step}" for step in steps)]
    out += missing_blocks(result, sig)
    out += linked_blocks(result)
    if picture:
        out.append(attach_line(picture))
    out.append("<sub>kvtrace edits this comment when the thread changes.</sub>")
    text = "\n\n".join(out) + "\n"
    if len(text) > GITHUB_LIMIT:  # cannot happen with the bounds above; a comment GitHub refuses helps no one
        text = "\n\n".join([GITHUB_MARKER, out[1], out[2], "(the full triage is longer than a comment)"]) + "\n"
    return text


def missing_blocks(result: ParseResult, sig: SignatureMatch) -> list[str]:
    """What the report is missing for this kind of failure, checked off, and the capture line to rerun with."""
    items = missing_items(result, sig)
    rerun = rerun_line(result)
    return ["**What is missing** for this kind of failure (checked: the thread has it):",
            "\n".join(f"- [{'x' if have else ' '}] {what}" for have, what in items)
            + "\n- [ ] a rerun captured with kvtrace, which keeps all of the above in one log"
            + (" (`config.yaml`: the llama-swap config in the thread):" if " llama-swap " in rerun
               else " (`MODEL.gguf`: your model; add every flag the report does not show):"),
            fence([rerun], "sh")]


def linked_blocks(result: ParseResult) -> list[str]:
    """The thread's linked logs: those read (`--fetch-links`), and those not (not asked for, or failed, why)."""
    if result.thread is None:
        return []
    out: list[str] = []
    read = [f for f in result.thread.fetched if "error" not in f][:LINKS_MAX]
    if read:
        out += ["**Linked logs read** (fetched from the thread's links, each read as its own part):",
                fence([f"{f['file']} ({f['bytes']:,} bytes) from {_cut(f['url'])}" for f in read])]
    failed = {f["url"]: f["error"] for f in result.thread.fetched if "error" in f}
    links = result.thread.not_fetched()
    if links:
        shown = [_cut(u) + (f" ({_cut(failed[u])})" if u in failed else "") for u in links[:LINKS_MAX]]
        more = f" ({len(links) - LINKS_MAX} more)" if len(links) > LINKS_MAX else ""
        why = ("some could not be read" if failed else "kvtrace reads only what is pasted in the thread")
        out += [f"**Linked logs, not fetched{more}** ({why}):", fence(shown)]
    return out


def _cut(text: str, width: int = 200) -> str:
    return text if len(text) <= width else text[:width] + " [cut]"
