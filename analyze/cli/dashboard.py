"""`kvtrace dashboard [SESSION|LOG]`: start the Streamlit dashboard on this machine, opened on a path.

The streamlit server is this command's child: SIGINT, SIGTERM and this command dying (even by SIGKILL)
stop it too, so it never outlives the command still holding its port.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from kvtrace.analyze.dashboard.launch import DEFAULT_HOST, app_path
from kvtrace.analyze.reader.session import log_named, port_in_use

if TYPE_CHECKING:
    from kvtrace.analyze.dashboard.launch import Dashboard

FOLLOW_NICE = 10  # a followed capture's program and the capture itself come first


class _Stopped(Exception):
    """SIGTERM arrived: unwind and stop the server."""


def child_setup(follow: bool) -> Callable[[], None]:
    """What the streamlit child does before it starts: die with this process; when following a capture,
    yield the CPU to it."""
    from kvtrace.capture.process import die_with_parent

    def setup() -> None:
        die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # started as a background job, SIGINT was inherited ignored
        if follow:
            os.nice(FOLLOW_NICE)

    return setup


def dashboard_missing() -> str | None:
    """Why the dashboard cannot start in this installation (its extra not installed), or None."""
    import importlib.util

    lacking = [m for m in ("streamlit", "plotly") if importlib.util.find_spec(m) is None]
    if not lacking:
        return None
    return (f"the dashboard needs {' and '.join(lacking)}, which the core install leaves out: "
            "pip install 'kvtrace[dashboard]'")


def start_dashboard(path: Path | None, host: str = DEFAULT_HOST, port: int | None = None, *, follow: bool = False,
                    quiet: bool = False) -> Dashboard:
    from kvtrace.analyze.dashboard.launch import launch

    return launch(path, host, port, follow=follow, preexec_fn=child_setup(follow), quiet=quiet)


def serve(dash: Dashboard) -> int:
    """Wait for the server; Ctrl-C or SIGTERM stop it (and wait until it is gone). Returns the exit code."""

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        raise _Stopped

    previous = signal.signal(signal.SIGTERM, on_term)
    # Ctrl-C stops the server whatever this process inherited (a background job or `nohup ... &` starts with
    # SIGINT ignored, and the server then outlived a `kill -INT`)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return dash.proc.wait()
    except (KeyboardInterrupt, _Stopped):
        dash.stop()
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        if dash.proc.poll() is None:  # any other way out of here: never leave the server behind
            dash.stop()


def _check_follow(source: Path | None) -> None:
    if source is None:
        raise click.UsageError("--follow needs a SESSION folder or a LOG file to follow")
    log = log_named(source)
    if not source.exists():
        # a capture started beside the dashboard (`kvtrace capture engine --out live & kvtrace dashboard live -f`)
        # makes its folder a moment later: the page waits for it, as it waits for a session's raw.log
        click.echo(f"kvtrace dashboard: {source} does not exist yet; the page waits for it to appear", err=True)
        return
    if not source.is_dir() and not source.is_file():
        raise click.UsageError(f"{source}: not a log file or a session folder")
    try:
        with open(log, "rb") as fh:
            magic = fh.read(2)
    except FileNotFoundError:
        return  # a session folder whose capture has not written raw.log yet: the page waits for it
    except OSError as exc:
        raise click.UsageError(f"{log}: cannot read ({exc.strerror or exc})") from None
    if magic == b"\x1f\x8b":  # gzip's magic number
        raise click.UsageError(f"{source} is gzip-compressed, so it is finished: open it without --follow")


@click.command("dashboard")
@click.argument("source", required=False, type=click.Path(path_type=Path))
@click.option("--follow", "-f", is_flag=True, help="Follow the log while it is written (a running capture): the "
              "page updates about once a second, and says when the capture ends.")
@click.option("--port", type=click.IntRange(1, 65535), help="Port (default: the first free one from 8501).")
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="Address to listen on.")
def dashboard_command(source: Path | None, follow: bool, port: int | None, host: str) -> None:
    """Start the dashboard on 127.0.0.1 and print its URL, opened on a session folder or a log file.

    \b
    Examples:
      kvtrace dashboard                          # upload or paste a log in the page
      kvtrace dashboard sessions/20261130-0945-engine-stale-drafter
      kvtrace dashboard sessions/20261130-0945-run-llama-server --follow   # a capture still running
      kvtrace dashboard server.log.gz --port 8600
    """
    from kvtrace.analyze.reader.source import InputError, resolve_path

    if source is not None and str(source) == "-":
        raise click.UsageError("the dashboard cannot read stdin: save the log to a file and pass its path, or "
                               "start it without one and upload or paste the log in the page")
    if follow:
        _check_follow(source)
    elif source is not None:
        try:
            resolve_path(source)  # a file, or a session folder holding raw.log
        except InputError as exc:
            raise click.UsageError(str(exc)) from None
    if not app_path().is_file():
        raise click.ClickException(f"the dashboard app is missing from this installation ({app_path().name})")
    missing = dashboard_missing()
    if missing is not None:
        raise click.ClickException(missing)
    if port is not None and port_in_use(host, port):
        # one line and exit 2 (bad input): not the URL of whatever holds the port, nor the server's own errors
        click.echo(f"kvtrace dashboard: port {port} on {host} is in use; pick another with --port, or leave "
                   "--port out for the first free one", err=True)
        sys.exit(2)
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: listening on {host}: whoever can reach it can read the logs opened", err=True)
    dash = start_dashboard(source, host, port, follow=follow)
    click.echo(f"kvtrace dashboard: {dash.url}  (Ctrl-C to stop)")
    sys.exit(serve(dash))
