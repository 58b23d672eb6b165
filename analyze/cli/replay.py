"""`kvtrace replay`: a recording's requests sent again to a new server under capture, then compare's verdict
between the two runs; `--shrink` finds the smallest part of the recording that still fails the same way."""

from __future__ import annotations

import io
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from kvtrace.analyze.cli.options import fail, json_flag, progress_option

if TYPE_CHECKING:
    from kvtrace.analyze.findings.compare import Comparison
    from kvtrace.capture.monitor import Terminal
    from kvtrace.capture.recording import RecordedRequest
    from kvtrace.capture.replay import ReplaySpec
    from kvtrace.capture.runner import Outcome

NOT_ANSWERED = "not_answered_the_same"
NOT_ANSWERED_HEADLINE = "the traffic was not answered the same"
# options after SESSION (as `kvtrace replay SESSION --out NEW -- CMD`); everything after `--` is the command
_PASSTHROUGH = {"ignore_unknown_options": True}


@dataclass(slots=True)
class Target:
    """Where the replay goes: a command to run, a llama-swap model to run, or a running server and its log."""

    cmd: list[str]
    swap: tuple[Path, str] | None
    server: str | None
    log: Path | None

    def describe(self) -> str:
        if self.server:
            return f"the server at {self.server}"
        return f"llama-swap model {self.swap[1]}" if self.swap else Path(self.cmd[0]).name


def _recording(source: Path) -> tuple[Path, Path]:
    """(the recording to send, the recorded run's log): a session folder's recording, or a recording file (a
    shape, a repro) in a folder that holds the run's log (raw.log, or the shareable copy a user sent)."""
    from kvtrace.analyze.reader.session import RECORDED, SHAREABLE, log_of

    if source.is_dir():
        folder, recording = source, source / RECORDED
        if not recording.is_file():
            fail(f"{source} has no {RECORDED}: record the run first (kvtrace capture run --record -- ...)")
    elif source.is_file():
        folder, recording = source.parent, source
    else:
        fail(f"{source}: no such session folder or recording file")
    for log in (log_of(folder), folder / SHAREABLE):
        if log.is_file():
            return recording, log
    fail(f"{folder} holds no log of the recorded run ({log_of(folder).name} or {SHAREABLE}): the verdict compares "
         "the replay against it")


def _records(recording: Path) -> list[RecordedRequest]:
    from kvtrace.capture.recording import RecordingError, read_records

    try:
        records = read_records(recording)
    except RecordingError as exc:
        fail(str(exc))
    if not any(r.reached_server for r in records):
        fail(f"{recording}: none of its requests reached the server (it was never listening): nothing to replay")
    return records


def _target(cmd: tuple[str, ...], swap: tuple[Path, str] | None, server: str | None, log: Path | None) -> Target:
    chosen = [name for name, on in (("-- CMD", bool(cmd)), ("--llama-swap", swap is not None),
                                     ("--server", server is not None)) if on]
    if len(chosen) != 1:
        fail("give exactly one server to replay on: -- CMD..., --llama-swap CONFIG MODEL, or --server URL --log FILE")
    if (server is None) != (log is None):
        fail("--server and --log go together: the running server's address, and the file it writes its log to")
    if server is not None and not server.startswith(("http://", "https://")):
        fail(f"--server wants the server's address, e.g. http://127.0.0.1:8080 (got {server!r})")
    return Target(list(cmd), swap, server, log)


def run_replay(target: Target, spec: ReplaySpec, out: Path | None, terminal: Terminal, kw: dict[str, Any],
               label: str) -> Outcome:
    """One replay under capture: the command run, the llama-swap model run, or the running server's log followed.
    UsageError and ConfigError for bad input (exit 2)."""
    from kvtrace.capture.attach import FileSource
    from kvtrace.capture.wrap import CaptureOptions, RunOptions, run_attach, run_llama_swap, run_wrapped

    common = {"out": out, "label": label, "timeout_s": kw["timeout_s"], "stop_wait_s": kw["stop_wait_s"],
              "replay": spec}
    if target.server is not None:
        assert target.log is not None
        spec.options.settle_s = 1.0  # the log's last lines come a moment after the last answer
        return run_attach(FileSource(target.log, follow=True, from_end=True),
                          CaptureOptions(server_url=target.server, **common), terminal=terminal)
    opts = RunOptions(**common)
    if target.swap is not None:
        from kvtrace.analyze.reader.session import free_port
        from kvtrace.capture.llamaswap import resolve

        swap = resolve(target.swap[0], target.swap[1], port=free_port())
        if swap.health_path is not None:
            spec.options.health_path = swap.health_path
        return run_llama_swap(swap, opts, terminal=terminal)
    return run_wrapped(target.cmd, opts, terminal=terminal, kind="replay")


def _replay_summary(outcome: Outcome) -> dict[str, Any]:
    from kvtrace.analyze.reader.session import KEY_REPLAY

    summary = outcome.manifest.get(KEY_REPLAY)
    return summary if isinstance(summary, dict) else {}


def _check_served(outcome: Outcome, target: Target) -> dict[str, Any]:
    """The replay's summary; exit 2 in one line when the server never answered."""
    summary = _replay_summary(outcome)
    if not summary.get("healthy"):
        why = summary.get("error") or outcome.error or f"it stopped ({outcome.reason})"
        last = f"; its last line: {outcome.startup_lines[-1]}" if outcome.startup_lines else ""
        fail(f"error: {target.describe()} never answered, nothing was replayed: {why}{last} "
             f"(session: {outcome.session})")
    return summary


def replay_verdict(c: Comparison, recorded: int, answered: int) -> str:
    """compare's verdict, unless the replay's traffic was not answered as recorded and the new run shows no
    failure: then neither "fixed" nor "unchanged" can be told (the requests that would fail never ran)."""
    if answered < recorded and c.verdict in ("fixed", "unchanged"):
        return NOT_ANSWERED
    return c.verdict


def _verdict_text(c: Comparison, verdict: str, summary: dict[str, Any]) -> str:
    from kvtrace.analyze.findings.compare import format_comparison

    lines = format_comparison(c).splitlines()
    if verdict == NOT_ANSWERED:
        missing = summary.get("recorded", 0) - summary.get("answered", 0)
        lines = [f"verdict: {NOT_ANSWERED_HEADLINE}: {missing} of {summary.get('recorded', 0)} requests were not "
                 f"answered as recorded (compare alone says {c.verdict})" if line.startswith("verdict: ") else line
                 for line in lines]
    lines.append(f"requests: {summary.get('recorded', 0)} recorded, {summary.get('answered', 0)} answered as "
                 f"recorded ({summary.get('same_text', 0)} with the same text, {summary.get('cancelled', 0)} "
                 "cancelled where the client cancelled)")
    return "\n".join(lines)


def _terminal(quiet: bool, as_json: bool) -> Terminal:
    from kvtrace.capture.monitor import Terminal

    return Terminal(echo=not quiet and not as_json, status=not quiet and sys.stderr.isatty())


def _capture_or_fail(target: Target, spec: ReplaySpec, out: Path | None, terminal: Terminal, kw: dict[str, Any],
                     label: str) -> Outcome:
    from kvtrace.capture.llamaswap import ConfigError
    from kvtrace.capture.wrap import UsageError

    try:
        return run_replay(target, spec, out, terminal, kw, label)
    except (UsageError, ConfigError) as exc:
        fail(f"error: {exc}")


@click.command("replay", context_settings=_PASSTHROUGH)
@click.argument("source", metavar="SESSION", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="The new session folder (default: a new one under ./sessions); with --shrink, the smallest "
                   "run's, holding repro.jsonl and every try under tries/.")
@json_flag("Print {\"verdict\", \"session\", \"requests\": {\"recorded\", \"answered\"}} on stdout.")
@click.option("--as-fast", is_flag=True, help="Drop the gaps: each request as soon as the ones it waited for "
              "in the recording have ended (order and overlap kept).")
@click.option("--llama-swap", "swap", nargs=2, type=(click.Path(path_type=Path), str), metavar="CONFIG MODEL",
              help="Run MODEL's cmd from a llama-swap CONFIG (as `capture llama-swap`) instead of -- CMD.")
@click.option("--server", metavar="URL", help="A server that is already running (with --log).")
@click.option("--log", "log", type=click.Path(dir_okay=False, path_type=Path),
              help="With --server: the file that server writes its log to (read from its end while replaying).")
@click.option("--shrink", is_flag=True, help="Find the smallest part of the recording that still fails the same "
              "way (same signature): drop requests, then whole turns of a conversation; writes repro.jsonl.")
@click.option("--max-runs", type=click.IntRange(min=1), default=32, show_default=True,
              help="With --shrink: at most this many server runs.")
@click.option("--health-timeout", "health_timeout_s", type=float, default=600.0, show_default=True,
              help="Seconds to wait for the server's /health before giving up (exit 2).")
@click.option("--timeout", "timeout_s", type=float, help="Stop each replay after this many seconds.")
@click.option("--stop-wait", "stop_wait_s", type=float, default=10.0, show_default=True,
              help="Seconds to wait after SIGINT (then half that after SIGTERM) before SIGKILL.")
@click.option("--quiet", "-q", is_flag=True, help="Do not echo the server's log or show the status line.")
@progress_option
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def replay_command(source: Path, out: Path | None, as_json: bool, as_fast: bool, swap: tuple[Path, str] | None,
                   server: str | None, log: Path | None, shrink: bool, max_runs: int, health_timeout_s: float,
                   quiet: bool, progress: bool | None, cmd: tuple[str, ...], **kw: Any) -> None:
    """Send a recording's requests again to a new server (say, the fix) under capture, then compare the runs.

    SESSION is a session recorded with `capture run --record` (its requests.jsonl), or a recording file: a
    shape (requests.shape.jsonl, from `kvtrace redact`) or a repro.jsonl, in a folder with the recorded run's log.
    The requests go out as they were: same order, concurrency, streaming, cancels and gaps; at temperature 0
    the same positions per request. The new server moves to a private port of its own.

    \b
    Verdict (compare's between the recorded run and the replay) and exit status:
      fixed          the recorded run fails, the replay does not          exit 0
      unchanged      neither fails                                        exit 0
      still_failing  both fail                                            exit 1
      regressed      the replay fails, the recorded run did not           exit 1
      not_answered_the_same  requests answered then were not now, and
                     the replay shows no failure: it cannot tell          exit 1
      (bad input, a server that never answers:                            exit 2)

    \b
    Examples:
      kvtrace replay sessions/…-before -- ./fix/build/bin/llama-server -m model.gguf -md draft.gguf --port 8080
      kvtrace replay sessions/…-before --llama-swap config.yaml qwen-dflash --json
      kvtrace replay sessions/…-before --server http://127.0.0.1:8080 --log server.log
      kvtrace replay sessions/…-before --shrink --as-fast --out ./repro -- llama-server ...
      kvtrace replay shared/requests.shape.jsonl -- llama-server -m model.gguf ...
    """
    from kvtrace.capture.replay import ReplayOptions, ReplaySpec

    target = _target(cmd, swap, server, log)
    recording, recorded_log = _recording(source)
    records = _records(recording)
    options = ReplayOptions(as_fast=as_fast, health_timeout_s=health_timeout_s)
    label = f"{recording.parent.name}"
    if shrink:
        _shrink(target, records, recording, recorded_log, out, options, kw, quiet, as_json, label, progress,
                max_runs)
    spec = ReplaySpec(records, options, str(recording))
    outcome = _capture_or_fail(target, spec, out, _terminal(quiet, as_json), kw, label)
    summary = _check_served(outcome, target)
    click.echo(f"kvtrace: replay: {outcome.session} (stopped: {outcome.reason})", err=True)
    if outcome.reason.startswith("signal "):  # stopped by the user: the session is
        raise SystemExit(outcome.exit_code)  # kept and parses, but a cut replay has no verdict (128 + the signal)
    _verdict(recorded_log, outcome, summary, as_json, progress)


def _verdict(recorded_log: Path, outcome: Outcome, summary: dict[str, Any], as_json: bool,
             progress: bool | None) -> NoReturn:
    from kvtrace.analyze.cli.options import parse_or_fail
    from kvtrace.analyze.findings.compare import compare

    assert outcome.session is not None
    a, b = parse_or_fail(str(recorded_log), progress), parse_or_fail(str(outcome.session), progress)
    c = compare(a, b, (str(recorded_log.parent), str(outcome.session)))
    verdict = replay_verdict(c, int(summary.get("recorded", 0)), int(summary.get("answered", 0)))
    if as_json:
        click.echo(json.dumps({"verdict": verdict, "session": str(outcome.session),
                               "requests": {"recorded": summary.get("recorded", 0),
                                            "answered": summary.get("answered", 0)}}))
    else:
        click.echo(_verdict_text(c, verdict, summary))
    raise SystemExit(1 if verdict == NOT_ANSWERED else c.exit_code)


# ---- --shrink ------------------------------------------------------------------------------------------------

def _shrink(target: Target, records: list[RecordedRequest], recording: Path, recorded_log: Path, out: Path | None,
            options: Any, kw: dict[str, Any], quiet: bool, as_json: bool, label: str,
            progress: bool | None, max_runs: int) -> NoReturn:
    """Delta debugging on real server runs (kvtrace.capture.shrink): each try a replay under capture in
    OUT/tries/NNN; the smallest failing try's session becomes OUT itself, with repro.jsonl beside its log."""
    from kvtrace import analyze
    from kvtrace.analyze.cli.options import parse_or_fail
    from kvtrace.analyze.findings.signatures import match_signature
    from kvtrace.analyze.reader.session import DEFAULT_ROOT, RAW_LOG, RECORDED, REPRO, session_name
    from kvtrace.capture.recording import read_records, write_records
    from kvtrace.capture.replay import ReplaySpec
    from kvtrace.capture.shrink import candidate_key, shrink

    recorded = parse_or_fail(str(recorded_log), progress)
    wanted = match_signature(recorded).name
    if not len(recorded.errors):
        fail(f"{recorded_log}: the recorded run did not fail ({wanted}): nothing to shrink to")
    work = out or DEFAULT_ROOT / session_name("shrink", label)
    if work.exists() and any(work.iterdir()):
        fail(f"{work} is not empty: choose another --out for the shrink")
    tries = work / "tries"
    passing: dict[tuple[tuple[int, int], ...], Path] = {}  # a candidate -> its try, when it failed the same way
    runs = 0

    def fails(candidate: list[RecordedRequest]) -> bool:
        nonlocal runs
        runs += 1
        folder = tries / f"{runs:03d}"
        spec = ReplaySpec(candidate, options, str(recording))
        terminal = _terminal(True, True) if quiet or as_json else _quiet_terminal()
        outcome = _capture_or_fail(target, spec, folder, terminal, kw, label)
        _check_served(outcome, target)
        result = analyze.parse(folder / RAW_LOG)
        got = match_signature(result).name
        same = bool(len(result.errors)) and got == wanted
        n_msgs = sum(len(r.body.get("messages") or []) if isinstance(r.body, dict) else 0 for r in candidate)
        click.echo(f"kvtrace: shrink run {runs}: {len(candidate)} request(s), {n_msgs} message(s): "
                   + ("fails the same way" if same else f"does not ({got})"), err=True)
        if same:
            passing[candidate_key(candidate)] = folder
        return same

    click.echo(f"kvtrace: shrinking {len(records)} request(s) that fail as {wanted} on {target.describe()}, in at "
               f"most {max_runs} server runs", err=True)
    result = shrink(records, fails, max_runs)
    best_try = passing.get(candidate_key(result.records))
    if best_try is None:
        click.echo(f"kvtrace: the whole recording does not fail as {wanted} on {target.describe()}: nothing to "
                   f"shrink (its run: {tries / '001'})", err=True)
        raise SystemExit(1)
    for entry in best_try.iterdir():  # the smallest failing run becomes the shrink's session
        shutil.move(str(entry), str(work / entry.name))
    best_try.rmdir()
    write_records(result.records, work / REPRO)
    replayed = read_records(work / RECORDED)
    prompt = sum(int((r.timings or {}).get("prompt_n", 0)) + int((r.timings or {}).get("cache_n", 0))
                 for r in replayed)
    answer = sum(int((r.timings or {}).get("predicted_n", 0)) for r in replayed)
    n_msgs = sum(len(r.body.get("messages") or []) if isinstance(r.body, dict) else 0 for r in result.records)
    more = "" if result.complete else "; --max-runs ran out first: more runs may shrink it further"
    click.echo(f"kvtrace: shrunk {len(records)} request(s) to {len(result.records)} ({n_msgs} message(s); "
               f"{prompt} prompt and {answer} answer tokens as the server counted them) in {result.runs} server "
               f"run(s){more}; the smallest failing run: {work}; its requests: {work / REPRO}", err=True)
    if as_json:
        click.echo(json.dumps({"session": str(work), "repro": str(work / REPRO), "signature": wanted,
                               "requests": {"recorded": len(records), "left": len(result.records)},
                               "tokens": {"prompt": prompt, "answer": answer}, "runs": result.runs,
                               "complete": result.complete}))
    raise SystemExit(0)


def _quiet_terminal() -> Terminal:
    """A try's capture says nothing (the shrink says one line a run)."""
    from kvtrace.capture.monitor import Terminal

    return Terminal(echo=False, status=False, err=io.StringIO())


__all__ = ["NOT_ANSWERED", "replay_command", "replay_verdict", "run_replay"]
