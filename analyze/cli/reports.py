"""`kvtrace report`, `kvtrace compare`, `kvtrace export` and `kvtrace triage --table`: thin click commands
over the views (report, perfetto, triage) and the findings' compare."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from kvtrace.analyze.cli.options import (
    cluster_client,
    fail,
    json_option,
    link_policy,
    links_options,
    out_option,
    parse_or_fail,
    progress_option,
    want_progress,
    warn,
)

F = TypeVar("F", bound=Callable[..., Any])


def picture_options(fn: F) -> F:
    """`--png FILE` and `--svg FILE`: the position chart as a picture, beside whatever the command prints."""
    fn = click.option("--svg", "svg", type=click.Path(dir_okay=False, path_type=Path),
                      help="Also write the position chart here as SVG (vector).")(fn)
    return click.option("--png", "png", type=click.Path(dir_okay=False, path_type=Path),
                        help="Also write the position chart here as a PNG (1200x600, to attach to an issue). "
                             "Drawn by the system's Chromium or Chrome (BROWSER_PATH names one).")(fn)


def _need_browser(png: Path | None, svg: Path | None) -> None:
    """Before a long read: a picture asked for with nothing to draw it (the core install leaves Plotly and
    kaleido out, or no browser) fails at once, with what to install."""
    import importlib.util

    if png is None and svg is None:
        return
    lacking = [m for m in ("plotly", "kaleido") if importlib.util.find_spec(m) is None]
    if lacking:
        fail(f"a picture needs {' and '.join(lacking)}, which the core install leaves out: "
             "pip install 'kvtrace[dashboard]'")
    from kvtrace.analyze.views.picture import INSTALL_HINT, find_browser

    if find_browser() is None:
        fail(INSTALL_HINT)


def _pictures(make: Callable[[], Any], png: Path | None, svg: Path | None,  # Any: a figure (plotly)
              progress: bool | None) -> None:
    """Draw the figure once and write each picture asked for; one line on stderr per file, or exit 2."""
    from kvtrace.analyze.views.picture import BrowserMissing, PictureError, write_pictures

    wanted = [(path, fmt) for path, fmt in ((png, "png"), (svg, "svg")) if path is not None]
    if not wanted:
        return
    if want_progress(progress):  # a browser's start takes seconds: say what the wait is
        click.echo("kvtrace: drawing the picture in the browser ...", err=True)
    try:
        sizes = write_pictures(make(), wanted)
    except (BrowserMissing, PictureError) as exc:
        fail(str(exc))
    for (path, fmt), n in zip(wanted, sizes, strict=True):
        click.echo(f"{path}: position chart, {fmt.upper()}, {n:,} bytes", err=True)


def _write(text: str, out: Path | None) -> None:
    if out is None:
        click.echo(text, nl=False)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"{out}: cannot write: {exc.strerror or exc}")


@click.command("report")
@click.argument("source", metavar="SOURCE")
@click.option("--format", "fmt", type=click.Choice(["md", "html", "github"]), default="md", show_default=True,
              help="Markdown (paste into a GitHub comment), a standalone HTML page, or github: the comment a "
                   "workflow posts on an issue (a marker to find it again, what the report is missing, at most "
                   "65,536 characters).")
@out_option("Write here instead of stdout.", folder=False)
@links_options
@picture_options
@progress_option
def report_command(source: str, fmt: str, out: Path | None, fetch_links: bool, github_url: str, api_url: str,
                   png: Path | None, svg: Path | None,
                   progress: bool | None) -> None:
    """A triage report for one log or session: verdict and signature, evidence lines with their line
    numbers, positions around the first divergence, environment and next steps.

    Text from the log only ever appears inside code fences (Markdown) or escaped (HTML). Exit 0 when the
    log was read, whatever it shows; 2 when it could not be read.

    \b
    Examples:
      kvtrace report server.log > comment.md
      kvtrace report sessions/20261130-101500-engine-stale-drafter --format html -o report.html
      pbpaste | kvtrace report -
      gh issue view 28 --json title,body,comments | kvtrace report - --format github
      kvtrace report thread.json --format github --fetch-links -o comment.md
      kvtrace report server.log --png chart.png -o comment.md
    """
    from kvtrace.analyze.views.report import github_comment, html_report, markdown_report

    _need_browser(png, svg)
    result = parse_or_fail(source, progress, link_policy(fetch_links, github_url, api_url))
    # a session folder is named by the folder (its log is always raw.log); never by the full path
    name = "stdin" if source == "-" else (Path(source).resolve().name if Path(source).is_dir() else None)
    if png is not None or svg is not None:
        from kvtrace.analyze.views.figures import picture_figure

        # titled by the file's or the folder's name, never its path
        _pictures(lambda: picture_figure(result, title=name or Path(source).name), png, svg, progress)
    if fmt == "github":
        _write(github_comment(result, picture=png.name if png is not None else None), out)
        return
    _write(html_report(result, name=name) if fmt == "html" else markdown_report(result, name=name), out)


@click.command("compare")
@click.argument("before", metavar="A")
@click.argument("after", metavar="B")
@json_option
@picture_options
@progress_option
def compare_command(before: str, after: str, as_json: bool, png: Path | None, svg: Path | None,
                    progress: bool | None) -> None:
    """Before/after: did B (say, a fix branch) make A's failure go away and bring the drafter back in step?

    Compares failures, position errors, signature, drafter in step with the target (per draft/verify
    cycle), draft acceptance, mean accepted length and verify steps.

    \b
    Verdict and exit status:
      fixed          A fails, B does not           exit 0
      unchanged      neither fails                 exit 0
      still_failing  both fail                     exit 1
      regressed      A does not fail, B does       exit 1
      (a log that cannot be read, or bad usage:    exit 2)

    \b
    Examples:
      kvtrace compare before.log after.log
      kvtrace compare sessions/…-stale-drafter sessions/…-none --json | jq .verdict
      kvtrace compare main.log fix.log && echo "the fix works"
      kvtrace compare main.log fix.log --png before-after.png
    """
    from kvtrace.analyze.findings.compare import compare, format_comparison

    _need_browser(png, svg)
    a, b = parse_or_fail(before, progress), parse_or_fail(after, progress)
    if png is not None or svg is not None:
        from kvtrace.analyze.views.figures import stacked_figure

        names = (f"A: {Path(before).name or before}", f"B: {Path(after).name or after}")
        _pictures(lambda: stacked_figure(a, b, names=names), png, svg, progress)
    c = compare(a, b, (before, after))
    click.echo(json.dumps(c.to_dict(), indent=2) if as_json else format_comparison(c))
    raise SystemExit(c.exit_code)


@click.command("export")
@click.argument("source", metavar="SOURCE")
@click.option("--perfetto", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Chrome/Perfetto trace (JSON) here.")
@progress_option
def export_command(source: str, out: Path, progress: bool | None) -> None:
    """Export one log as a trace for ui.perfetto.dev or chrome://tracing: counter tracks "target pos" and
    "drafter pos" (stored KV max per sequence) and instant events for failures and resets.

    Time is the log's own clock in microseconds when it has one, else one microsecond per log line.

    \b
    Examples:
      kvtrace export server.log --perfetto trace.json
      kvtrace export sessions/20261130-101500-engine-stale-drafter --perfetto stale.json
    """
    from kvtrace.analyze.views.perfetto import write_trace

    result = parse_or_fail(source, progress)
    try:
        n = write_trace(result, out)
    except OSError as exc:
        fail(f"{out}: cannot write: {exc.strerror or exc}")
    click.echo(f"{out}: {n} trace events", err=True)


def triage_table(sources: list[str], jobs: int, as_csv: bool, progress: bool | None,
                 scheduler: str | None = None) -> None:
    """`kvtrace triage --table`: one row per log, clustered; exit 2 if a log could not be read. With
    `scheduler`, the logs are parsed on that Dask cluster's workers."""
    from kvtrace.analyze.views.triage import cluster, to_csv, to_markdown, triage_row, triage_rows

    if jobs < 1:
        fail("--jobs must be at least 1")
    if scheduler is not None:
        from functools import partial

        from kvtrace.analyze.fleet import cluster as dask_cluster

        client = cluster_client(scheduler)
        try:
            rows = dask_cluster.map_logs(client, partial(triage_row, read=dask_cluster.read), sources)
        finally:
            client.close()
    else:
        rows = triage_rows(sources, jobs=jobs, progress=want_progress(progress))
    for r in rows:
        if r.error:
            click.echo(f"kvtrace: {r.error}", err=True)
        for w in r.warnings:
            warn(w)
    good = cluster(rows)
    click.echo(to_csv(good) if as_csv else to_markdown(good), nl=False)
    if len(good) != len(rows):
        raise SystemExit(2)


__all__ = ["compare_command", "export_command", "report_command", "triage_table"]
