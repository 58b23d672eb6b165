"""Sources for `kvtrace capture attach`: a log file (followed through truncation and rotation), stdin, and
llama-swap's log stream.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from capture.process import READ_SIZE
from capture.runner import FdSource, Source

LLAMA_SWAP_WARNING = (
    "kvtrace: note: llama-swap drops log lines when a reader falls behind (its buffer is about 100 KiB), "
    "so this capture may have gaps; for a complete log run the model under "
    "`kvtrace capture llama-swap CONFIG MODEL` instead"
)


class AttachError(Exception):
    """A source that cannot be read at all (one-line message for the user, exit 2)."""


def follow_file(
    path: Path,
    *,
    follow: bool,
    from_end: bool = False,
    poll_s: float = 0.2,
    say: Callable[[str], None] = lambda _m: None,
) -> Source:
    """Read `path`; with `follow`, keep reading as it grows, reopen it when it is rotated (a new file at the
    same name) and start over when it is truncated in place."""
    path = Path(path)
    try:
        # Opened now, so a missing file is reported before anything starts.
        first = open(path, "rb")  # noqa: SIM115 - the generator below owns and closes it
    except OSError as exc:
        raise AttachError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if from_end:
        first.seek(0, os.SEEK_END)

    def gen(stop: threading.Event) -> Iterator[bytes]:
        f = first
        try:
            while True:
                data = f.read(READ_SIZE)
                if data:
                    yield data
                    continue
                if not follow or stop.is_set():
                    return
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    st = None  # moved away, the new one not created yet
                cur = os.fstat(f.fileno())
                if st is not None and (st.st_ino, st.st_dev) != (cur.st_ino, cur.st_dev):
                    # Rotated: finish what the old file got after our last read, then switch.
                    rest = f.read()
                    if rest:
                        yield rest
                    f.close()
                    f = open(path, "rb")  # noqa: SIM115 - closed in the finally below
                    say(f"kvtrace: {path} was rotated; following the new file")
                    continue
                if st is not None and st.st_size < f.tell():
                    f.seek(0)
                    say(f"kvtrace: {path} was truncated; reading it again from the start")
                    continue
                stop.wait(poll_s)
        finally:
            f.close()

    return gen


def stdin_source() -> Source:
    return FdSource(0)


def llama_swap_url(base: str, model: str | None) -> str:
    base = base.rstrip("/")
    stream = f"/logs/stream/{model}" if model else "/logs/stream/upstream"
    path = base if "/logs/stream" in base else base + stream
    return path + ("&" if "?" in path else "?") + "no-history"


def llama_swap_source(base: str, model: str | None, *, connect_timeout_s: float = 10.0) -> Source:
    """Stream llama-swap's log endpoint. Checks the connection before the capture starts."""
    url = llama_swap_url(base, model)
    client = httpx.Client(trust_env=False, timeout=httpx.Timeout(connect_timeout_s, read=None))
    try:
        request = client.build_request("GET", url)
        resp = client.send(request, stream=True)
    except httpx.HTTPError as exc:
        client.close()
        raise AttachError(f"cannot connect to llama-swap at {url}: {type(exc).__name__}: {exc}") from exc
    if resp.status_code != 200:
        resp.close()
        client.close()
        raise AttachError(f"llama-swap answered HTTP {resp.status_code} for {url}")

    def gen(stop: threading.Event) -> Iterator[bytes]:
        closed_by_us = threading.Event()

        def close_on_stop() -> None:
            # A quiet stream would block the read forever: closing it is the only way to end the read.
            stop.wait()
            closed_by_us.set()
            resp.close()

        threading.Thread(target=close_on_stop, name="kvtrace-swap-close", daemon=True).start()
        try:
            yield from resp.iter_raw()
        except Exception:
            if not closed_by_us.is_set():
                raise
        finally:
            stop.set()
            resp.close()
            client.close()

    return gen
