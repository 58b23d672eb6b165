"""The verdict: one plain answer per log, from its tables.

Kinds follow the corpus labels: inconsistent_positions > decode_failed > kv_slot > other (asserts) >
draft_stats_only > other > no_log, the most serious thing in the log winning.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

import pandas as pd

from kvtrace.analyze.reader.concepts import CONCEPT_PREFIX
from kvtrace.analyze.reader.definitions import SYNTHETIC_FLAGS, reset_events, stale_drafter
from kvtrace.analyze.reader.normalize import message
from kvtrace.analyze.reader.records import (
    PROSE_ACCEPTANCE,
    RUNNING_TOTALS,
    WORDINGS,
    Meta,
    detail_of,
    int_or_none,
    lines_of,
    opt_int,
    verify_steps,
)
from kvtrace.analyze.reader.spec import NO_TYPE
from kvtrace.analyze.reader.thread import ThreadInfo

KINDS = ("inconsistent_positions", "decode_failed", "kv_slot", "draft_stats_only", "other", "no_log")
RULES = {
    "consecutive": "Y must be X + 1",
    "mrope_lt": "M-RoPE: X < Y is required",
    "mrope_le": "M-RoPE: X <= Y is required",
    "unclosed": "the closing line is missing",
}


class EvidenceLine(TypedDict):
    """A log line the verdict stands on."""

    line: int
    text: str


class AcceptanceSummary(TypedDict, total=False):
    """Draft acceptance summed over the log (`acceptance`); empty where the log has none."""

    accepted: int
    generated: int
    rate: float | None
    per_step_lines: int
    synthetic: bool


class StaleTrim(TypedDict):
    """A line where the build (a turboquant-derived fork) found the drafter's memory stale and trimmed it."""

    line: int | None
    seq_id: int | None
    last_pos: int | None  # X: where the draft memory ended
    batch_start: int | None  # Y: where the target's rows start


class VerdictCounts(TypedDict, total=False):
    """What every verdict carries whatever its kind (`decide` passes them on as keywords)."""

    n_errors: int
    n_batches: int
    n_resets: int
    acceptance: AcceptanceSummary
    source: str
    truncated: bool
    stale_trims: list[StaleTrim]
    confidence: str


@dataclass(slots=True)
class Verdict:
    kind: str
    component: str
    seq_id: int | None
    last_pos: int | None
    batch_start: int | None
    n_position_errors: int
    summary: str
    evidence: list[EvidenceLine] = field(default_factory=list)
    n_errors: int = 0
    n_batches: int = 0
    n_resets: int = 0
    acceptance: AcceptanceSummary = field(default_factory=AcceptanceSummary)
    source: str = ""
    component_evidence: int | None = None  # the log line that decided `component` (None when unknown)
    # "low" when only the failure-concept layer (analyze/reader/concepts.py) read the failure: a wrapper's wording
    confidence: str = "high"
    truncated: bool = False  # the input was read only in part: what is missing may hold more
    # what the verdict stands on (analyze/reader/proof.py): "log" (llama.cpp's lines), "runtime" (a runtime's or
    # wrapper's own log words), "prose" (only a sentence of the report: no side, no cause) or None (no log at all)
    proof: str | None = None
    # a GitHub thread's JSON: its parts with their line ranges, `evidence_from` (the part the deciding line was
    # pasted in: "body" or "comment 3 by @login at URL") and `not_fetched` (linked logs); None for any other input
    thread: ThreadInfo | None = None
    # the drafter's memory found stale and trimmed by the build itself (a turboquant-derived fork's draft mirror,
    # MTP): each with its line, seq_id, last_pos (X: where the draft memory ended) and batch_start (Y: where the
    # target's rows start)
    stale_trims: list[StaleTrim] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stale_trims(events: pd.DataFrame) -> list[StaleTrim]:
    """The lines where the build found the drafter's memory stale and trimmed it (a turboquant-derived fork's:
    docs/llama-cpp-lines.md#stale-draft-trims)."""
    out = []
    rows = events[events.kind == "stale_trim"]
    for line, seq, text in zip(rows["line"], rows["seq_id"], rows["detail"], strict=True):
        d = detail_of(text)
        out.append(StaleTrim(line=opt_int(line), seq_id=opt_int(seq), last_pos=int_or_none(d.get("last_pos")),
                             batch_start=int_or_none(d.get("batch_start"))))
    return out


def trims_text(trims: list[StaleTrim]) -> str:
    """One sentence: the drafter's memory was stale and the build trimmed it, at which X/Y. Only a
    turboquant-derived fork prints these lines (docs/llama-cpp-lines.md#stale-draft-trims), never llama.cpp
    b11434 or master."""
    if not trims:
        return ""
    first, n = trims[0], len(trims)
    times = "once, at" if n == 1 else f"{n} times, first at"
    return (f"The drafter's memory was stale and the build trimmed it {times} X = {first['last_pos']} / "
            f"Y = {first['batch_start']} (sequence {first['seq_id']}, line {first['line']}: the draft memory ended "
            "at X while the target's rows started at Y): the stale-drafter bug, detected and repaired by a "
            "turboquant-derived fork's draft mirror (llama.cpp b11434 and master print no such line).")


def synthetic(events: pd.DataFrame, meta: Meta) -> bool:
    """Whether the run's acceptance was made up by the server (b11434's --spec-synth-len/--spec-synth-rates):
    its lines say so, or its command line has the flag."""
    flags = meta.get("flags") or {}
    return bool((events.kind == "synthetic").any()) or any(f in flags for f in SYNTHETIC_FLAGS)


def running_totals(rows: pd.DataFrame) -> pd.DataFrame:
    """Draft statistics to sum, with a streamed response counted once: with `timings_per_token` every chunk of a
    stream carries the response's `timings` so far (`draft_n`, `draft_n_accepted`), so only its last chunk
    counts."""
    chunks = rows[rows.pattern == "json_draft_n"]
    if chunks.empty:
        return rows
    ids = pd.Series([detail_of(d).get("response") for d in chunks["detail"]], index=chunks.index)
    earlier = ids.notna() & ids.duplicated(keep="last")
    return rows.drop(index=ids.index[earlier])


def one_wording(stats: pd.DataFrame) -> pd.DataFrame:
    """The draft statistics to sum where no per-request line counts: the first of WORDINGS the log has, never two
    added together (the same drafts told twice: 23 + 23 from a stream's timings and the `statistics` line). Running
    totals count by their last line (per implementation), a streamed response by its last chunk."""
    for wording in WORDINGS:
        rows = stats[stats.pattern.isin(wording)]
        if rows.empty:
            continue
        if wording == (RUNNING_TOTALS,):
            impl = pd.Series([detail_of(d).get("impl") for d in rows["detail"]], index=rows.index).fillna("")
            return rows[~impl.duplicated(keep="last")]
        return running_totals(rows)
    return stats.iloc[0:0]


def per_request_counts(events: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The rows that count each request's drafts once: its per-request `draft acceptance` line where it printed one,
    else its verify steps. A request cancelled mid-stream (`stop: cancel task`) prints no per-request line, yet the
    server's /metrics counts its drafts. Returns the rows (per-request lines first, then those steps) and how many
    requests were counted from their steps. Steps are added only where every per-request line names its request
    (slot and task), so nothing is counted twice."""
    per_request = events[(events["kind"] == "draft_stats") & (events["pattern"] == "draft_acceptance")]
    if per_request.empty or per_request["slot"].isna().any() or per_request["task"].isna().any():
        return per_request, 0
    steps = verify_steps(events)
    steps = steps[steps["slot"].notna() & steps["task"].notna()]
    printed = set(zip(per_request["slot"].astype("int64"), per_request["task"].astype("int64"), strict=True))
    keys = list(zip(steps["slot"].astype("int64"), steps["task"].astype("int64"), strict=True))
    unprinted = [k not in printed for k in keys]
    rest = steps[unprinted]
    if rest.empty:
        return per_request, 0
    n = len({k for k, u in zip(keys, unprinted, strict=True) if u})
    return pd.concat([per_request, rest]), n


def acceptance(events: pd.DataFrame, meta: Meta | None = None) -> AcceptanceSummary:
    """Draft acceptance summed over the log, from whichever wording it printed; `synthetic` says whether the
    server made it up (then it says nothing about the drafter)."""
    stats = events[events.kind == "draft_stats"]
    steps = verify_steps(events)
    # per request if the log has them (a request that printed none counted from its steps), else LLAMA_TRACE's
    # per-step lines (every step), else the run's totals in one wording, else -v's per-step lines
    rows, _ = per_request_counts(events)
    if rows.empty and len(steps) and steps["pos"].isna().all():
        rows = steps
    if rows.empty:
        rows = one_wording(stats)
    if rows.empty:
        rows = steps
    if rows.empty:
        return AcceptanceSummary()
    acc, gen = int(rows.accepted.fillna(0).sum()), int(rows.generated.fillna(0).sum())
    return AcceptanceSummary(accepted=acc, generated=gen, rate=round(acc / gen, 5) if gen else None,
                             per_step_lines=int(len(steps)), synthetic=synthetic(events, meta or {}))


def _evidence(errors: pd.DataFrame, row: pd.Series | None) -> list[EvidenceLine]:
    if row is None:
        return []
    lines = lines_of(row["lines"])
    if len(lines) > 8:  # the start and the end of a long run (retries) say the most
        lines = lines[:4] + lines[-3:]
    out = [EvidenceLine(line=int(n), text=text.strip()) for n, text in lines]
    ev_line = opt_int(row["evidence_line"])
    if ev_line is not None and all(e["line"] != ev_line for e in out):
        out.append(EvidenceLine(line=ev_line, text=str(row["evidence"])))
    return out


def _add_line(evidence: list[EvidenceLine], line: int | None, errors: pd.DataFrame) -> None:
    """Make sure the line that decided the side is among the evidence lines (with its text)."""
    if line is None or any(e["line"] == line for e in evidence):
        return
    for text in errors["lines"]:
        for n, t in lines_of(text):
            if n == line:
                evidence.append(EvidenceLine(line=line, text=t.strip()))
                return
    hit = errors[errors["evidence_line"] == line]
    if len(hit):
        evidence.append(EvidenceLine(line=line, text=str(hit.iloc[0]["evidence"]).strip()))


def _position_summary(pos: pd.DataFrame, first: pd.Series) -> str:
    comp = first["component"]
    x, y = opt_int(first["last_pos"]), opt_int(first["batch_start"])
    n = len(pos)
    side = {"drafter": "drafter", "target": "target"}.get(comp, "")
    rule = RULES.get(str(first["variant"]), "")
    ys = pos.batch_start.dropna()
    if x is None:
        return (f"llama.cpp refused {n} batch{'es' if n != 1 else ''} with inconsistent sequence positions, "
                f"but the paste cut off the X/Y values ({side or 'unknown side'}).")
    where = f"Y = {y}" if y is not None else "a position the paste cut off"
    ctx = f"the {side}'s KV cache" if side else "the KV cache"
    what = f"a {side} batch" if side else "a batch"
    text = (f"llama.cpp refused {what} for sequence {opt_int(first['seq_id'])}: "
            f"{ctx} held positions up to X = {x} but the batch started at {where} ({rule}).")
    if side == "drafter" and stale_drafter(pos):
        text = (f"The drafter's KV cache is stale: it stayed at X = {x} while {n} draft batches arrived at the "
                f"target's position, Y = {int(ys.min())} to {int(ys.max())} ({rule}).")
    elif y is not None and x >= y:
        text += " The cache is ahead of the batch: positions were not rolled back after a rejection or reset."
    elif y is not None and y > x + 1:
        text += f" The cache is {y - x - 1} positions behind: it was cleared or never advanced."
    return text


# what a failure of each kind is, in a sentence about a report that only tells of it
TOLD = {"decode_failed": "a failed decode", "kv_slot": "a full KV cache", "load": "a model that failed to load",
        "assert": "a crash or an abort", "error": "a failure"}

# failures whose own words name what only a drafter has (an architecture no target model has): the draft side's
# when no line of the failure named a side
DRAFTER_ONLY = frozenset({"draft_arch_unknown"})


def failing_side(row: pd.Series, comp: str, speculative: bool, complete: bool = True) -> tuple[str, int | None]:
    """The side of a failure and the line that decided it.

    A side named by the failure's own lines (a caller, a hint, a backtrace frame) is kept with its line. A
    complete log with no speculative decoding at all (no draft model, no spec/draft/MTP lines or flags) has
    one context, so its failure is the target's, decided by the failing line itself. Anything else stays
    `unknown`: a side is never guessed, and the absence of speculative lines in a log read only in part
    shows nothing. A failure worded in what only a drafter has (`DRAFTER_ONLY`) is the drafter's."""
    if comp != "unknown":
        return comp, opt_int(row["evidence_line"]) or opt_int(row["line"])
    if row.get("variant") in DRAFTER_ONLY:
        return "drafter", opt_int(row["line"])
    if not speculative and complete:
        return "target", opt_int(row["line"])
    return "unknown", None


def _side_from_its_copy(rows: pd.DataFrame) -> pd.Series:
    """The first failure, with the side a later copy of its line names: a report quotes its error in the prose
    (the title, the problem description) before the log that prints it again among the lines that say which
    context failed (`failed to load draft model` after `error loading model`)."""
    first = rows.iloc[0]
    if first["component"] != "unknown" or len(rows) < 2:
        return first
    head = lines_of(first["lines"])
    said = message(head[0][1]) if head else ""
    for _, row in rows.iloc[1:].iterrows():
        copy = lines_of(row["lines"])
        if row["component"] != "unknown" and said and copy and message(copy[0][1]) == said:
            first = first.copy()
            first["component"], first["evidence"], first["evidence_line"] = (
                row["component"], row["evidence"], row["evidence_line"])
            break
    return first


# the server's own reason a run with a draft model drafts nothing (analyze/reader/spec.py's NO_TYPE)
NO_TYPE_TEXT = (" No speculative type was chosen (the server says `no implementations specified for speculative "
                "decoding`), so nothing drafted, whatever draft model was loaded: name one with `--spec-type` (the "
                "server picks one from the draft file itself only for a DFlash or MTP draft model).")


def _no_type(meta: Meta) -> str:
    return NO_TYPE_TEXT if meta.get("spec_type") == NO_TYPE else ""


def decide(errors: pd.DataFrame, events: pd.DataFrame, meta: Meta, n_batches: int,
           source: str = "", *, truncated: bool = False) -> Verdict:
    acc = acceptance(events, meta)
    n_resets = len(reset_events(events))
    trims = stale_trims(events)
    pos = errors[errors.kind == "inconsistent_positions"]
    base: VerdictCounts = {"n_errors": len(errors), "n_batches": n_batches, "n_resets": n_resets, "acceptance": acc,
            "source": source, "truncated": truncated, "stale_trims": trims}
    speculative, whole_log = bool(meta.get("speculative")), not truncated
    # failures the concept layer read count only where the table read none (a wrapper's words, never llama.cpp's),
    # and of those a sentence of the report only where no runtime's own line told one
    by_table = errors[~errors.variant.fillna("").str.startswith(CONCEPT_PREFIX)]
    if len(by_table) < len(errors):
        if by_table.empty:
            base["confidence"] = "low"
            told = errors[errors.proof != "prose"]
            errors = told if len(told) else errors
        else:
            errors = by_table
    if not pos.empty:
        complete = pos[pos.last_pos.notna() & pos.batch_start.notna()]
        first = complete.iloc[0] if not complete.empty else pos.iloc[0]
        with_x = pos[pos.last_pos.notna()]
        x_row = first if opt_int(first["last_pos"]) is not None or with_x.empty else with_x.iloc[0]
        comp = str(first["component"])
        side_row = first
        if comp == "unknown":
            known = pos[pos.component != "unknown"].component
            comp = str(known.mode().iloc[0]) if not known.empty else "unknown"
            if comp != "unknown":
                side_row = pos[pos.component == comp].iloc[0]
        comp, comp_line = failing_side(side_row, comp, speculative, whole_log)
        first = first.copy()
        first["component"] = comp
        first["last_pos"] = x_row["last_pos"]
        seq = opt_int(first["seq_id"])
        evidence = _evidence(errors, first)
        _add_line(evidence, comp_line, errors)
        return Verdict("inconsistent_positions", comp, seq, opt_int(x_row["last_pos"]),
                       opt_int(first["batch_start"]) if not complete.empty else None, len(pos),
                       _position_summary(pos, first), evidence, component_evidence=comp_line, proof="log", **base)
    for kind in ("decode_failed", "kv_slot", "load", "assert", "error"):
        rows = errors[errors.kind == kind]
        if rows.empty:
            continue
        first = _side_from_its_copy(rows)
        proof = str(first["proof"])
        comp, comp_line = failing_side(first, str(first["component"]), speculative, whole_log)
        if proof == "prose":  # a sentence names no side: nothing a log printed decided one
            comp, comp_line = "unknown", None
        side = f"the {comp}" if comp != "unknown" else "a"
        ret = opt_int(first["ret"])
        if kind == "decode_failed":
            summary = (f"A decode on {side} context failed ({first['variant']}"
                       f"{', ret = ' + str(ret) if ret is not None else ''}); the log has no X/Y position detail.")
            verdict_kind = "decode_failed"
        elif kind == "kv_slot":
            summary = (f"The KV cache of {side} context had no room for a batch ({first['variant']}"
                       f"{', ret = ' + str(ret) if ret is not None else ''}): raise the context size or lower "
                       "--parallel / the batch size.")
            verdict_kind = "kv_slot"
        elif kind == "load" and first["variant"] == "model_load_error":
            lines = lines_of(first["lines"])
            what = (lines[0][1] if lines else "").split("error loading model:", 1)[-1].strip()[:200]
            summary = (f"A start-up failure: llama.cpp could not load the {'model' if comp == 'unknown' else comp} "
                       f"({what}); it stopped before serving.")
            verdict_kind = "other"
        elif kind == "load":
            summary = (f"The {comp} context failed to load or initialise ({first['variant']}); the server stopped "
                       "before serving.")
            verdict_kind = "other"
        else:
            lines = lines_of(first["lines"])
            what = lines[0][1].strip()[:200] if lines else str(first["evidence"] or first["variant"])
            verb = "aborted" if kind == "assert" else "reported an error"
            summary = f"llama.cpp {verb} ({comp} side): {what}"
            verdict_kind = "other"
        if proof == "prose":
            summary = (f"The report tells of {TOLD.get(kind, 'a failure')} only in its own words: no log line "
                       "shows it, so kvtrace names no side and no cause. Attach the server's log.")
        elif base.get("confidence") == "low":
            summary += " Read from a wrapper's wording of the failure (lower confidence): see the evidence line."
        evidence = _evidence(errors, first)
        _add_line(evidence, comp_line, errors)
        return Verdict(verdict_kind, comp, opt_int(first["seq_id"]), None, None, 0, summary, evidence,
                       component_evidence=comp_line, proof=proof, **base)
    if acc or (events.kind == "draft_stats").any() or trims:
        # trims with no failure: the fork repaired the drafter, so the run is healthy, and says it was repaired
        rate = acc.get("rate")
        counts = f"{acc.get('accepted', 0)} of {acc.get('generated', 0)} drafted tokens"
        pct = f" ({rate:.1%})" if rate is not None else ""
        if acc.get("synthetic"):
            summary = (f"A speculative run with synthetic acceptance (--spec-synth-len/--spec-synth-rates, for "
                       f"benchmarking): {counts} 'accepted'{pct} were chosen by the server, not by the drafter, so "
                       "they say nothing about its quality; no failure in the log.")
        elif acc:
            summary = f"A healthy speculative run: {counts} accepted{pct}, and no failure in the log."
        else:
            summary = "A healthy speculative run: no failure in the log."
        if trims:
            summary += " " + trims_text(trims)
        return Verdict("draft_stats_only", "unknown", None, None, None, 0, summary + _no_type(meta), [], proof="log",
                       **base)
    prose = events[events.kind == PROSE_ACCEPTANCE]
    if len(prose) and (meta.get("recognised_lines", 0) > 0 or speculative
                       or any(detail_of(d).get("drafter") for d in prose["detail"])):
        # healthy llama.cpp lines, or the speculative command line that was run, or a sentence that names the
        # drafter it measured (`MTP active, 112/141 accepted draft tokens`, `draft-mtp n-max 4: ...
        # 38-71% acceptance`), and the acceptance only in the report's words (the figures stay the reporter's)
        return Verdict("draft_stats_only", "unknown", None, None, None, 0,
                       "A speculative run with no failure in the log; its draft acceptance is given only in the "
                       "report's words, not in log lines.", [], proof="prose", **base)
    if meta.get("recognised_lines", 0) > 0:
        return Verdict("other", "unknown", None, None, None, 0,
                       "A llama.cpp log with no failure and no draft statistics." + _no_type(meta), [], proof="log",
                       **base)
    return Verdict("no_log", "unknown", None, None, None, 0,
                   "No llama.cpp log lines found in this input: nothing to analyse.", [], **base)
