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
    from kvtrace.capture.shape import ShapeSummary


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


def shape_lines(summary: ShapeSummary, dest: Path) -> list[str]:
    """What the shape of a recording kept and dropped, for stderr."""
    lines = [f"kvtrace: wrote {dest}: {summary.requests:,} requests, {summary.texts:,} texts ({summary.tokens:,} "
             f"tokens) made up, {summary.linked_answers:,} answers sent back linked; order, timing, sampling and "
             "tool-call structure kept"]
    if summary.dropped:
        lines.append("kvtrace: dropped from the shape: " + ", ".join(f"{what} ({n})" for what, n in
                                                                        summary.dropped.items()))
    return lines


def write_session_shape(session: Path, model: Path | None, tokenizer: Path | None) -> tuple[ShapeSummary, Path]:
    """The session's recording (--record) shaped beside it; ShapeError or RecordingError, each one line."""
    from kvtrace.analyze.reader.session import SHAPE
    from kvtrace.capture.shape import write_shape

    return write_shape(session, model, tokenizer), session / SHAPE


@click.command("redact")
@click.argument("source", metavar="LOG")
@out_option("Write the redacted log here (- for stdout). Default for a session folder: its shareable copy "
            "beside its log, recorded in its manifest.", folder=False)
@json_flag("Print what was removed as JSON on stdout.")
@click.option("--model", type=click.Path(dir_okay=False, path_type=Path),
              help="For a recorded session's shape: the model whose tokenizer counts the tokens (default: the "
                   "model the session's server loaded).")
@click.option("--tokenizer", type=click.Path(dir_okay=False, path_type=Path),
              help="For the shape: llama.cpp's llama-tokenize (default: beside the server that ran, or any build).")
def redact_command(source: str, out: Path | None, as_json: bool, model: Path | None, tokenizer: Path | None) -> None:
    """Copy LOG without the user's prompts and the model's answers, to attach where others can read it.

    Removed: request and response JSON text, `Parsed message`, the slot's prompt, token text and ids in
    batch dumps (LLAMA_BATCH_DEBUG=2), draft candidates' and sampled tokens' pieces, grammars. Kept: every
    line, position, sequence, batch size, error and statistic, so the copy triages exactly like LOG. LOG
    itself is never changed. LOG is a file (plain or .gz), a session folder or - for stdin.

    A session recorded with --record also gets requests.shape.jsonl: its requests with every text replaced by
    made-up text of the same token count (the model's own tokenizer counts them), shared prefixes, tool-call
    structure, sampling parameters and timing kept: `kvtrace replay` sends it to a server like the recording.

    Exit code: 0 written; 2 LOG could not be read, the output could not be written, or the shape could not be
    made (no tokenizer for the model).

    \b
    Examples:
      kvtrace redact sessions/20261130-101500-run-llama-server      # SESSION/shareable.log
      kvtrace redact server.log -o server-shareable.log
      kvtrace redact server.log.gz -o - | gzip > shareable.log.gz
      kvtrace redact sessions/20261130-101500-run-llama-server --model qwen.gguf   # + requests.shape.jsonl
    """
    from kvtrace import analyze
    from kvtrace.analyze.reader.redact import redact_file, redact_session, redact_to
    from kvtrace.analyze.reader.session import RECORDED, SHAREABLE, folder_of, is_session, log_of
    from kvtrace.capture.recording import RecordingError
    from kvtrace.capture.shape import ShapeError

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
    shape: dict[str, Any] | None = None
    problem = None
    if session is not None and (session / RECORDED).is_file():
        try:
            shaped, shape_file = write_session_shape(session, model, tokenizer)
        except (ShapeError, RecordingError) as exc:
            problem = f"no shape of the requests written: {exc}"
        else:
            shape = {"output": str(shape_file), **shaped.to_dict()}
            for line in shape_lines(shaped, shape_file):
                click.echo(line, err=True)
    if as_json:
        click.echo(json.dumps(summary_json(summary, source, dest) | ({"shape": shape} if shape else {})))
    if problem:
        fail(problem)


__all__ = ["redact_command", "shape_lines", "summary_json", "summary_lines", "write_session_shape"]
