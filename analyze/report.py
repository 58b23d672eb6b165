"""A Markdown triage report for one parsed log, ready to paste into a GitHub issue.

Logs come from strangers: every piece of text taken from a log (evidence lines, build strings, flags)
goes inside a code fence longer than any backtick run it contains, so nothing in it can close the fence
or render as Markdown or HTML. Only the tool's own words and numbers appear as prose.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from analyze.overview import Overview, overview

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
        "A healthy speculative run: the log has draft statistics and no failure. Nothing to fix here; "
        "acceptance shows how well the drafter matches the target."
    ),
    "other": (
        "The log has a failure that is not a position or KV-room error (an assert, an abort or a warning). "
        "Read the evidence lines; a backtrace usually names the code path."
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


def advice(kind: str, component: str = "unknown") -> str:
    """One plain paragraph: what this verdict means and what to try next."""
    text = _ADVICE.get(kind, _ADVICE["other"])
    return text.format(side_sentence=_SIDE.get(component or "unknown", _SIDE["unknown"]))


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


def _meta_lines(meta: Mapping[str, Any]) -> list[str]:
    lines = []
    for key in sorted(meta):
        if key in _NOT_ENVIRONMENT:
            continue
        value = meta[key]
        if value in (None, "", [], {}):
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
        lines.append(f"{key}: {text}")
    return lines


def markdown_report(result: Any, *, name: str | None = None) -> str:
    """The triage report for one ParseResult, as GitHub-flavoured Markdown."""
    verdict = result.verdict
    ov: Overview = overview(result)
    # Only the file name of a source path: a report is pasted in public, a home folder should not be.
    title = name or Path(str(getattr(result, "source", "") or "log")).name
    out = [f"### kvtrace triage: {escape(title)}", ""]
    side = verdict.component or "unknown"
    out.append(f"**Verdict:** {escape(verdict.kind)}, failing side: **{escape(side)}**"
               + (f", sequence {_num(verdict.seq_id)}" if verdict.seq_id is not None else ""))
    out.append("")
    if verdict.last_pos is not None and verdict.batch_start is not None:
        out.append(
            f"**First position error:** the KV cache held up to X = {_num(verdict.last_pos)}, the batch "
            f"started at Y = {_num(verdict.batch_start)} (expected {_num(int(verdict.last_pos) + 1)}; "
            f"gap {_num(int(verdict.batch_start) - int(verdict.last_pos) - 1)})."
        )
        out.append("")
    elif ov.first_divergence is not None:
        d = ov.first_divergence
        out.append(
            f"**First divergence:** at line {d.line}, drafter {_num(d.drafter)} vs target {_num(d.target)} "
            f"(drafter minus target {_num(d.delta)})."
        )
        out.append("")
    out.append("| | |\n|---|---|")
    out.append(f"| lines read | {_num(getattr(result, 'lines', None))} |")
    out.append(f"| batches (target / drafter / unknown) | {ov.n_batches} ({ov.n_target} / {ov.n_drafter} / "
               f"{ov.n_unknown}) |")
    out.append(f"| position errors | {_num(verdict.n_position_errors)} |")
    out.append(f"| all errors | {ov.n_errors} |")
    out.append(f"| resets | {ov.n_resets} |")
    out.append(f"| draft acceptance | {ov.acceptance_text} |")
    out.append("")
    out.append(escape(verdict.summary) if verdict.summary else "")
    out.append("")
    out.append(advice(verdict.kind, side))
    evidence = list(verdict.evidence or [])
    if evidence:
        out += ["", "**Evidence** (line numbers in the log):", ""]
        width = max(len(str(e.get("line", ""))) for e in evidence)
        out.append(fence(f"{str(e.get('line', '')).rjust(width)} | {e.get('text', '')}" for e in evidence))
    env = _meta_lines(result.meta or {})
    if env:
        out += ["", "**Environment** (from the log):", "", fence(env)]
    out += ["", "<sub>made with kvtrace</sub>", ""]
    return "\n".join(out)
