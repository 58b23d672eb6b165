"""`kvtrace dashboard [SESSION|LOG]`: start the Streamlit dashboard on this machine, opened on a path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

from analyze.views.dashboard import DEFAULT_HOST, app_path, launch


@click.command("dashboard")
@click.argument("source", required=False, type=click.Path(path_type=Path))
@click.option("--port", type=click.IntRange(1, 65535), help="Port (default: the first free one from 8501).")
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="Address to listen on.")
def dashboard_command(source: Path | None, port: int | None, host: str) -> None:
    """Start the dashboard on 127.0.0.1 and print its URL, opened on a session folder or a log file.

    \b
    Examples:
      kvtrace dashboard                          # upload or paste a log in the page
      kvtrace dashboard sessions/20261130-0945-engine-stale-drafter
      kvtrace dashboard server.log.gz --port 8600
    """
    from analyze.source import InputError, resolve_path

    if source is not None:
        try:
            resolve_path(source)  # a file, or a session folder holding raw.log
        except InputError as exc:
            raise click.UsageError(str(exc)) from None
    if not app_path().is_file():
        raise click.ClickException(f"the dashboard app is missing from this installation ({app_path().name})")
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: listening on {host}: whoever can reach it can read the logs opened", err=True)
    dash = launch(source, host, port)
    proc = dash.proc
    click.echo(f"kvtrace dashboard: {dash.url}  (Ctrl-C to stop)")
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        rc = 0
    sys.exit(rc)
