"""Option bundles and helpers every command shares: --json, --progress, --out, LOG... arguments, one-line
failures. Each option is declared here once; commands only stack them."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

if TYPE_CHECKING:
    from kvtrace.analyze.reader.links import LinkPolicy
    from kvtrace.analyze.reader.parser import ParseResult

F = TypeVar("F", bound=Callable[..., Any])

LOG_SUFFIXES = {".log", ".txt", ".md", ".gz", ".out", ".err"}


def json_flag(help: str) -> Callable[[F], F]:
    """`--json` (as `as_json`), with what the command prints in JSON said in its own words."""
    return click.option("--json", "as_json", is_flag=True, help=help)


json_option = json_flag("Machine-readable output (JSON) on stdout.")
progress_option = click.option(
    "--progress/--no-progress", default=None, help="Progress bar on stderr (default: when stderr is a terminal)."
)


def out_option(help: str, *, folder: bool, short: bool = True) -> Callable[[F], F]:
    """`--out` (and `-o`): where a command writes, a folder or a file."""
    names = ("-o", "--out") if short else ("--out",)
    return click.option(*names, "out", type=click.Path(file_okay=not folder, dir_okay=folder, path_type=Path),
                        help=help)


session_out_option = out_option("Session folder (default: a new one under ./sessions).", folder=True, short=False)


def sources_argument(fn: F) -> F:
    return click.argument("sources", nargs=-1, required=True, metavar="LOG...")(fn)


def want_progress(flag: bool | None) -> bool:
    return sys.stderr.isatty() if flag is None else flag


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, then exit: bad input never gets a traceback."""
    click.echo(f"kvtrace: {message}", err=True)
    raise SystemExit(code)


def expand_sources(sources: tuple[str, ...]) -> Iterator[str]:
    """Files as given; a folder means every log in it and every GitHub thread saved as `.json` (`gh issue view
    N --json ... > N.json`), other JSON files left alone (a session folder means its raw.log); a list of issues
    (`gh issue list --json number,title,body,comments,url`) means each of its issues, `PATH#NUMBER`."""
    from kvtrace.analyze.reader.session import is_session

    for src in sources:
        path = Path(src)
        if src != "-" and path.is_dir() and not is_session(path):
            found = [report for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in {*LOG_SUFFIXES, ".json"}
                     for report in _reports(str(p), threads_only=p.suffix == ".json")]
            if not found:
                fail(f"{src}: no .log/.txt/.md/.gz files or GitHub threads (.json) in this folder")
            yield from found
        else:
            yield from _reports(src)


def _reports(src: str, threads_only: bool = False) -> list[str]:
    """A file as given, or each issue of a list of issues in it; `threads_only`: nothing unless it holds a thread
    (a folder's other JSON files are no reports)."""
    from kvtrace.analyze.reader.thread import thread_keys

    path = Path(src)
    keys = thread_keys(path) if src != "-" and path.is_file() and path.suffix != ".gz" else None
    if keys:
        return [f"{src}#{key}" for key in keys]
    return [] if threads_only and keys is None else [src]


def warn(message: str) -> None:
    click.echo(f"kvtrace: warning: {message}", err=True)


def parse_or_none(src: str, progress: bool, jobs: int = 1, links: LinkPolicy | None = None) -> ParseResult | None:
    """Parse one log; a log that cannot be read is reported in one line and gives None. What was read only in
    part (a .gz cut short, a file that shrank) is said on stderr, whatever the command does with the result.
    `links`: a GitHub thread's linked logs are fetched under this policy."""
    from kvtrace import analyze

    try:
        result = analyze.parse(src, progress=progress, jobs=jobs, links=links)
    except analyze.InputError as exc:
        click.echo(f"kvtrace: {exc}", err=True)
        return None
    for w in result.warnings:
        warn(w)
    return result


def parse_or_fail(src: str, progress: bool | None, links: LinkPolicy | None = None) -> ParseResult:
    """Parse one log, or exit 2 with one line when it cannot be read."""
    result = parse_or_none(src, want_progress(progress), links=links)
    if result is None:
        raise SystemExit(2)
    return result


scheduler_option = click.option(
    "--scheduler", metavar="ADDRESS", default=None,
    help="Run on a Dask cluster: the scheduler's host:port (each log a task; a big log's pieces too). The "
         "workers read the inputs themselves: paths they can see, or fsspec URLs (s3:// needs s3fs on them). "
         "Needs kvtrace[cluster].")


def cluster_client(address: str) -> Any:
    """A client of the Dask scheduler at `address`, or exit 2 with one line (no extra, no scheduler)."""
    from kvtrace.analyze.fleet.cluster import ClusterError, connect

    try:
        return connect(address)
    except ClusterError as exc:
        fail(str(exc))


def links_options(fn: F) -> F:
    """`--fetch-links` and where the GitHub instance is (Actions sets both variables on every runner)."""
    fn = click.option("--github-api-url", "api_url", envvar="GITHUB_API_URL", default="https://api.github.com",
                      show_default=True, metavar="URL",
                      help="With --fetch-links: the GitHub API that gists are read through (env GITHUB_API_URL).")(fn)
    fn = click.option("--github-url", "github_url", envvar="GITHUB_SERVER_URL", default="https://github.com",
                      show_default=True, metavar="URL",
                      help="With --fetch-links: the GitHub instance of the thread (env GITHUB_SERVER_URL); "
                           "its address may be plain http or private (GitHub Enterprise), no other is.")(fn)
    return click.option("--fetch-links", is_flag=True,
                        help="Fetch the logs a GitHub thread links to (user-attachments files, gists, .log/.txt "
                             "links; .gz and .zip unpacked) and read each as a part of the thread. Off by "
                             "default: without it nothing is fetched.")(fn)


def link_policy(fetch_links: bool, github_url: str, api_url: str) -> LinkPolicy | None:
    """The policy --fetch-links asks for, or None (nothing fetched)."""
    if not fetch_links:
        return None
    from kvtrace.analyze.reader.links import LinkPolicy

    for name, url in (("--github-url", github_url), ("--github-api-url", api_url)):
        if not url.startswith(("http://", "https://")):
            fail(f"{name} {url!r}: give an http(s) URL")
    return LinkPolicy(github_url=github_url, api_url=api_url)
