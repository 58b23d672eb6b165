"""`kvtrace capture run|attach|llama-swap|engine`: thin click commands over capture/."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from analyze.cli.engine import engine_cmd
from analyze.cli.options import F

if TYPE_CHECKING:
    from analyze.dashboard.launch import Dashboard
    from capture.runner import Outcome
    from capture.wrap import CaptureOptions, RunOptions


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
        click.option("--out", "out", type=click.Path(path_type=Path), help="Session folder (default: a new "
                     "one under ./sessions)."),
        click.option("--root", type=click.Path(path_type=Path), help="Where new session folders go."),
        click.option("--label", default="", help="Added to the session folder's name."),
        click.option("--quiet", "-q", is_flag=True, help="Do not echo the log or show the status line."),
        click.option("--json", "json_out", is_flag=True, help="Print a JSON summary on stdout at the "
                     "end (the log is not echoed)."),
        click.option("--until-error", is_flag=True, help="Stop at the first decode failure, plus --grace."),
        click.option("--grace", "grace_s", type=float, default=5.0, show_default=True,
                     help="Seconds to keep capturing after the first error (with --until-error)."),
        click.option("--timeout", "timeout_s", type=float, help="Stop after this many seconds."),
        click.option("--dashboard", is_flag=True, help="Open the dashboard on the session being written (its "
                     "URL is printed): it follows the capture live and stops when the capture ends."),
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
        from analyze.cli.dashboard import start_dashboard

        self.session = session
        self.dash = start_dashboard(session, follow=True, quiet=True)
        click.echo(f"kvtrace: dashboard: {self.dash.url}  (follows this capture; stops when it ends)", err=True)

    def close(self) -> None:
        if self.dash is None:
            return
        self.dash.stop()
        click.echo(f"kvtrace: dashboard stopped; to look again: kvtrace dashboard {self.session}", err=True)
        self.dash = None


def _finish(outcome_fn: Callable[[], Outcome], live: LiveDashboard | None = None) -> None:
    from capture.llamaswap import ConfigError
    from capture.wrap import UsageError

    try:
        outcome = outcome_fn()
    except (UsageError, ConfigError) as exc:
        click.echo(f"kvtrace: error: {exc}", err=True)
        sys.exit(2)
    finally:
        if live is not None:
            live.close()
    sys.exit(outcome.exit_code)


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
        click.option("--stop-wait", "stop_wait_s", type=float, default=10.0, show_default=True,
                     help="Seconds to wait after SIGINT (then half that after SIGTERM) before SIGKILL."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _run_opts(kw: dict[str, Any]) -> RunOptions:
    """The one options object for a wrapped run, built from the command line's values."""
    from capture.ping import PingOptions
    from capture.wrap import RunOptions, UsageError

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
    return RunOptions(ping=ping, debug_env=debug, extra_env=extra, log_flags=not kw.pop("no_log_flags"), **kw)


_PASSTHROUGH = {"ignore_unknown_options": True, "allow_interspersed_args": False}


@capture_group.command(name="run", context_settings=_PASSTHROUGH)
@capture_options
@run_options
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def run_cmd(cmd: tuple[str, ...], **kw: Any) -> None:
    """Run CMD with the debug switches on and capture everything it prints.

    Sets LLAMA_BATCH_DEBUG=1, LLAMA_KV_CACHE_DEBUG=1, GGML_DFLASH_DEBUG=1; for llama.cpp programs adds
    -v, --log-prefix --log-timestamps and --log-colors off unless you chose already. stdout and stderr go,
    merged and byte-exact, into SESSION/raw.log; SESSION/manifest.json records the command (secrets
    redacted), the triage flags, the version and the GPUs.

    Exit code: 0 capture complete (whatever the log shows: `kvtrace triage` judges it); 1 the program
    failed, a --ping request failed, or --until-error fired; 2 bad usage (nothing started); 128+N the
    wrapper was stopped by signal N (the program is stopped and the session written all the same).

    \b
    Examples:
      kvtrace capture run -- llama-server -m model.gguf -md draft.gguf --spec-type draft-simple
      kvtrace capture run --ping 3 -- llama-server -m t.gguf -md d.gguf --spec-type draft-simple --port 8080
      kvtrace capture run --until-error --grace 10 --out ./repro -- ./build/bin/llama-server ...
    """
    live = LiveDashboard(kw.pop("dashboard"))
    _finish(lambda: _run(list(cmd), kw, live), live)


def _run(cmd: list[str], kw: dict[str, Any], live: LiveDashboard) -> Outcome:
    from capture.wrap import run_wrapped

    opts = _run_opts(kw)
    live.attach(opts)
    return run_wrapped(cmd, opts)


@capture_group.command(name="attach")
@click.option("--file", "path", type=click.Path(path_type=Path), help="A log file a server writes.")
@click.option("--follow", "-f", is_flag=True, help="Keep reading as the file grows (survives truncation and "
              "rotation) until Ctrl-C or a stop rule.")
@click.option("--from-end", is_flag=True, help="With --follow: skip what the file already holds.")
@click.option("--stdin", "use_stdin", is_flag=True, help="Read the log from standard input.")
@click.option("--llama-swap", "swap_url", metavar="URL", help="llama-swap's base URL, e.g. http://127.0.0.1:8080.")
@click.option("--model", help="With --llama-swap: the model whose log to stream (default: all upstream).")
@capture_options
def attach_cmd(path: Path | None, follow: bool, from_end: bool, use_stdin: bool, swap_url: str | None,
               model: str | None, **kw: Any) -> None:
    """Capture a log that something else runs: a file, stdin, or llama-swap's log stream.

    \b
    Examples:
      kvtrace capture attach --file /var/log/llama-server.log --follow --until-error
      llama-server ... 2>&1 | kvtrace capture attach --stdin
      kvtrace capture attach --llama-swap http://127.0.0.1:8080 --model qwen-dflash
    """
    from capture.wrap import CaptureOptions, UsageError, run_attach

    live = LiveDashboard(kw.pop("dashboard"))

    def go() -> Outcome:
        chosen = [name for name, on in (("--file", path is not None), ("--stdin", use_stdin),
                                         ("--llama-swap", swap_url is not None)) if on]
        if len(chosen) != 1:
            raise UsageError("give exactly one of --file PATH, --stdin, --llama-swap URL")
        if (follow or from_end) and path is None:
            raise UsageError("--follow and --from-end go with --file")
        if model and swap_url is None:
            raise UsageError("--model goes with --llama-swap")
        opts = CaptureOptions(**kw)
        live.attach(opts)
        kind = "file" if path is not None else "stdin" if use_stdin else "llama-swap"
        return run_attach(kind, opts, path=path, follow=follow, from_end=from_end, url=swap_url, model=model)

    _finish(go, live)


@capture_group.command(name="llama-swap")
@click.argument("config", type=click.Path(path_type=Path))
@click.argument("model")
@capture_options
@run_options
def llama_swap_cmd(config: Path, model: str, **kw: Any) -> None:
    """Run MODEL's cmd from a llama-swap CONFIG under `capture run`.

    Expands ${PORT} (a free local port), ${MODEL_ID} and the config's macros, applies the model's env,
    and pings with the model's own parameters (its checkEndpoint, its name, its setParams). A config
    holding only the model entries (as pasted in a bug report) works too.

    \b
    Examples:
      kvtrace capture llama-swap ~/llama-swap/config.yaml bee_qwen3.6-27b --ping 3
      kvtrace capture llama-swap config.yaml qwen-dflash --until-error --out ./repro
    """
    from capture.llamaswap import resolve
    from capture.session import free_port
    from capture.wrap import run_llama_swap

    live = LiveDashboard(kw.pop("dashboard"))

    def go() -> Outcome:
        opts = _run_opts(kw)
        live.attach(opts)
        swap = resolve(config, model, port=free_port())
        return run_llama_swap(swap, opts)

    _finish(go, live)


capture_group.add_command(engine_cmd)
