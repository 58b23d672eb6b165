"""`kvtrace parse` and `kvtrace triage`: logs in, tables and verdicts out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kvtrace.analyze.cli.options import (
    cluster_client,
    expand_sources,
    fail,
    json_option,
    link_policy,
    links_options,
    out_option,
    parse_or_none,
    progress_option,
    scheduler_option,
    sources_argument,
    want_progress,
    warn,
)
from kvtrace.analyze.cli.reports import triage_table

if TYPE_CHECKING:
    from kvtrace.analyze.findings.health import HealthFinding
    from kvtrace.analyze.fleet.dataset import Parsed
    from kvtrace.analyze.reader.thread import ThreadInfo
    from kvtrace.analyze.reader.verdict import Verdict


@click.command("parse")
@sources_argument
@out_option("Folder for the tables (default: the session folder, or LOGNAME-tables/).", folder=True)
@json_option
@click.option("-j", "--jobs", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Read one big log on N processes (cut at input-batch dumps; a .gz is unpacked first; "
                   "the same tables).")
@click.option("--dataset", is_flag=True, help="Write all the inputs into --out as one Parquet dataset (a folder "
              "per table, a file per log, a `source` column; verdicts one row per log), for kvtrace query. "
              "Always so with --scheduler.")
@scheduler_option
@progress_option
def parse_command(sources: tuple[str, ...], out: Path | None, as_json: bool, jobs: int, dataset: bool,
                  scheduler: str | None, progress: bool | None) -> None:
    """Parse llama.cpp logs into tables: batches, kv, errors, events and meta (one Parquet file each).

    LOG is a file (plain or .gz), a session folder, a folder of logs, or - for stdin. With several
    inputs, each gets its own subfolder of --out; with --dataset (or --scheduler), --out is one dataset
    that a later run adds to (a log parsed again replaces its own files).

    \b
    Examples:
      kvtrace parse server.log -o tables/
      kvtrace parse sessions/20261130-101500-engine-stale-drafter     # tables beside raw.log
      zcat big.log.gz | kvtrace parse - -o tables/ --json
      kvtrace parse --jobs 8 server-debug.log         # one big log on 8 cores
      kvtrace parse --dataset reports/ -o reports.kvt  # then: kvtrace query "..." reports.kvt
      kvtrace parse --scheduler 10.0.0.5:8786 /shared/logs/ s3://bucket/fleet/a.log.gz -o fleet.kvt
    """
    from kvtrace import analyze
    from kvtrace.analyze.reader.session import is_session

    paths = list(expand_sources(sources))
    if dataset or scheduler is not None:
        if out is None:
            fail("a dataset needs its folder: -o DATASET")
        _parse_dataset(paths, out, jobs, scheduler, as_json)
        return
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


def _parse_dataset(paths: list[str], out: Path, jobs: int, scheduler: str | None, as_json: bool) -> None:
    """`parse --dataset`: every log into one dataset, here or on a Dask cluster's workers; each log written
    as it arrives. A log that cannot be read is its verdicts row with the error (and exit 2 at the end)."""
    from functools import partial

    from kvtrace import analyze
    from kvtrace.analyze.fleet.dataset import parsed, write_log

    summaries: list[dict[str, object]] = []

    def done(_: int, p: Parsed) -> None:
        write_log(out, p)
        if p.result is None:
            click.echo(f"kvtrace: {p.error}", err=True)
            summaries.append({"source": p.source, "out": str(out), "error": p.error})
            return
        r = p.result
        for w in r.warnings:
            warn(w)
        summary = {"source": p.source, "out": str(out), "batches": len(r.batches), "kv": len(r.kv),
                   "errors": len(r.errors), "events": len(r.events), "kind": r.verdict.kind,
                   "truncated": r.truncated, "warnings": r.warnings}
        summaries.append(summary)
        if not as_json:
            click.echo(f"{p.source}: {summary['batches']} batches, {summary['kv']} kv rows, {summary['errors']} "
                       f"errors, {summary['events']} events -> {out}/ ({r.verdict.kind})")

    if scheduler is not None:
        from kvtrace.analyze.fleet import cluster

        client = cluster_client(scheduler)
        try:
            cluster.map_logs(client, partial(parsed, read=cluster.read), paths, on_done=done)
        finally:
            client.close()
    else:
        for i, src in enumerate(paths):
            done(i, parsed(src, partial(analyze.parse, jobs=jobs)))
    if as_json:
        click.echo(json.dumps(summaries, indent=2))
    if any("error" in s for s in summaries):
        raise SystemExit(2)


def format_verdict(v: Verdict) -> str:
    """A short readable block for one verdict."""
    from kvtrace.analyze.reader.proof import headline_of

    side = ""
    if v.component != "unknown":
        by = f", decided by line {v.component_evidence}" if v.component_evidence else ""
        side = f" ({v.component}{by})"
    told = headline_of(v.proof)  # a verdict a sentence stands on says so on its first line
    lines = [f"{v.source}" + (f": {told}" if told is not None else ""), f"  verdict:  {v.kind}{side}"]
    if v.n_position_errors or v.last_pos is not None:
        x = v.last_pos if v.last_pos is not None else "?"
        y = v.batch_start if v.batch_start is not None else "?"
        lines.append(f"  sequence: {v.seq_id if v.seq_id is not None else '?'}   X = {x}   Y = {y}   "
                     f"position errors: {v.n_position_errors}")
    lines.append(f"  counts:   {v.n_batches} batches, {v.n_errors} failures, {v.n_resets} resets")
    if v.acceptance:
        rate = v.acceptance.get("rate")
        lines.append(f"  drafts:   {v.acceptance['accepted']}/{v.acceptance['generated']} accepted"
                     + (f" ({rate:.1%})" if rate is not None else "")
                     + (" (synthetic: chosen by the server, not the drafter)" if v.acceptance.get("synthetic") else ""))
    if v.stale_trims:
        n = len(v.stale_trims)
        lines.append(f"  trims:    the drafter's stale memory trimmed {n} time{'s' if n != 1 else ''} by llama.cpp "
                     f"(first at line {v.stale_trims[0]['line']})")
    lines.append(f"  {v.summary}")
    if v.thread is not None:
        lines += thread_lines(v.thread)
    if v.evidence:
        lines.append("  evidence:")
        lines.extend(f"    {e['line']:>7}  {e['text'][:160]}" for e in v.evidence)
    return "\n".join(lines)


def health_lines(found: list[HealthFinding], failed: bool) -> list[str]:
    """The health findings under a verdict; a run with one and no failure is not called healthy."""
    if not found:
        return []
    head = "  health:   " + ("the drafter stopped helping, though nothing failed:" if not failed else
                             "the drafter stopped helping before the failure:")
    return [head] + [f"    line {f.onset_line:>7}  {f.finding}" + (f" (slot {f.slot})" if f.slot is not None else "")
                     + f", {f.confidence} confidence: {f.evidence}" for f in found]


def thread_lines(thread: ThreadInfo) -> list[str]:
    """Where a GitHub thread's evidence was pasted, and the logs it only links to."""
    n = len(thread["parts"])
    out = [f"  thread:   GitHub issue, {n} part{'s' if n != 1 else ''} (body and comments); evidence from: "
           f"{thread['evidence_from'] or 'none of them'}"]
    out += [f"  fetched:  {f['file']} ({f['bytes']:,} bytes) from {f['url']}"
            for f in thread.get("fetched", []) if "error" not in f]
    failed = {f["url"]: f["error"] for f in thread.get("fetched", []) if "error" in f}
    out += [f"  not fetched: {url}" + (f" ({failed[url]})" if url in failed else "") for url in thread["not_fetched"]]
    return out


@click.command("triage")
@sources_argument
@json_option
@click.option("--table", is_flag=True, help="One row per log with its failure signature and what it stands on "
              "(proof: log, runtime, prose), clustered so reports of the same bug sit together (Markdown).")
@click.option("--csv", "as_csv", is_flag=True, help="The --table as CSV.")
@click.option("-j", "--jobs", type=int, default=1, show_default=True, help="With --table: parse N logs at once.")
@scheduler_option
@links_options
@progress_option
def triage_command(sources: tuple[str, ...], as_json: bool, table: bool, as_csv: bool, jobs: int,
                   scheduler: str | None, fetch_links: bool, github_url: str, api_url: str,
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
      kvtrace triage --table --scheduler 10.0.0.5:8786 /shared/reports/
      kvtrace triage --fetch-links thread.json        # with the logs the thread links to
    """
    links = link_policy(fetch_links, github_url, api_url)
    if links is not None and (table or as_csv or scheduler is not None):
        fail("--fetch-links reads one thread at a time: leave out --table, --csv and --scheduler")
    if table or as_csv:
        triage_table(list(expand_sources(sources)), jobs, as_csv, progress, scheduler)
        return
    if scheduler is not None:
        fail("--scheduler goes with --table (or --csv)")
    from kvtrace.analyze.findings.acceptance import step_histogram
    from kvtrace.analyze.findings.counters import server_counters
    from kvtrace.analyze.findings.health import health, restated

    bad = 0
    first = True
    for src in expand_sources(sources):
        result = parse_or_none(src, want_progress(progress), links=links)
        if result is None:
            bad += 1
            continue
        v = result.verdict
        v.source = src
        found = health(result)
        v.summary = restated(v.summary, found)
        if as_json:
            counters = server_counters(result)  # a session that scraped the server's /metrics
            click.echo(json.dumps(v.to_dict() | {"server_counters": counters.to_dict() if counters else None,
                                                 "health": [f.to_dict() for f in found],
                                                 "step_histogram": step_histogram(result.events)}))
        else:
            if not first:
                click.echo("")
            click.echo(format_verdict(v))
            click.echo("\n".join(health_lines(found, bool(len(result.errors)))))
        first = False
    if bad:
        raise SystemExit(2)
