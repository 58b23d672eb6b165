"""`kvtrace capture run|attach|llama-swap` as library calls: prepare, say what happens, capture, and return
the Outcome.

Nothing here prints a summary: what happens while the capture runs goes to the Terminal the caller passes
(the command line's echo, status line and messages), and the command layer (analyze/cli/capture.py)
presents the Outcome.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtrace.analyze.reader.session import (
    KEY_COMMAND_LINE,
    KEY_PING_CONFIG,
    KEY_PROGRAM,
    KEY_RECORD,
    KEY_REPLAY,
    METRICS,
    RAW_LOG,
    RECORDED,
    REQUESTS,
    Session,
    free_port,
    is_session,
    new_session,
)
from kvtrace.capture import llama_args
from kvtrace.capture.attach import AttachError, AttachSource
from kvtrace.capture.devices import list_devices, rpc_endpoints
from kvtrace.capture.gpus import query_gpus
from kvtrace.capture.llamaswap import SwapModel
from kvtrace.capture.metrics import MetricsScraper
from kvtrace.capture.monitor import Terminal
from kvtrace.capture.ping import PingConfig, Pinger, PingOptions
from kvtrace.capture.process import Child, StopPlan, probe
from kvtrace.capture.runner import EXIT_USAGE, Driver, Outcome, ProgramOutput, StopRules, run_capture

if TYPE_CHECKING:
    from kvtrace.capture.proxy import RecordingProxy
    from kvtrace.capture.replay import ReplaySpec

_OFF = {"0", "off", "no", "false", ""}


class UsageError(Exception):
    """Bad input found before anything started: a one-line message, exit 2."""


@dataclass(slots=True)
class CaptureOptions:
    out: Path | None = None
    root: Path | None = None
    label: str = ""
    until_error: bool = False
    grace_s: float = 5.0
    timeout_s: float | None = None
    stop_wait_s: float = 10.0
    # Called with the session folder once it exists, before anything is captured (`--dashboard` opens it).
    on_session: Callable[[Path], None] | None = None
    server_url: str | None = None  # `attach --server`: the running server whose /metrics to scrape
    # `kvtrace replay`: the requests sent to the server once it is healthy (the capture stops after them)
    replay: ReplaySpec | None = None


@dataclass(slots=True)
class RunOptions(CaptureOptions):
    ping: PingOptions = field(default_factory=PingOptions)
    keep_running: bool = False
    debug_env: dict[str, str | None] = field(default_factory=dict)  # NAME -> value, None = leave as is
    extra_env: dict[str, str] = field(default_factory=dict)
    log_flags: bool = True
    metrics: bool = True  # add --metrics to a llama-server whose --help lists it, and scrape /metrics
    # --record: kvtrace listens where the server would (the client's port), the server moves to a private port
    record: bool = False


@dataclass(slots=True)
class Prepared:
    argv: list[str]
    env: dict[str, str]
    is_llama: bool
    added: list[str]
    skipped: list[str]
    version: str | None
    set_env: dict[str, str]  # what kvtrace set or the user set for this run
    removed_env: list[str]
    devices: dict[str, Any] | None = None  # the program's own --list-devices, parsed (kvtrace.capture.devices)
    metrics: bool = False  # the command serves /metrics (ours or the user's --metrics) and it is scraped
    metrics_added: bool = False  # kvtrace added --metrics (not among `added`: those are the log flags)


def debug_environment(
    choices: dict[str, str | None], base: dict[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The debug switches: the user's option wins, then what their environment already says, then 1."""
    set_env: dict[str, str] = {}
    removed: list[str] = []
    for name, default in llama_args.DEBUG_ENV.items():
        chosen = choices.get(name)
        value = base.get(name, default) if chosen is None else chosen
        if value.strip().lower() in _OFF:
            removed.append(name)
        else:
            set_env[name] = value
    return set_env, removed


def resolve_program(argv: list[str], env: dict[str, str]) -> str:
    if not argv:
        raise UsageError("no command given: put it after `--`, e.g. kvtrace capture run -- llama-server ...")
    found = shutil.which(argv[0], path=env.get("PATH"))
    if found is None:
        where = "not an executable file" if os.path.exists(argv[0]) else "not found"
        raise UsageError(f"program {where}: {argv[0]}")
    return found


def prepare(argv: list[str], opts: RunOptions) -> Prepared:
    base = dict(os.environ)
    debug, removed = debug_environment(opts.debug_env, base)
    set_env = {**debug, **opts.extra_env}
    env = {k: v for k, v in base.items() if k not in removed}
    env.update(set_env)
    resolve_program(argv, env)
    is_llama = llama_args.is_llama_program(argv[0])
    version = None
    added: list[str] = []
    skipped: list[str] = []
    effective = list(argv)
    metrics_added = False
    devices = None
    if is_llama:
        version = probe([argv[0], "--version"], env)
        wants_help = opts.log_flags or opts.metrics or rpc_endpoints(argv)
        help_text = probe([argv[0], "--help"], env) if wants_help else None
        known = help_text if help_text and "--" in help_text else None
        aug = llama_args.add_log_flags(argv, env, known) if opts.log_flags else llama_args.Augmented(list(argv))
        effective, added, skipped = aug.argv, aug.added, aug.skipped
        if opts.metrics:
            with_metrics = llama_args.add_metrics_flag(effective, env, known)
            metrics_added, effective = len(with_metrics) > len(effective), with_metrics
        devices = list_devices(argv[0], argv, env, known)
        if devices is not None and devices.get("error") and rpc_endpoints(argv):
            # llama.cpp would stop at start-up (or wait) on an RPC server it cannot reach: say so at once
            raise UsageError(str(devices["error"]))
    metrics = is_llama and opts.metrics and llama_args.serves_metrics(effective, env)
    return Prepared(effective, env, is_llama, added, skipped, version, set_env, removed, devices, metrics,
                    metrics_added)


def _version_text(text: str | None) -> str | None:
    if text is None:
        return None
    lines = [ln for ln in text.splitlines() if ln.strip()][:20]
    return llama_args.redact_text("\n".join(lines))


def default_terminal() -> Terminal:
    """What a library call gets without a Terminal of its own: no echo, no status line; messages on stderr."""
    return Terminal(echo=False, status=False)


def _rules(opts: CaptureOptions, keep_running: bool = False) -> StopRules:
    w = opts.stop_wait_s
    return StopRules(
        timeout_s=opts.timeout_s,
        until_error=opts.until_error,
        grace_s=opts.grace_s,
        keep_running=keep_running,
        plan=StopPlan(after_sigint_s=w, after_sigterm_s=max(1.0, w / 2), after_sigkill_s=5.0),
    )


def _session(opts: CaptureOptions, kind: str, label: str) -> Session:
    if opts.out is not None and is_session(opts.out):
        # Two captures in one folder would mix their manifests: each capture gets its own.
        raise UsageError(f"{opts.out} already holds a capture ({RAW_LOG}); choose another --out")
    try:
        session = new_session(kind, opts.label or label, out=opts.out, root=opts.root)
    except OSError as exc:
        raise UsageError(f"cannot create the session folder: {exc}") from exc
    if opts.on_session is not None:
        opts.on_session(session.path)
    return session


def run_wrapped(
    argv: list[str],
    opts: RunOptions,
    *,
    terminal: Terminal | None = None,
    kind: str = "run",
    manifest_extra: dict[str, Any] | None = None,
) -> Outcome:
    """Wrap a program: `kvtrace capture run -- CMD ARGS...`."""
    terminal = terminal or default_terminal()
    say = terminal.message
    if argv and (opts.record or opts.replay is not None) and not llama_args.is_llama_program(argv[0]):
        what = "--record" if opts.record else "a replay"
        raise UsageError(f"{what} needs a llama.cpp server (llama-server, a fork's build of it): it moves the "
                         f"server to a port of its own with --host/--port")
    prep = prepare(argv, opts)
    flags = llama_args.triage_flags(prep.argv, prep.env) if prep.is_llama else {}
    host, port = llama_args.endpoint(prep.argv, prep.env)
    listen = llama_args.listen_address(prep.argv, prep.env)
    if opts.record or opts.replay is not None:
        # the server moves to a private loopback port: the proxy takes its place, or only the replay talks to it
        host, port = "127.0.0.1", free_port()
        prep.argv = llama_args.listening_at(prep.argv, host, port)
    if opts.record:
        _check_port_free(listen)  # before a session folder exists: a port in use is bad input, nothing started
    label = Path(argv[0]).name
    session = _session(opts, kind, label)
    proxy = _start_proxy(listen, llama_args.base_url(host, port), session, say) if opts.record else None
    try:
        return _run_program(argv, prep, flags, opts, session, terminal, kind, manifest_extra, proxy, (host, port),
                            listen)
    finally:
        if proxy is not None:
            stats = proxy.stop()
            session.write_manifest({KEY_RECORD: stats.manifest() | {"file": RECORDED}})
            say(f"kvtrace: recorded {stats.requests} request(s) ({stats.cancelled} cancelled by the client) in "
                f"{session.path / RECORDED}")


def _check_port_free(listen: tuple[str, int]) -> None:
    import socket

    family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe_socket:
        probe_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the proxy binds it
        try:
            probe_socket.bind(listen)
        except OSError as exc:
            raise UsageError(f"cannot listen on {listen[0]}:{listen[1]} to record the client's requests: "
                             f"{exc.strerror or exc}; stop what uses port {listen[1]}, or give the server another "
                             "--port") from None


def _start_proxy(listen: tuple[str, int], upstream: str, session: Session, say: Callable[[str], None],
                 ) -> RecordingProxy:
    from kvtrace.capture.proxy import ProxyError, RecordingProxy

    proxy = RecordingProxy(listen[0], listen[1], upstream, session.path / RECORDED, say)
    try:
        proxy.start()
    except ProxyError as exc:
        raise UsageError(str(exc)) from exc
    say(f"kvtrace: recording: your client talks to {proxy.stats.listen} as before; the server listens on "
        f"{upstream} behind it")
    return proxy


def _run_program(argv: list[str], prep: Prepared, flags: dict[str, object], opts: RunOptions, session: Session,
                 terminal: Terminal, kind: str, manifest_extra: dict[str, Any] | None, proxy: RecordingProxy | None,
                 server: tuple[str, int], listen: tuple[str, int]) -> Outcome:
    say = terminal.message
    host, port = server
    redacted = llama_args.redact_argv(prep.argv)
    say(f"kvtrace: running: {llama_args.shell_join(redacted)}")
    if prep.added or prep.metrics_added:
        ours = [*prep.added, *([llama_args.METRICS_FLAG] if prep.metrics_added else [])]
        say(f"kvtrace: added for parseable debug output: {' '.join(ours)}")
    if prep.skipped:
        say(f"kvtrace: this build does not list {' '.join(prep.skipped)}; left out")
    shown_env = " ".join(f"{k}={v}" for k, v in llama_args.redact_env(prep.set_env).items())
    say(
        f"kvtrace: environment: {shown_env or '(nothing set)'}"
        + (f"; unset: {' '.join(prep.removed_env)}" if prep.removed_env else "")
    )
    say(f"kvtrace: session: {session.path}")

    manifest: dict[str, Any] = {
        "kind": kind,
        "session": session.path.name,
        "command": llama_args.redact_argv(argv),
        "effective_command": redacted,
        KEY_COMMAND_LINE: llama_args.shell_join(redacted),
        "added_flags": prep.added,
        "added_metrics_flag": prep.metrics_added,
        "skipped_flags": prep.skipped,
        "env_set": llama_args.redact_env(prep.set_env),
        "env_unset": prep.removed_env,
        "env": llama_args.relevant_env(prep.env),
        "llama_program": prep.is_llama,
        "version": _version_text(prep.version),
        "triage_flags": flags,
        "devices": prep.devices,
        "gpus": query_gpus(prep.env),
        "cwd": os.getcwd(),
    }
    if proxy is not None:
        manifest[KEY_RECORD] = proxy.stats.manifest() | {"file": RECORDED}
    ping_cfg = None
    if opts.ping.n > 0:
        # through the proxy when recording: the pings are part of the traffic the server got
        ping_host = "127.0.0.1" if listen[0] in ("0.0.0.0", "::") else listen[0]
        ping_at = (ping_host, listen[1]) if proxy is not None else (host, port)
        ping_cfg = PingConfig(opts.ping, *ping_at, llama_args.api_key(prep.argv, prep.env))
        manifest[KEY_PING_CONFIG] = ping_cfg.manifest()
    manifest.update(manifest_extra or {})
    session.write_manifest(manifest)

    child = Child(prep.argv, prep.env)
    # the program writes raw.log itself: a pipe in between cost a program logging in bursts 3x its own time
    out_fd = os.open(session.raw_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    start = os.fstat(out_fd).st_size
    try:
        child.start(output=out_fd)
    except OSError as exc:
        session.write_manifest({"error": f"could not start: {exc}", "exit_code": EXIT_USAGE})
        raise UsageError(f"could not start {argv[0]}: {exc.strerror or exc}") from exc
    finally:
        os.close(out_fd)  # the program holds its own copies
    session.write_manifest({KEY_PROGRAM: {"pid": child.pid}})
    driver: Driver | None = None
    if opts.replay is not None:
        driver = _replayer(opts.replay, llama_args.base_url(host, port), session, child.running, say,
                           llama_args.api_key(prep.argv, prep.env))
    elif ping_cfg is not None:
        driver = Pinger(ping_cfg, child.running, session.path / REQUESTS, terminal.message)
    scraper = None
    if prep.metrics:
        scraper = MetricsScraper(llama_args.base_url(host, port), session.path / METRICS, terminal.message,
                                 api_key=llama_args.api_key(prep.argv, prep.env), alive=child.running)
    return run_capture(
        session,
        ProgramOutput(child, start),
        terminal=terminal,
        rules=_rules(opts, opts.keep_running),
        child=child,
        driver=driver,
        scraper=scraper,
    )


def _replayer(spec: ReplaySpec, url: str, session: Session, alive: Callable[[], bool], say: Callable[[str], None],
              api_key: str | None) -> Driver:
    from kvtrace.capture.replay import Replayer

    if api_key and not spec.options.api_key:
        spec.options.api_key = api_key
    session.write_manifest({KEY_REPLAY: {"source": spec.source, "url": url, "requests": len(spec.records)}})
    return Replayer(spec, url, session.path / RECORDED, alive, say)


def run_llama_swap(swap: SwapModel, opts: RunOptions, *, terminal: Terminal | None = None) -> Outcome:
    """`kvtrace capture llama-swap CONFIG MODEL`: the model's cmd and env under `capture run`."""
    opts.extra_env = {**swap.env, **opts.extra_env}
    if swap.health_path is not None:
        opts.ping.health_path = swap.health_path
    elif opts.ping.n:
        raise UsageError(
            f"model {swap.model_id!r} has checkEndpoint: none, so --ping cannot tell when it is ready"
        )
    opts.ping.model = opts.ping.model or swap.requested
    opts.ping.request_params = {**swap.request_params, **opts.ping.request_params}
    extra = {
        "llama_swap": {
            "config": str(swap.config),
            "model_id": swap.model_id,
            "requested": swap.requested,
            "port": swap.port,
            "env": llama_args.redact_env(swap.env),
            "cmd": llama_args.redact_text(swap.raw_cmd),
        }
    }
    try:
        return run_wrapped(swap.argv, opts, terminal=terminal, kind="llama-swap", manifest_extra=extra)
    except UsageError as exc:
        raise UsageError(f"model {swap.model_id!r} in {swap.config}: {exc}") from exc


def run_attach(source: AttachSource, opts: CaptureOptions, *, terminal: Terminal | None = None) -> Outcome:
    """`kvtrace capture attach`: capture a log something else runs (kvtrace.capture.attach: a file, stdin, a stream)."""
    terminal = terminal or default_terminal()
    if opts.server_url is not None and not opts.server_url.startswith(("http://", "https://")):
        raise UsageError(f"--server wants the server's address, e.g. http://127.0.0.1:8080 (got {opts.server_url!r})")
    try:
        pump = source.open(terminal.message)
    except AttachError as exc:
        raise UsageError(str(exc)) from exc
    session = _session(opts, "attach", source.label)
    terminal.message(f"kvtrace: session: {session.path}")
    session.write_manifest(
        {"kind": "attach", "session": session.path.name, "attach": source.describe(), "cwd": os.getcwd()}
    )
    scraper = None
    if opts.server_url:
        scraper = MetricsScraper(opts.server_url, session.path / METRICS, terminal.message)
    driver = None
    if opts.replay is not None:
        if not opts.server_url:
            raise UsageError("a replay into an attached log needs the server's address (--server URL)")
        driver = _replayer(opts.replay, opts.server_url, session, lambda: True, terminal.message, None)
    return run_capture(session, pump, terminal=terminal, rules=_rules(opts), scraper=scraper, driver=driver)
