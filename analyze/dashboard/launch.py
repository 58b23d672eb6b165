"""Starting the Streamlit dashboard (analyze/dashboard/app.py) on this machine, opened on a path.

The path goes to the app in the KVTRACE_OPEN environment variable, so a big local log is read on the
server side and never goes through the browser's upload limit; KVTRACE_FOLLOW=1 makes the app follow it
while it is written.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvtrace.analyze.reader.session import free_port

OPEN_ENV = "KVTRACE_OPEN"
FOLLOW_ENV = "KVTRACE_FOLLOW"
STOP_WAIT_S = 10.0
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8501


def app_path() -> Path:
    """The script Streamlit runs: inside the package, so a checkout and an installed wheel have it alike."""
    return Path(__file__).resolve().with_name("app.py")


def streamlit_command(host: str, port: int) -> list[str]:
    return [
        # `streamlit run`, with the opened log read while the server starts (analyze/dashboard/serve.py)
        sys.executable, "-m", "kvtrace.analyze.dashboard.serve", "run", str(app_path()),
        "--server.address", host,
        "--server.port", str(port),
        "--server.headless", "true",
        "--browser.gatherUsageStats", "false",
        "--server.fileWatcherType", "none",
        "--client.toolbarMode", "viewer",
    ]  # fmt: skip


@dataclass(slots=True)
class Dashboard:
    """A running dashboard: the streamlit process (the caller owns it) and where to point a browser."""

    proc: subprocess.Popen[bytes]
    url: str

    def stop(self, wait_s: float = STOP_WAIT_S) -> int:
        """Stop the server (SIGTERM, then SIGKILL after `wait_s`) and reap it, so its port is free again."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def launch(
    path: Path | None, host: str = DEFAULT_HOST, port: int | None = None, *, follow: bool = False,
    preexec_fn: Callable[[], None] | None = None, quiet: bool = False,
) -> Dashboard:
    """Start the dashboard in the background (also for `kvtrace demo` and `kvtrace capture ... --dashboard`).

    `preexec_fn` runs in the child before streamlit starts (the command layer passes one that stops it
    with its parent and, when following, lowers its priority); `quiet` sends its own output nowhere."""
    env = dict(os.environ)
    env.pop(FOLLOW_ENV, None)
    if path is not None:
        env[OPEN_ENV] = str(Path(path).resolve())
        if follow:
            env[FOLLOW_ENV] = "1"
    chosen = port if port is not None else free_port(host, DEFAULT_PORT)
    out = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen(streamlit_command(host, chosen), env=env, preexec_fn=preexec_fn, stdout=out, stderr=out)
    return Dashboard(proc, f"http://{host}:{chosen}")
