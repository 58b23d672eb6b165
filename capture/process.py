"""The wrapped program, started with stdout and stderr merged into raw.log itself (one file position keeps
the order the program wrote in) and stopped politely, then firmly; and reading a pipe (stdin attach) in
large chunks, or splicing it into raw.log.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

READ_SIZE = 1 << 20
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Runs in the child before exec: if the wrapper is killed (even -9), the child gets SIGTERM."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _program_child() -> None:
    """Runs in the program before exec: it dies with the wrapper, and SIGINT has its default action. The
    wrapper stops it with SIGINT first, on purpose; started with SIGINT ignored (a background job, `nohup
    ... &`), the wrapper would otherwise pass that on and the polite stop would never work."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ready(fd: int, stop: threading.Event, poll_s: float) -> Iterator[None]:
    """Once each time `fd` has something to read (or hit EOF); ends when `stop` is set and nothing waits."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while True:
        try:
            ready = poller.poll(int(poll_s * 1000))
        except InterruptedError:
            continue
        if ready:
            yield
        elif stop.is_set():
            return


def read_fd(fd: int, stop: threading.Event, *, poll_s: float = 0.2) -> Iterator[bytes]:
    """Chunks from a pipe or tty until EOF, or until `stop` is set and nothing more is waiting."""
    for _ in _ready(fd, stop, poll_s):
        try:
            chunk = os.read(fd, READ_SIZE)
        except InterruptedError:
            continue
        except OSError:
            return
        if not chunk:
            return
        yield chunk


def splice_fd(fd: int, splice: Callable[[int, int], int], stop: threading.Event, *, poll_s: float = 0.2) -> bool:
    """Like read_fd, but the bytes go from the pipe to the sink inside the kernel (`splice` is
    RawSink.splice_from). False, before anything moved, when `fd` cannot be spliced (not a pipe)."""
    moved = False
    for _ in _ready(fd, stop, poll_s):
        try:
            n = splice(fd, READ_SIZE)
        except InterruptedError:
            continue
        except OSError as exc:
            # EINVAL before anything moved: not a pipe (a file on stdin); the caller reads it instead.
            return moved or exc.errno != errno.EINVAL
        if n == 0:
            return True
        moved = True
    return True


def signal_name(returncode: int | None) -> str | None:
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


@dataclass(slots=True)
class StopPlan:
    """Bounded waits after each signal; the whole stop never takes longer than their sum."""

    after_sigint_s: float = 10.0
    after_sigterm_s: float = 5.0
    after_sigkill_s: float = 5.0


class Child:
    """A program run in its own process group, its output in raw.log."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.signals_sent: list[str] = []
        self.started_at = 0.0

    def start(self, output: int) -> None:
        """Start the program writing its stdout and stderr to `output` (raw.log, open for appending): no pipe
        between it and the disk, so a burst costs it no more than `CMD > file`. Raises OSError if it cannot
        start."""
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd,
            # Own process group: a terminal Ctrl-C reaches only the wrapper, which then stops the
            # program in order (and its helpers with it).
            process_group=0,
            preexec_fn=_program_child,
            bufsize=0,
        )
        self.started_at = time.time()

    def exit_fd(self) -> int | None:
        """A descriptor that becomes readable when the program exits (Linux pidfd), so a watcher wakes at
        once; None where there is none (then poll), or when it has exited and been reaped already."""
        if self.proc is None or not hasattr(os, "pidfd_open"):
            return None
        try:
            return os.pidfd_open(self.proc.pid)
        except OSError:
            return None

    def group_alive(self) -> bool:
        """Whether anything is left in the program's process group (itself, or helpers it started)."""
        if self.proc is None:
            return False
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _send(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.signals_sent.append(sig.name)
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def stop(self, plan: StopPlan, *, firm: bool = False) -> int | None:
        """SIGINT, wait; SIGTERM, wait; SIGKILL. `firm` skips straight to SIGKILL."""
        if self.proc is None:
            return None
        steps = [(signal.SIGKILL, plan.after_sigkill_s)]
        if not firm:
            steps = [(signal.SIGINT, plan.after_sigint_s), (signal.SIGTERM, plan.after_sigterm_s)] + steps
        for sig, wait_s in steps:
            if self.proc.poll() is not None:
                break
            self._send(sig)
            try:
                self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        # Helpers the program left in its group must not outlive the capture.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


def probe(argv: Sequence[str], env: Mapping[str, str], *, timeout_s: float = 30.0) -> str | None:
    """Run a quick informational command (`--version`, `--help`); its merged output, or None if it failed."""
    try:
        proc = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(env),
            timeout=timeout_s,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.decode("utf-8", errors="replace")
