"""Starting the Streamlit dashboard (app.py) on this machine, opened on a path.

The path goes to the app in the KVTRACE_OPEN environment variable, so a big local log is read on the
server side and never goes through the browser's upload limit.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

OPEN_ENV = "KVTRACE_OPEN"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8501


def app_path() -> Path:
    """app.py sits beside the analyze package, in a checkout and in an installed wheel alike."""
    return Path(__file__).resolve().parents[2] / "app.py"


def free_port(host: str = DEFAULT_HOST, start: int = DEFAULT_PORT, tries: int = 50) -> int:
    """The first port from `start` that nothing listens on; else one the OS picks."""
    for port in range(start, start + tries):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def streamlit_command(host: str, port: int) -> list[str]:
    return [
        sys.executable, "-m", "streamlit", "run", str(app_path()),
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


def launch(path: Path | None, host: str = DEFAULT_HOST, port: int | None = None) -> Dashboard:
    """Start the dashboard in the background (also for `kvtrace demo`)."""
    env = dict(os.environ)
    if path is not None:
        env[OPEN_ENV] = str(Path(path).resolve())
    chosen = port if port is not None else free_port(host)
    proc = subprocess.Popen(streamlit_command(host, chosen), env=env)
    return Dashboard(proc, f"http://{host}:{chosen}")
