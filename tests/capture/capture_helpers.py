"""Helpers for the capture tests: run the real `kvtrace capture ...` CLI, write small child programs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvtrace.capture.llama_server import find_llama_server

BIN = Path(sys.executable).parent


def kvtrace_argv() -> list[str]:
    """The installed console script, as a user runs it."""
    return [str(BIN / "kvtrace")]


def run_kvtrace(
    *args: str, cwd: Path, timeout: float = 120, input: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        kvtrace_argv() + list(args), cwd=cwd, capture_output=True, timeout=timeout, input=input, env=env
    )


def start_kvtrace(*args: str, cwd: Path, **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        kvtrace_argv() + list(args),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        **kw,
    )


def write_script(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body).lstrip(), encoding="utf-8")
    return path


def manifest(session: Path) -> dict[str, Any]:
    return json.loads((session / "manifest.json").read_text(encoding="utf-8"))


def wait_for(cond: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def end_lines(stderr: bytes, first: str) -> list[str]:
    """What kvtrace printed from the last line starting with `first` on."""
    lines = stderr.decode().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(first)]
    assert starts, stderr.decode()[-2000:]
    return lines[starts[-1]:]


def file_contains(path: Path, needle: bytes) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return needle in path.read_bytes()
        except OSError:
            return False

    return check


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it has stopped running all the same.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


# Tests of a real llama-server: a user's machine without the built server skips them; CI always builds it
# (`make server`) and must run them, so there a missing server fails (the `llama_server` fixture).
NEEDS_SERVER = [
    pytest.mark.server,
    pytest.mark.skipif(find_llama_server() is None and not os.environ.get("CI"),
                       reason="llama-server is not built here: run `make server`"),
]
