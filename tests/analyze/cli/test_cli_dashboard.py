"""`kvtrace dashboard`: a real streamlit server on 127.0.0.1 opened on a session, and clear usage errors."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from kvtrace.analyze.cli.dashboard import dashboard_command
from kvtrace.analyze.reader.session import free_port
from tests.conftest import wait_for_dashboard

ROOT = Path(__file__).resolve().parents[3]


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
        [sys.executable, "-m", "kvtrace.analyze", "dashboard", str(ROOT / "samples" / "stale-drafter"), "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        first = proc.stdout.readline().decode()
        assert re.search(rf"http://127\.0\.0\.1:{port}\b", first), first
        wait_for_dashboard(port, proc)
        # Ctrl-C goes to the whole foreground group: the command and streamlit both get SIGINT.
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _port_free(port: int, timeout_s: float = 20) -> bool:
    """Nothing listens on the port and it can be bound again (the server is gone, not just quiet)."""
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                with socket.socket() as again:
                    again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    again.bind(("127.0.0.1", port))
                    return True
        time.sleep(0.2)
    return False


def _dashboard(port: int, *args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("KVTRACE_OPEN", "KVTRACE_FOLLOW")}
    return subprocess.Popen(
        [sys.executable, "-m", "kvtrace.analyze", "dashboard", str(ROOT / "samples" / "stale-drafter"), "--port", str(port),
         *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def test_sigterm_and_sigkill_of_the_command_stop_the_server_and_free_the_port() -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        port = free_port()
        proc = _dashboard(port, "--follow")
        try:
            wait_for_dashboard(port, proc)
            os.kill(proc.pid, sig)  # the command alone, not its group: the server must not stay behind
            proc.wait(timeout=20)
            assert _port_free(port), f"the streamlit server still holds port {port} after {sig.name}"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_started_with_sigint_ignored_it_still_stops_on_sigint() -> None:
    """A background job (`kvtrace dashboard ... &`, nohup) starts with SIGINT ignored; `kill -INT` must still
    stop the command and its server."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("KVTRACE_OPEN", "KVTRACE_FOLLOW")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvtrace.analyze", "dashboard", str(ROOT / "samples" / "stale-drafter"), "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    try:
        wait_for_dashboard(port, proc)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        assert _port_free(port), "the streamlit server outlived the command"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_follow_rejects_a_finished_gzip(tmp_path: Path) -> None:
    gz = tmp_path / "done.log.gz"
    import gzip

    gz.write_bytes(gzip.compress(b"x\n"))
    res = CliRunner().invoke(dashboard_command, [str(gz), "--follow"])
    assert res.exit_code == 2 and "open it without --follow" in res.output
    res = CliRunner().invoke(dashboard_command, ["--follow"])
    assert res.exit_code == 2 and "needs a SESSION" in res.output


def test_capture_dashboard_follows_the_session_and_stops_with_the_capture(tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    program = (
        "import os, sys, time\n"
        "i = 0\n"
        f"while not os.path.exists({str(stop)!r}):\n"
        "    print('line', i, flush=True); i += 1; time.sleep(0.05)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("KVTRACE_OPEN", "KVTRACE_FOLLOW")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvtrace.analyze", "capture", "run", "--dashboard", "--quiet", "--out", str(tmp_path / "s"),
         "--", sys.executable, "-c", program],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        said = ""
        while (m := re.search(r"dashboard: http://127\.0\.0\.1:(\d+)", said)) is None:
            line = proc.stderr.readline().decode()
            assert line, said
            said += line
        port = int(m[1])
        wait_for_dashboard(port, proc)
        stop.touch()  # the program exits: the capture ends, and its dashboard with it
        rest = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 0
        assert "dashboard stopped" in rest and "kvtrace dashboard" in rest
        assert _port_free(port), f"the capture's dashboard still holds port {port}"
    finally:
        stop.touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_busy_port_is_one_line_and_exit_2() -> None:
    """A --port something already listens on: one line naming it, exit 2, and nothing else (not the URL of
    whatever holds the port, not the server's warnings)."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k not in ("KVTRACE_OPEN", "KVTRACE_FOLLOW")}
        res = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "dashboard", "--port", str(port)], cwd=ROOT,
                             env=env, capture_output=True, timeout=120)
    assert res.returncode == 2
    assert res.stdout == b""
    assert res.stderr.decode().splitlines() == [
        f"kvtrace dashboard: port {port} on 127.0.0.1 is in use; pick another with --port, or leave --port out for "
        "the first free one"]


def test_the_server_starts_without_streamlit_warnings() -> None:
    """The 7 "No runtime found" warnings on every start are gone: the server's start-up output has no warning."""
    port = free_port()
    proc = _dashboard(port)
    try:
        wait_for_dashboard(port, proc)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = out.decode("utf-8", "replace")
    assert "You can now view your Streamlit app" in text  # the server's own output was read
    assert "WARNING" not in text and "No runtime found" not in text, text
