"""`kvtrace redact`: a log without the prompts and answers, to attach to a bug report
(kvtrace.analyze.reader.redact)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kvtrace.analyze.cli.options import fail, json_flag, out_option

if TYPE_CHECKING:
    from kvtrace.analyze.reader.redact import RedactSummary


def summary_lines(summary: RedactSummary, dest: str) -> list[str]:
    """What a redaction removed, for stderr: one line in all, then one per kind of text."""
    from kvtrace.analyze.reader.redact import BY_NAME

    lines = [f"kvtrace: wrote {dest}: {summary.changed:,} of {summary.lines:,} lines redacted (prompts and answers "
             "removed; positions, sequences, sizes, errors and statistics kept)"]
    for name, n in sorted(summary.removed.items(), key=lambda kv: -kv[1]):
        lines.append(f"kvtrace:   {n:>9,}  {BY_NAME[name].what}")
    if summary.cut:
        lines.append(f"kvtrace: {summary.cut:,} lines longer than 1 MiB were cut there, as kvtrace reads them")
    return lines


def summary_json(summary: RedactSummary, source: str, dest: str) -> dict[str, Any]:
    return {"source": source, "output": dest, **summary.to_dict()}


@click.command("redact")
@click.argument("source", metavar="LOG")
@out_option("Write the redacted log here (- for stdout). Default for a session folder: its shareable copy "
            "beside its log, recorded in its manifest.", folder=False)
@json_flag("Print what was removed as JSON on stdout.")
def redact_command(source: str, out: Path | None, as_json: bool) -> None:
    """Copy LOG without the user's prompts and the model's answers, to attach where others can read it.

    Removed: request and response JSON text, `Parsed message`, the slot's prompt, token text and ids in
    batch dumps (LLAMA_BATCH_DEBUG=2), draft candidates' and sampled tokens' pieces, grammars. Kept: every
    line, position, sequence, batch size, error and statistic, so the copy triages exactly like LOG. LOG
    itself is never changed. LOG is a file (plain or .gz), a session folder or - for stdin.

    Exit code: 0 written; 2 LOG could not be read or the output could not be written.

    \b
    Examples:
      kvtrace redact sessions/20261130-101500-run-llama-server      # SESSION/shareable.log
      kvtrace redact server.log -o server-shareable.log
      kvtrace redact server.log.gz -o - | gzip > shareable.log.gz
    """
    from kvtrace import analyze
    from kvtrace.analyze.reader.redact import redact_file, redact_session, redact_to
    from kvtrace.analyze.reader.session import SHAREABLE, folder_of, is_session, log_of

    folder = folder_of(Path(source)) if source != "-" else None
    session = folder if folder is not None and is_session(folder) else None
    to_stdout = out is not None and str(out) == "-"
    if to_stdout and as_json:
        fail("--json and -o - would both write to stdout: give -o a file")
    if out is None and session is None:
        fail(f"{source}: give -o SHAREABLE (a file, or - for stdout); only a session folder has a default")
    if out is not None and not to_stdout and source != "-" and Path(source).exists():
        src_path = log_of(Path(source)) if Path(source).is_dir() else Path(source)
        if out.exists() and out.resolve() == src_path.resolve():
            fail(f"{out}: that is the log itself; redact into another file")
    try:
        if to_stdout:
            summary = redact_to(source, sys.stdout.buffer)
            sys.stdout.buffer.flush()
            dest = "stdout"
        elif out is None:
            assert session is not None
            summary = redact_session(session)
            dest = str(session / SHAREABLE)
        else:
            summary = redact_file(source, out)
            dest = str(out)
    except analyze.InputError as exc:
        fail(str(exc))
    except OSError as exc:  # the output's folder missing or read-only, a full disk
        fail(f"{out if out is not None and not to_stdout else exc.filename}: cannot write: {exc.strerror or exc}")
    for line in summary_lines(summary, dest):
        click.echo(line, err=True)
    if as_json:
        click.echo(json.dumps(summary_json(summary, source, dest)))


__all__ = ["redact_command", "summary_json", "summary_lines"]
