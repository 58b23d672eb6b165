"""`kvtrace dashboard`: a real streamlit server on 127.0.0.1 opened on a session, and clear usage errors."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from click.testing import CliRunner

from analyze.cli.dashboard import dashboard_command
from analyze.views.dashboard import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(dashboard_command, [str(tmp_path / "nope.log")])
    assert res.exit_code == 2
    assert "no such file" in res.output
    assert "Traceback" not in res.output
    res = CliRunner().invoke(dashboard_command, [str(tmp_path)])  # a folder that is not a session
    assert res.exit_code == 2 and "without raw.log" in res.output


def test_help_has_examples() -> None:
    res = CliRunner().invoke(dashboard_command, ["--help"])
    assert res.exit_code == 0 and "kvtrace dashboard" in res.output and "--port" in res.output


def test_dashboard_serves_on_localhost_and_stops_on_ctrl_c() -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "KVTRACE_OPEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "analyze", "dashboard", str(ROOT / "samples" / "stale-drafter"), "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        first = proc.stdout.readline().decode()
        assert re.search(rf"http://127\.0\.0\.1:{port}\b", first), first
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as resp:
                    assert resp.status == 200
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()
                assert time.monotonic() < deadline, "the dashboard did not answer within 60 s"
                time.sleep(0.3)
        # Ctrl-C goes to the whole foreground group: the command and streamlit both get SIGINT.
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
