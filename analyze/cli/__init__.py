"""`kvtrace`: the one command layer, composing the reader (analyze), its views and capture.

Each command lives in a small module here and imports the heavy parts (pandas, the reader, the engine)
inside its body, so `kvtrace --help` loads only click. Nothing imports this package back.

Exit codes: 0 the input was read (whatever it shows), 1 a command's own check failed (a capture whose
child failed, a compare that regressed), 2 bad input or usage, or a path that cannot be read or written, with
a one-line reason on stderr; 3 a bug in kvtrace itself (one line; KVTRACE_DEBUG=1 shows the traceback);
130 interrupted.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

# name -> "module:attribute"; loaded when the command is asked for (help lists load them all, cheaply)
COMMANDS = {
    "capture": "kvtrace.analyze.cli.capture:capture_group",
    "compare": "kvtrace.analyze.cli.reports:compare_command",
    "dashboard": "kvtrace.analyze.cli.dashboard:dashboard_command",
    "demo": "kvtrace.analyze.cli.engine:demo_command",
    "export": "kvtrace.analyze.cli.reports:export_command",
    "parse": "kvtrace.analyze.cli.read:parse_command",
    "query": "kvtrace.analyze.cli.query:query_command",
    "redact": "kvtrace.analyze.cli.redact:redact_command",
    "replay": "kvtrace.analyze.cli.replay:replay_command",
    "report": "kvtrace.analyze.cli.reports:report_command",
    "triage": "kvtrace.analyze.cli.read:triage_command",
}


class LazyGroup(click.Group):
    """A group whose commands are imported by name on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, _, attr = COMMANDS[cmd_name].partition(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="kvtrace")
def cli() -> None:
    """Capture and analyse llama.cpp speculative-decoding traces: where the drafter's KV cache and
    the target's parted ways.

    \b
    Examples:
      kvtrace demo                                  # reproduce the stale-drafter failure on this CPU
      kvtrace triage bug-report.md                  # one verdict per log
      kvtrace parse sessions/20261130-…/ -o tables/ # position tables as Parquet
      kvtrace capture run --ping 3 -- llama-server -m t.gguf -md d.gguf --spec-type draft-simple
      kvtrace dashboard sessions/20261130-…/
    """



def main() -> None:
    """Entry point: no traceback reaches the user unless KVTRACE_DEBUG is set."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("kvtrace: interrupted", err=True)
        raise SystemExit(130) from None
    except click.ClickException as exc:
        exc.show()
        raise SystemExit(2) from None
    except BrokenPipeError:
        sys.stderr.close()
        raise SystemExit(0) from None
    except SystemExit:
        raise
    except KeyboardInterrupt:
        click.echo("kvtrace: interrupted", err=True)
        raise SystemExit(130) from None
    except OSError as exc:  # a path that cannot be written or read (permissions, a name too long, a full disk)
        if os.environ.get("KVTRACE_DEBUG"):
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        click.echo(f"kvtrace: {where}{exc.strerror or exc}; check the path, its permissions and free space",
                   err=True)
        raise SystemExit(2) from None
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, not a traceback
        if os.environ.get("KVTRACE_DEBUG"):
            raise
        click.echo(f"kvtrace: internal error: {type(exc).__name__}: {exc} (set KVTRACE_DEBUG=1 for details)", err=True)
        raise SystemExit(3) from None



__all__ = ["COMMANDS", "cli", "main"]
