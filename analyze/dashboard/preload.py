"""Reading the log named on the command line while the dashboard's server starts, so the first page waits
only for what is left of the parse (`kvtrace dashboard big.log`: the work starts when the user asks for it).

The parse runs in its own process (`python -m kvtrace.analyze.dashboard.preload PATH OUT`), so it has a core of its own
while streamlit starts, and hands its result over as a pickle. The job is keyed by the file's path, size and
modification time: a page asking about other bytes parses them itself.

A big upload is parsed the same way (`start_upload`, `take_upload`, keyed by its digest), at a lower priority:
the page draws the chart of the upload's head meanwhile, and the browser drawing it comes first.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import shutil
import signal
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
    folder: Path | None = None  # an upload's: its bytes and the pickle, removed with it


_jobs: dict[str, _Job] = {}
_lock = threading.Lock()
_at_exit = False


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
        proc = _spawn([path, out])
    except OSError:
        os.unlink(out)
        return
    with _lock:
        _jobs[key[0]] = _Job(key, proc, Path(out))


UPLOAD_NICE = 10  # an upload's parse yields the cores to the browser drawing the chart of its head


def start_upload(digest: str, data: bytes, name: str) -> None:
    """Start parsing an upload's bytes (`digest`: their sha256) in a child process at a lower priority;
    `take_upload` hands the result over. Its bytes go to a private temporary folder, removed with the job."""
    key = (f"upload:{digest}", len(data), 0)
    with _lock:
        if key[0] in _jobs:
            return
    folder = Path(tempfile.mkdtemp(prefix="kvtrace-upload-"))
    log, out = folder / "upload", folder / "parsed.pickle"
    try:
        log.write_bytes(data)
        proc = _spawn([str(log), str(out), name, str(UPLOAD_NICE)])
    except (OSError, ValueError):  # ValueError: a NUL in the stranger's file name; the page then parses it itself
        shutil.rmtree(folder, ignore_errors=True)
        return
    job = _Job(key, proc, out, folder)
    with _lock:
        started = _jobs.setdefault(key[0], job)
    if started is not job:  # another page started it meanwhile
        _stop(job)


def take_upload(digest: str, size: int) -> Parsed | None:
    """The parse `start_upload` began of these bytes (waiting for it to finish), once; else None."""
    return _taken(f"upload:{digest}", (f"upload:{digest}", size, 0))


def take(path: str) -> Parsed | None:
    """The preloaded parse of `path` if it is of these very bytes (waiting for it to finish), once; else None."""
    key = _key(path)
    return _taken(key[0], key) if key is not None else None


def _taken(name: str, key: tuple[str, int, int]) -> Parsed | None:
    with _lock:
        job = _jobs.pop(name, None)
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
        _stop(job)  # other bytes than it was reading: stopped; its files removed either way


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    """The child, in a process group of its own: stopping it stops the processes its split parse started too."""
    global _at_exit  # noqa: PLW0603 - once per process
    if not _at_exit:  # a process that ends without the server's own discard (a test) leaves nothing either
        atexit.register(discard)
        _at_exit = True
    return subprocess.Popen([sys.executable, "-m", "kvtrace.analyze.dashboard.preload", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _stop(job: _Job) -> None:
    """The job's child and its pieces' processes stopped (a killed child would leave those waiting for work
    forever), its files removed."""
    if job.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.proc.pid, signal.SIGKILL)
    job.proc.wait()
    _remove(job)


def _remove(job: _Job) -> None:
    job.out.unlink(missing_ok=True)
    if job.folder is not None:
        shutil.rmtree(job.folder, ignore_errors=True)


def discard() -> None:
    """Stop every job no page took and remove its file (the server is stopping)."""
    with _lock:
        jobs = list(_jobs.values())
        _jobs.clear()
    for job in jobs:
        _stop(job)


def _child(path: str, out: str, name: str | None = None, nice: int = 0) -> int:
    from kvtrace.analyze.reader.parser import parse
    from kvtrace.analyze.reader.source import InputError

    parent = os.getppid()
    if nice:
        os.nice(nice)  # its pieces' processes inherit it
    try:
        # every core: the split parse reads a big log in pieces (a .gz unpacked first; a small one serially)
        got: Parsed = (parse(path, name=name, jobs=os.cpu_count() or 1), None)
    except InputError as exc:
        got = (None, str(exc))
    if os.getppid() != parent:  # the server is gone: nobody will read it
        Path(out).unlink(missing_ok=True)
        if name is not None:  # an upload's bytes too, in their own folder
            shutil.rmtree(Path(path).parent, ignore_errors=True)
        return 1
    with open(out, "wb") as fh:
        pickle.dump(got, fh, protocol=pickle.HIGHEST_PROTOCOL)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]  # PATH OUT [NAME NICE]: an upload's bytes are named as uploaded
    raise SystemExit(_child(args[0], args[1], args[2], int(args[3])) if len(args) == 4 else _child(args[0], args[1]))
