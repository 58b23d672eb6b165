"""A real Dask cluster on loopback for the cluster tests and benchmarks: a `dask scheduler` and N
`dask worker` processes (subprocesses, each its own interpreter, as on a fleet), always stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kvtrace.analyze.reader.session import free_port

DASK = str(Path(sys.executable).with_name("dask"))
ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Cluster:
    address: str
    scheduler: subprocess.Popen[bytes]
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def dask_processes(workers: int = 2, threads: int = 1, timeout: float = 60.0) -> Iterator[Cluster]:
    """A scheduler and `workers` workers (no nanny: killing a worker's process kills the worker)."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "cwd": ROOT, "env": env}
    cluster = Cluster(address, subprocess.Popen([DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                                 "--no-dashboard", "--no-show"], **quiet))  # type: ignore[call-overload]
    try:
        for i in range(workers):
            cluster.workers.append(subprocess.Popen(
                [DASK, "worker", address, "--host", "127.0.0.1", "--nthreads", str(threads), "--no-nanny",
                 "--no-dashboard", "--name", f"w{i}", "--death-timeout", "60"], **quiet))  # type: ignore[call-overload]
        from distributed import Client

        deadline = time.monotonic() + timeout
        while True:
            try:
                with Client(address, timeout=5, set_as_default=False) as client:
                    client.wait_for_workers(workers, timeout=max(1.0, deadline - time.monotonic()))
                break
            except OSError:
                if time.monotonic() > deadline or cluster.scheduler.poll() is not None:
                    raise
                time.sleep(0.5)
        yield cluster
    finally:
        for proc in [*cluster.workers, cluster.scheduler]:
            _stop(proc)
