"""`kvtrace parse` and `kvtrace triage`: logs in, tables and verdicts out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from analyze.cli.options import (
    expand_sources,
    json_option,
    out_option,
    parse_or_none,
    progress_option,
    sources_argument,
    want_progress,
)
from analyze.cli.reports import triage_table

if TYPE_CHECKING:
    from analyze.verdict import Verdict


@click.command("parse")
@sources_argument
@out_option("Folder for the tables (default: the session folder, or LOGNAME-tables/).", folder=True)
@json_option
@click.option("-j", "--jobs", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Read one big log on N processes (cut at input-batch dumps; a .gz is unpacked first; "
                   "the same tables).")
@progress_option
def parse_command(sources: tuple[str, ...], out: Path | None, as_json: bool, jobs: int,
                  progress: bool | None) -> None:
    """Parse llama.cpp logs into tables: batches, kv, errors, events and meta (one Parquet file each).

    LOG is a file (plain or .gz), a session folder, a folder of logs, or - for stdin. With several
    inputs, each gets its own subfolder of --out.

    \b
    Examples:
      kvtrace parse server.log -o tables/
      kvtrace parse sessions/20261130-101500-engine-stale-drafter     # tables beside raw.log
      zcat big.log.gz | kvtrace parse - -o tables/ --json
      kvtrace parse --jobs 8 server-debug.log         # one big log on 8 cores
    """
    import analyze
    from capture.session import is_session

    paths = list(expand_sources(sources))
    summaries = []
    bad = 0
    for src in paths:
        result = parse_or_none(src, want_progress(progress), jobs)
        if result is None:
            bad += 1
            continue
        if out is None:
            target = Path(src) if src != "-" and is_session(Path(src)) else Path(f"{Path(src).stem or 'stdin'}-tables")
        else:
            target = out / Path(src).stem if len(paths) > 1 else out
        written = analyze.write_tables(result, target)
        summary = {"source": src, "out": str(target), "files": [p.name for p in written],
                   "batches": len(result.batches), "kv": len(result.kv), "errors": len(result.errors),
                   "events": len(result.events), "kind": result.verdict.kind, "truncated": result.truncated,
                   "warnings": result.warnings}
        summaries.append(summary)
        if not as_json:
            click.echo(f"{src}: {summary['batches']} batches, {summary['kv']} kv rows, {summary['errors']} errors, "
                       f"{summary['events']} events -> {target}/ ({result.verdict.kind})")
    if as_json:
        click.echo(json.dumps(summaries, indent=2))
    if bad:
        raise SystemExit(2)


def format_verdict(v: Verdict) -> str:
    """A short readable block for one verdict."""
    side = ""
    if v.component != "unknown":
        by = f", decided by line {v.component_evidence}" if v.component_evidence else ""
        side = f" ({v.component}{by})"
    lines = [f"{v.source}", f"  verdict:  {v.kind}{side}"]
    if v.n_position_errors or v.last_pos is not None:
        x = v.last_pos if v.last_pos is not None else "?"
        y = v.batch_start if v.batch_start is not None else "?"
        lines.append(f"  sequence: {v.seq_id if v.seq_id is not None else '?'}   X = {x}   Y = {y}   "
                     f"position errors: {v.n_position_errors}")
    lines.append(f"  counts:   {v.n_batches} batches, {v.n_errors} failures, {v.n_resets} resets")
    if v.acceptance:
        rate = v.acceptance.get("rate")
        lines.append(f"  drafts:   {v.acceptance['accepted']}/{v.acceptance['generated']} accepted"
                     + (f" ({rate:.1%})" if rate is not None else ""))
    lines.append(f"  {v.summary}")
    if v.thread is not None:
        lines += thread_lines(v.thread)
    if v.evidence:
        lines.append("  evidence:")
        lines.extend(f"    {e['line']:>7}  {e['text'][:160]}" for e in v.evidence)
    return "\n".join(lines)


def thread_lines(thread: dict[str, Any]) -> list[str]:
    """Where a GitHub thread's evidence was pasted, and the logs it only links to."""
    n = len(thread["parts"])
    out = [f"  thread:   GitHub issue, {n} part{'s' if n != 1 else ''} (body and comments); evidence from: "
           f"{thread['evidence_from'] or 'none of them'}"]
    out += [f"  not fetched: {url}" for url in thread["not_fetched"]]
    return out


@click.command("triage")
@sources_argument
@json_option
@click.option("--table", is_flag=True, help="One row per log with its failure signature, clustered so reports "
              "of the same bug sit together (Markdown).")
@click.option("--csv", "as_csv", is_flag=True, help="The --table as CSV.")
@click.option("-j", "--jobs", type=int, default=1, show_default=True, help="With --table: parse N logs at once.")
@progress_option
def triage_command(sources: tuple[str, ...], as_json: bool, table: bool, as_csv: bool, jobs: int,
           progress: bool | None) -> None:
    """One verdict per log: what failed, on which side (target or drafter), where, and the evidence.

    Exit 0 whenever the inputs were read, whatever they show; 2 when one could not be read.

    \b
    Examples:
      kvtrace triage server.log
      kvtrace triage --json reports/*.md | jq .kind
      pbpaste | kvtrace triage -
      kvtrace triage --table --jobs 4 reports/        # one clustered row per report
      kvtrace triage --table --csv reports/ > triage.csv
    """
    if table or as_csv:
        triage_table(list(expand_sources(sources)), jobs, as_csv, progress)
        return
    from analyze.counters import server_counters

    bad = 0
    first = True
    for src in expand_sources(sources):
        result = parse_or_none(src, want_progress(progress))
        if result is None:
            bad += 1
            continue
        v = result.verdict
        v.source = src
        if as_json:
            counters = server_counters(result)  # a session that scraped the server's /metrics
            click.echo(json.dumps(v.to_dict() | {"server_counters": counters.to_dict() if counters else None}))
        else:
            if not first:
                click.echo("")
            click.echo(format_verdict(v))
        first = False
    if bad:
        raise SystemExit(2)
