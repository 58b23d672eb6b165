"""`kvtrace`: one thin click CLI over analyze/ and capture/.

Exit codes: 0 the input was read (whatever it shows), 1 a command's own check failed (a capture whose
child failed, a compare that regressed), 2 bad input or usage, with a one-line reason on stderr.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output (JSON).")(fn)


def progress_option(fn: F) -> F:
    return click.option(
        "--progress/--no-progress", default=None,
        help="Progress bar on stderr for big inputs (default: when stderr is a terminal).",
    )(fn)


def sources_argument(fn: F) -> F:
    return click.argument("sources", nargs=-1, required=True, metavar="LOG...")(fn)


def want_progress(flag: bool | None) -> bool:
    return sys.stderr.isatty() if flag is None else flag


def fail(message: str, code: int = 2) -> None:
    """One line on stderr, then exit: bad input never gets a traceback."""
    click.echo(f"kvtrace: {message}", err=True)
    raise SystemExit(code)


def expand_sources(sources: tuple[str, ...]) -> Iterator[str]:
    """Files as given; a folder means every log in it (a session folder means its raw.log)."""
    from capture.session import is_session

    for src in sources:
        path = Path(src)
        if src != "-" and path.is_dir() and not is_session(path):
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in LOG_SUFFIXES)
            if not found:
                fail(f"{src}: no .log/.txt/.md/.gz files in this folder")
            yield from (str(p) for p in found)
        else:
            yield src


LOG_SUFFIXES = {".log", ".txt", ".md", ".gz", ".out", ".err"}


def _parse_or_report(src: str, progress: bool) -> Any:
    import analyze

    try:
        return analyze.parse(src, progress=progress)
    except analyze.InputError as exc:
        click.echo(f"kvtrace: {exc}", err=True)
        return None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="kvtrace")
def cli() -> None:
    """Capture and analyse llama.cpp speculative-decoding traces: where the drafter's KV cache and
    the target's parted ways.

    \b
    Examples:
      kvtrace demo                                  # reproduce the stale-drafter failure on this CPU
      kvtrace triage bug-report.md                  # one verdict per log
      kvtrace parse sessions/20261130-…/ -o tables/ # position tables as Parquet
      kvtrace capture run --ping 3 -- llama-server -m t.gguf -md d.gguf --spec-type draft-simple
      kvtrace dashboard sessions/20261130-…/
    """


@cli.command()
@sources_argument
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the tables (default: the session folder, or LOGNAME-tables/).")
@json_option
@progress_option
def parse(sources: tuple[str, ...], out: Path | None, as_json: bool, progress: bool | None) -> None:
    """Parse llama.cpp logs into tables: batches, kv, errors, events and meta (one Parquet file each).

    LOG is a file (plain or .gz), a session folder, a folder of logs, or - for stdin. With several
    inputs, each gets its own subfolder of --out.

    \b
    Examples:
      kvtrace parse server.log -o tables/
      kvtrace parse sessions/20261130-101500-engine-stale-drafter     # tables beside raw.log
      zcat big.log.gz | kvtrace parse - -o tables/ --json
    """
    import analyze
    from capture.session import is_session

    paths = list(expand_sources(sources))
    summaries = []
    bad = 0
    for src in paths:
        result = _parse_or_report(src, want_progress(progress))
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
                   "events": len(result.events), "kind": result.verdict.kind}
        summaries.append(summary)
        for w in result.warnings:
            click.echo(f"kvtrace: warning: {w}", err=True)
        if not as_json:
            click.echo(f"{src}: {summary['batches']} batches, {summary['kv']} kv rows, {summary['errors']} errors, "
                       f"{summary['events']} events -> {target}/ ({result.verdict.kind})")
    if as_json:
        click.echo(json.dumps(summaries, indent=2))
    if bad:
        raise SystemExit(2)


def format_verdict(v: Any) -> str:
    """A short readable block for one verdict."""
    side = f" ({v.component})" if v.component != "unknown" else ""
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
    if v.evidence:
        lines.append("  evidence:")
        lines.extend(f"    {e['line']:>7}  {e['text'][:160]}" for e in v.evidence)
    return "\n".join(lines)


@cli.command()
@sources_argument
@json_option
@click.option("--table", is_flag=True, help="One row per log with its failure signature, clustered so reports "
              "of the same bug sit together (Markdown).")
@click.option("--csv", "as_csv", is_flag=True, help="The --table as CSV.")
@click.option("-j", "--jobs", type=int, default=1, show_default=True, help="With --table: parse N logs at once.")
@progress_option
def triage(sources: tuple[str, ...], as_json: bool, table: bool, as_csv: bool, jobs: int,
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
        from analyze.cli_triage import triage_table

        triage_table(list(expand_sources(sources)), jobs, as_csv, progress)
        return
    bad = 0
    first = True
    for src in expand_sources(sources):
        result = _parse_or_report(src, want_progress(progress))
        if result is None:
            bad += 1
            continue
        v = result.verdict
        v.source = src
        if as_json:
            click.echo(json.dumps(v.to_dict()))
        else:
            if not first:
                click.echo("")
            click.echo(format_verdict(v))
        first = False
    if bad:
        raise SystemExit(2)


def _register() -> None:
    from analyze.cli_triage import compare_command, export_command, report_command
    from capture.cli import capture_group

    cli.add_command(capture_group)
    for command in (report_command, compare_command, export_command):
        cli.add_command(command)
    try:
        from capture.cli import demo_command

        cli.add_command(demo_command, name="demo")
    except ImportError:
        pass
    try:
        from analyze.cli_dashboard import dashboard_command

        cli.add_command(dashboard_command, name="dashboard")
    except ImportError:
        pass


_register()


def main() -> None:
    """Entry point: no traceback reaches the user unless KVTRACE_DEBUG is set."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("kvtrace: interrupted", err=True)
        raise SystemExit(130) from None
    except click.ClickException as exc:
        exc.show()
        raise SystemExit(2) from None
    except BrokenPipeError:
        sys.stderr.close()
        raise SystemExit(0) from None
    except SystemExit:
        raise
    except KeyboardInterrupt:
        click.echo("kvtrace: interrupted", err=True)
        raise SystemExit(130) from None
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, not a traceback
        if os.environ.get("KVTRACE_DEBUG"):
            raise
        click.echo(f"kvtrace: internal error: {type(exc).__name__}: {exc} (set KVTRACE_DEBUG=1 for details)", err=True)
        raise SystemExit(3) from None

