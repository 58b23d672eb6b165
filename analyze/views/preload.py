"""Reading the log named on the command line while the dashboard's server starts, so the first page waits
only for what is left of the parse (`kvtrace dashboard big.log`: the work starts when the user asks for it).

The job is keyed by the file's path, size and modification time: a page asking about other bytes parses
them itself.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from analyze.parser import ParseResult, parse
from analyze.source import InputError


@dataclass(slots=True)
class _Job:
    key: tuple[str, int, int]
    done: threading.Event = field(default_factory=threading.Event)
    result: ParseResult | None = None
    error: str | None = None


_jobs: dict[str, _Job] = {}
_lock = threading.Lock()


def _key(path: str) -> tuple[str, int, int] | None:
    p = Path(path)
    log = p / "raw.log" if p.is_dir() else p
    try:
        st = os.stat(log)
    except OSError:
        return None
    return str(p.resolve()), st.st_size, st.st_mtime_ns


def start(path: str) -> None:
    """Parse `path` (a log or a session folder) in a background thread; `take` hands the result over."""
    key = _key(path)
    if key is None:
        return  # the page says what is wrong with it
    job = _Job(key)
    with _lock:
        _jobs[key[0]] = job

    def run() -> None:
        try:
            job.result = parse(path)
        except InputError as exc:
            job.error = str(exc)
        except Exception:  # noqa: BLE001, S110 - the page parses again and shows its own message
            pass
        finally:
            job.done.set()
        # The modules the first page run needs next, imported while nobody waits.
        import analyze.views.figures  # noqa: F401

    threading.Thread(target=run, name="kvtrace-preload", daemon=True).start()


def take(path: str) -> tuple[ParseResult | None, str | None] | None:
    """The preloaded parse of `path` if it is of these very bytes (waiting for it to finish), once; else None."""
    key = _key(path)
    with _lock:
        job = _jobs.get(key[0]) if key is not None else None
        if job is None or job.key != key:
            return None
        del _jobs[key[0]]
    job.done.wait()
    if job.result is None and job.error is None:
        return None  # it failed unexpectedly: parse again in the page
    return job.result, job.error
