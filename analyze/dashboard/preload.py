"""Reading the log named on the command line while the dashboard's server starts, so the first page waits
only for what is left of the parse (`kvtrace dashboard big.log`: the work starts when the user asks for it).

The parse runs in its own process (`python -m kvtrace.analyze.dashboard.preload PATH OUT`), so it has a core of its own
while streamlit starts, and hands its result over as a pickle. The job is keyed by the file's path, size and
modification time: a page asking about other bytes parses them itself.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvtrace.analyze.reader.session import log_named

if TYPE_CHECKING:  # the server imports this before streamlit starts: the reader (pandas) loads in the child
    from kvtrace.analyze.reader.parser import ParseResult

Parsed = tuple["ParseResult | None", "str | None"]


@dataclass(slots=True)
class _Job:
    key: tuple[str, int, int]
    proc: subprocess.Popen[bytes]
    out: Path


_jobs: dict[str, _Job] = {}
_lock = threading.Lock()


def _key(path: str) -> tuple[str, int, int] | None:
    p = Path(path)
    log = log_named(p)
    try:
        st = os.stat(log)
    except OSError:
        return None
    return str(p.resolve()), st.st_size, st.st_mtime_ns


def start(path: str) -> None:
    """Start parsing `path` (a log or a session folder) in a child process; `take` hands the result over."""
    key = _key(path)
    if key is None:
        return  # the page says what is wrong with it
    fd, out = tempfile.mkstemp(prefix="kvtrace-preload-", suffix=".pickle")
    os.close(fd)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "kvtrace.analyze.dashboard.preload", path, out],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        os.unlink(out)
        return
    with _lock:
        _jobs[key[0]] = _Job(key, proc, Path(out))


def take(path: str) -> Parsed | None:
    """The preloaded parse of `path` if it is of these very bytes (waiting for it to finish), once; else None."""
    key = _key(path)
    with _lock:
        job = _jobs.pop(key[0], None) if key is not None else None
    if job is None:
        return None
    try:
        if job.key != key or job.proc.wait() != 0:
            return None
        with open(job.out, "rb") as fh:
            got: Parsed = pickle.load(fh)  # written by this very program, below
        return got
    except (OSError, pickle.UnpicklingError, EOFError):
        return None
    finally:
        if job.proc.poll() is None:  # other bytes than it was reading: stop it
            job.proc.kill()
            job.proc.wait()
        job.out.unlink(missing_ok=True)


def discard() -> None:
    """Stop every job no page took and remove its file (the server is stopping)."""
    with _lock:
        jobs = list(_jobs.values())
        _jobs.clear()
    for job in jobs:
        if job.proc.poll() is None:
            job.proc.kill()
        job.proc.wait()
        job.out.unlink(missing_ok=True)


def _child(path: str, out: str) -> int:
    from kvtrace.analyze.reader.parser import parse
    from kvtrace.analyze.reader.source import InputError

    parent = os.getppid()
    try:
        # every core: the split parse reads a big log in pieces (a .gz unpacked first; a small one serially)
        got: Parsed = (parse(path, jobs=os.cpu_count() or 1), None)
    except InputError as exc:
        got = (None, str(exc))
    if os.getppid() != parent:  # the server is gone: nobody will read it
        Path(out).unlink(missing_ok=True)
        return 1
    with open(out, "wb") as fh:
        pickle.dump(got, fh, protocol=pickle.HIGHEST_PROTOCOL)
    return 0


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1], sys.argv[2]))
