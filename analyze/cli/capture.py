"""`kvtrace capture run|attach|llama-swap|engine`: thin click commands over capture/."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from kvtrace.analyze.cli.engine import engine_cmd
from kvtrace.analyze.cli.options import F, fail, json_flag, session_out_option
from kvtrace.analyze.reader.session import KEY_REDACTED, RECORDED

if TYPE_CHECKING:
    from kvtrace.analyze.dashboard.launch import Dashboard
    from kvtrace.capture.attach import AttachSource
    from kvtrace.capture.monitor import Terminal
    from kvtrace.capture.runner import Outcome
    from kvtrace.capture.wrap import CaptureOptions, RunOptions


@click.group(name="capture")
def capture_group() -> None:
    """Capture a llama.cpp log with the debug flags on, into a session folder.

    \b
    Examples:
      kvtrace capture engine --fault stale-drafter
      kvtrace capture run --ping 3 -- llama-server -m target.gguf -md draft.gguf --spec-type draft-simple
      llama-server ... 2>&1 | kvtrace capture attach --stdin
    """


# ---- capture run / attach / llama-swap (issue 4) -------------------------------------------------

def capture_options(f: F) -> F:
    """Options every capture kind shares (session folder, screen, stop rules)."""
    opts = [
        session_out_option,
        click.option("--root", type=click.Path(path_type=Path), help="Where new session folders go."),
        click.option("--label", default="", help="Added to the session folder's name."),
        click.option("--quiet", "-q", is_flag=True, help="Do not echo the log or show the status line."),
        json_flag("Print a JSON summary on stdout at the end (the log is not echoed)."),
        click.option("--until-error", is_flag=True, help="Stop at the first decode failure, plus --grace."),
        click.option("--grace", "grace_s", type=float, default=5.0, show_default=True,
                     help="Seconds to keep capturing after the first error (with --until-error)."),
        click.option("--timeout", "timeout_s", type=float, help="Stop after this many seconds."),
        click.option("--dashboard", is_flag=True, help="Open the dashboard on the session being written (its "
                     "URL is printed): it follows the capture live and stops when the capture ends."),
        click.option("--redact", is_flag=True, help="At the end, also write SESSION/shareable.log: the log "
                     "without your prompts and the model's answers (kvtrace redact), to attach to a bug report."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


class LiveDashboard:
    """--dashboard: the dashboard, following the session folder as soon as it exists; stopped (and its port
    freed) when the capture ends, however it ends."""

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted
        self.dash: Dashboard | None = None
        self.session: Path | None = None

    def attach(self, opts: CaptureOptions) -> None:
        if self.wanted:
            opts.on_session = self.open

    def open(self, session: Path) -> None:
        from kvtrace.analyze.cli.dashboard import start_dashboard

        self.session = session
        self.dash = start_dashboard(session, follow=True, quiet=True)
        click.echo(f"kvtrace: dashboard: {self.dash.url}  (follows this capture; stops when it ends)", err=True)

    def close(self) -> None:
        if self.dash is None:
            return
        self.dash.stop()
        click.echo(f"kvtrace: dashboard stopped; to look again: kvtrace dashboard {self.session}", err=True)
        self.dash = None


def outcome_lines(outcome: Outcome) -> list[str]:
    """The end of a capture on stderr: how it stopped, why a program that ended at start-up ended (its own last
    lines), and what to do with the session when its log holds something to triage."""
    from kvtrace.analyze.reader.session import Session

    assert outcome.session is not None
    session = Session(outcome.session)
    how = ""
    if outcome.returncode is not None:
        how = f"; program {outcome.signal or f'exit code {outcome.returncode}'}"
    lines = [f"kvtrace: stopped ({outcome.reason}){how}; {outcome.bytes:,} bytes in {session.raw_log}"]
    if outcome.startup_lines is not None:
        if outcome.startup_lines:
            lines.append("kvtrace: the program exited during start-up; the last lines it printed:")
            lines.extend(f"kvtrace:   | {line}" for line in outcome.startup_lines)
        else:
            lines.append("kvtrace: the program exited during start-up without printing anything")
    if outcome.error:
        lines.append(f"kvtrace: error: {outcome.error}")
    live = outcome.manifest.get("live") or {}
    if live.get("complete") is False and live.get("stats"):
        parsed = live["stats"].get("bytes_parsed") or 0
        why = f"the live parse stopped: {live['failed']}" if live.get("failed") else \
            "the log came faster than it could be parsed"
        lines.append(f"kvtrace: the live summary covers {parsed / 1e6:,.1f} of {outcome.bytes / 1e6:,.1f} MB "
                     f"({why}); {session.raw_log.name} is complete")
    redacted = outcome.manifest.get(KEY_REDACTED)
    if isinstance(redacted, dict):
        shareable = session.path / str(redacted.get("log"))
        lines.append(f"kvtrace: redacted: {redacted.get('changed_lines', 0):,} of {redacted.get('lines', 0):,} lines "
                     f"in {shareable} (prompts and answers removed; {session.raw_log.name} still holds them)")
        if outcome.has_triage:
            lines.append(f"kvtrace: attach {shareable.name} and {session.manifest_path.name} from {session.path} "
                         f"to a bug report; next: kvtrace triage {shareable}")
    elif outcome.has_triage:
        lines.append(f"kvtrace: attach {session.raw_log.name} and {session.manifest_path.name} from {session.path} "
                     f"to a bug report; next: kvtrace triage {session.raw_log}")
    return lines


def outcome_summary(outcome: Outcome) -> dict[str, Any]:
    """`--json`: the capture's end as one object."""
    return {
        "session": str(outcome.session),
        "stop_reason": outcome.reason,
        "exit_code": outcome.exit_code,
        "returncode": outcome.returncode,
        "signal": outcome.signal,
        "bytes": outcome.bytes,
        "error": outcome.error,
        "startup_lines": outcome.startup_lines,
        "live": outcome.manifest.get("live"),
        "ping": outcome.manifest.get("ping"),
        "redacted": outcome.manifest.get(KEY_REDACTED),
    }


def report_outcome(outcome: Outcome, *, as_json: bool) -> None:
    for line in outcome_lines(outcome):
        click.echo(line, err=True)
    if as_json:
        click.echo(json.dumps(outcome_summary(outcome), default=str))


class CaptureScreen:
    """What the terminal shows of one capture: while it runs, the echo, the status line and the messages (a
    Terminal the capture writes to); at the end, the outcome (lines on stderr, or --json); --dashboard."""

    def __init__(self, kw: dict[str, Any]) -> None:
        self.quiet: bool = kw.pop("quiet")
        self.as_json: bool = kw.pop("as_json")
        self.redact: bool = kw.pop("redact")
        self.live = LiveDashboard(kw.pop("dashboard"))

    def terminal(self) -> Terminal:
        from kvtrace.capture.monitor import Terminal

        return Terminal(echo=not self.quiet and not self.as_json, status=not self.quiet and sys.stderr.isatty())

    def run(self, capture: Callable[[Terminal], Outcome]) -> NoReturn:
        """Run the capture, present its outcome and exit with its code (2, in one line, for bad usage)."""
        from kvtrace.capture.llamaswap import ConfigError
        from kvtrace.capture.wrap import UsageError

        try:
            try:
                outcome = capture(self.terminal())
            except (UsageError, ConfigError) as exc:
                fail(f"error: {exc}")
            if self.redact:
                redact_outcome(outcome)
            report_outcome(outcome, as_json=self.as_json)
        finally:
            self.live.close()  # last, so its line says where to look again
        sys.exit(outcome.exit_code)


def redact_outcome(outcome: Outcome) -> None:
    """--redact: the session's log redacted into its shareable copy, the manifest saying so (the outcome's
    copy of it too). A copy that cannot be written is said in one line; the capture stands as it is."""
    from kvtrace import analyze
    from kvtrace.analyze.reader.redact import redact_session
    from kvtrace.analyze.reader.session import read_manifest

    if outcome.session is None:
        return
    try:
        redact_session(outcome.session)
    except (OSError, analyze.InputError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        click.echo(f"kvtrace: error: could not write the redacted log: {why}", err=True)
        return
    outcome.manifest = read_manifest(outcome.session)
    if (outcome.session / RECORDED).is_file():
        from kvtrace.analyze.cli.redact import shape_lines, write_session_shape
        from kvtrace.capture.recording import RecordingError
        from kvtrace.capture.shape import ShapeError

        try:
            shaped, shape_file = write_session_shape(outcome.session, None, None)
        except (ShapeError, RecordingError, OSError) as exc:
            click.echo(f"kvtrace: error: no shape of the requests written: {exc} (then: kvtrace redact "
                       f"{outcome.session} --model ...)", err=True)
            return
        for line in shape_lines(shaped, shape_file):
            click.echo(line, err=True)


def run_options(f: F) -> F:
    opts = [
        click.option("--ping", type=click.IntRange(min=0), default=0,
                     help="Once /health answers, send N chat requests, record them, then stop."),
        click.option("--prompt", default=None, help="Prompt for --ping requests."),
        click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True,
                     help="max_tokens of each --ping request."),
        click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
                     help="--ping requests in flight at once (more than 1 exercises --parallel slots)."),
        click.option("--health-timeout", "health_timeout_s", type=float, default=600.0, show_default=True,
                     help="Seconds to wait for /health before giving up."),
        click.option("--keep-running", is_flag=True, help="After --ping, keep capturing until another rule "
                     "(Ctrl-C, --timeout, --until-error) stops it."),
        click.option("--batch-debug", help="LLAMA_BATCH_DEBUG value (default 1; 0 or off to unset)."),
        click.option("--kv-debug", help="LLAMA_KV_CACHE_DEBUG value (default 1; 0 or off to unset)."),
        click.option("--dflash-debug", help="GGML_DFLASH_DEBUG value (default 1; 0 or off to unset)."),
        click.option("--env", "env_pairs", multiple=True, metavar="NAME=VALUE",
                     help="Another environment variable for the program (repeatable)."),
        click.option("--no-log-flags", is_flag=True, help="Do not add -v/--log-prefix/--log-timestamps/"
                     "--log-colors off to a llama.cpp program."),
        click.option("--no-metrics", is_flag=True, help="Do not add --metrics to a llama-server (whose /metrics "
                     "is otherwise scraped once a second into SESSION/metrics.parquet)."),
        click.option("--stop-wait", "stop_wait_s", type=float, default=10.0, show_default=True,
                     help="Seconds to wait after SIGINT (then half that after SIGTERM) before SIGKILL."),
        click.option("--record", is_flag=True, help="Record the client's requests into SESSION/requests.jsonl: "
                     "kvtrace listens on the server's --host/--port (your client changes nothing) and the server "
                     "moves to a private loopback port behind it; `kvtrace replay` sends them again."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _run_opts(kw: dict[str, Any]) -> RunOptions:
    """The one options object for a wrapped run, built from the command line's values."""
    from kvtrace.capture.ping import PingOptions
    from kvtrace.capture.wrap import RunOptions, UsageError

    extra: dict[str, str] = {}
    for pair in kw.pop("env_pairs"):
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise UsageError(f"--env wants NAME=VALUE, got {pair!r}")
        extra[name] = value
    debug = {
        "LLAMA_BATCH_DEBUG": kw.pop("batch_debug"),
        "LLAMA_KV_CACHE_DEBUG": kw.pop("kv_debug"),
        "GGML_DFLASH_DEBUG": kw.pop("dflash_debug"),
    }
    ping = PingOptions(n=kw.pop("ping"), max_tokens=kw.pop("max_tokens"), concurrency=kw.pop("concurrency"),
                       health_timeout_s=kw.pop("health_timeout_s"))
    prompt = kw.pop("prompt")
    if prompt is not None:
        ping.prompt = prompt
    return RunOptions(ping=ping, debug_env=debug, extra_env=extra, log_flags=not kw.pop("no_log_flags"),
                      metrics=not kw.pop("no_metrics"), **kw)


_PASSTHROUGH = {"ignore_unknown_options": True, "allow_interspersed_args": False}


@capture_group.command(name="run", context_settings=_PASSTHROUGH)
@capture_options
@run_options
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def run_cmd(cmd: tuple[str, ...], **kw: Any) -> None:
    """Run CMD with the debug switches on and capture everything it prints.

    Sets LLAMA_BATCH_DEBUG=1, LLAMA_KV_CACHE_DEBUG=1, GGML_DFLASH_DEBUG=1; for llama.cpp programs adds
    -v, --log-prefix --log-timestamps and --log-colors off unless you chose already, and --metrics where
    the build lists it. stdout and stderr go, merged and byte-exact, into SESSION/raw.log; SESSION/manifest.json
    records the command (secrets redacted), the triage flags, the version and the GPUs; the server's /metrics
    go into SESSION/metrics.parquet.

    Exit code: 0 capture complete (whatever the log shows: `kvtrace triage` judges it); 1 the program
    failed, a --ping request failed, or --until-error fired; 2 bad usage (nothing started); 128+N the
    wrapper was stopped by signal N (the program is stopped and the session written all the same).

    \b
    Examples:
      kvtrace capture run -- llama-server -m model.gguf -md draft.gguf --spec-type draft-simple
      kvtrace capture run --ping 3 -- llama-server -m t.gguf -md d.gguf --spec-type draft-simple --port 8080
      kvtrace capture run --until-error --grace 10 --out ./repro -- ./build/bin/llama-server ...
      kvtrace capture run --record --out ./before -- llama-server -m t.gguf --port 8080   # then: kvtrace replay
    """
    screen = CaptureScreen(kw)

    def capture(terminal: Terminal) -> Outcome:
        from kvtrace.capture.wrap import run_wrapped

        opts = _run_opts(kw)
        screen.live.attach(opts)
        return run_wrapped(list(cmd), opts, terminal=terminal)

    screen.run(capture)


@capture_group.command(name="attach")
@click.option("--file", "path", type=click.Path(path_type=Path), help="A log file a server writes.")
@click.option("--follow", "-f", is_flag=True, help="Keep reading as the file grows (survives truncation and "
              "rotation) until Ctrl-C or a stop rule.")
@click.option("--from-end", is_flag=True, help="With --follow: skip what the file already holds.")
@click.option("--stdin", "use_stdin", is_flag=True, help="Read the log from standard input.")
@click.option("--llama-swap", "swap_url", metavar="URL", help="llama-swap's base URL, e.g. http://127.0.0.1:8080.")
@click.option("--model", help="With --llama-swap: the model whose log to stream (default: all upstream).")
@click.option("--url", metavar="URL", help="Any HTTP URL that streams a log (read until it ends or a stop rule).")
@click.option("--server", "server_url", metavar="URL", help="The running llama-server's address (through llama-swap, "
              "its upstream URL): its /metrics, scraped once a second into SESSION/metrics.parquet.")
@capture_options
def attach_cmd(path: Path | None, follow: bool, from_end: bool, use_stdin: bool, swap_url: str | None,
               model: str | None, url: str | None, server_url: str | None, **kw: Any) -> None:
    """Capture a log that something else runs: a file, stdin, llama-swap's log stream or a URL.

    \b
    Examples:
      kvtrace capture attach --file /var/log/llama-server.log --follow --until-error
      llama-server ... 2>&1 | kvtrace capture attach --stdin
      kvtrace capture attach --llama-swap http://127.0.0.1:8080 --model qwen-dflash
      kvtrace capture attach --url http://127.0.0.1:9000/log --until-error
    """
    screen = CaptureScreen(kw)

    def capture(terminal: Terminal) -> Outcome:
        from kvtrace.capture.wrap import CaptureOptions, run_attach

        source = attach_source(path, follow, from_end, use_stdin, swap_url, model, url)
        opts = CaptureOptions(server_url=server_url, **kw)
        screen.live.attach(opts)
        return run_attach(source, opts, terminal=terminal)

    screen.run(capture)


def attach_source(path: Path | None, follow: bool, from_end: bool, use_stdin: bool, swap_url: str | None,
                  model: str | None, url: str | None) -> AttachSource:
    """The one source `attach` reads, from its options (UsageError for none, several, or a stray option)."""
    from kvtrace.capture.attach import FileSource, LlamaSwapStream, StdinSource, UrlSource
    from kvtrace.capture.wrap import UsageError

    chosen = [name for name, on in (("--file", path is not None), ("--stdin", use_stdin),
                                     ("--llama-swap", swap_url is not None), ("--url", url is not None)) if on]
    if len(chosen) != 1:
        raise UsageError("give exactly one of --file PATH, --stdin, --llama-swap URL, --url URL")
    if (follow or from_end) and path is None:
        raise UsageError("--follow and --from-end go with --file")
    if model and swap_url is None:
        raise UsageError("--model goes with --llama-swap")
    if path is not None:
        return FileSource(path, follow=follow, from_end=from_end)
    if swap_url is not None:
        return LlamaSwapStream(swap_url, model)
    if url is not None:
        return UrlSource(url)
    return StdinSource()


@capture_group.command(name="llama-swap")
@click.argument("config", type=click.Path(path_type=Path))
@click.argument("model")
@click.option("--port", "swap_port", type=click.IntRange(1, 65535), help="The port ${PORT} stands for: where your "
              "client reaches the model (with --record, where kvtrace listens). Default: a free one.")
@capture_options
@run_options
def llama_swap_cmd(config: Path, model: str, swap_port: int | None, **kw: Any) -> None:
    """Run MODEL's cmd from a llama-swap CONFIG under `capture run`.

    Expands ${PORT} (a free local port), ${MODEL_ID} and the config's macros, applies the model's env,
    and pings with the model's own parameters (its checkEndpoint, its name, its setParams). A config
    holding only the model entries (as pasted in a bug report) works too.

    \b
    Examples:
      kvtrace capture llama-swap ~/llama-swap/config.yaml bee_qwen3.6-27b --ping 3
      kvtrace capture llama-swap config.yaml qwen-dflash --until-error --out ./repro
      kvtrace capture llama-swap config.yaml qwen-dflash --record --port 5800 --out ./before
    """
    screen = CaptureScreen(kw)

    def capture(terminal: Terminal) -> Outcome:
        from kvtrace.analyze.reader.session import free_port
        from kvtrace.capture.llamaswap import resolve
        from kvtrace.capture.wrap import run_llama_swap

        opts = _run_opts(kw)
        screen.live.attach(opts)
        swap = resolve(config, model, port=swap_port or free_port())
        return run_llama_swap(swap, opts, terminal=terminal)

    screen.run(capture)


capture_group.add_command(engine_cmd)
