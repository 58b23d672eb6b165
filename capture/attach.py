"""Where `kvtrace capture attach` reads a log from: a file (followed through truncation and rotation), stdin,
llama-swap's log stream, or any URL that streams a log.

Each source is a small value the command line builds. It opens itself (what the capture reads, checked
before anything starts) and describes itself (the manifest's `attach` entry), so a new source is one class
here and its options in the command line.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import httpx

from kvtrace import analyze
from kvtrace.capture import llama_args
from kvtrace.capture.process import READ_SIZE
from kvtrace.capture.runner import FdSource, Source

LLAMA_SWAP_WARNING = (
    "kvtrace: note: llama-swap drops log lines when a reader falls behind (its buffer is about 100 KiB), "
    "so this capture may have gaps; for a complete log run the model under "
    "`kvtrace capture llama-swap CONFIG MODEL` instead"
)

Say = Callable[[str], None]


class AttachError(Exception):
    """A source that cannot be read at all (one-line message for the user, exit 2)."""


class AttachSource(Protocol):
    """What `run_attach` captures from."""

    kind: ClassVar[str]  # the manifest's attach.source

    @property
    def label(self) -> str:
        """Added to the session folder's name."""
        ...

    def describe(self) -> dict[str, Any]:
        """The manifest's `attach` entry (no secrets)."""
        ...

    def open(self, say: Say) -> Source:
        """Check the source can be read (AttachError when not) and give what the capture pumps from; `say`
        tells the user what happens to it meanwhile (a rotated file, a note on the source)."""
        ...


@dataclass(frozen=True, slots=True)
class FileSource:
    """A log file a server writes; with `follow`, read as it grows until a stop rule fires."""

    kind: ClassVar[str] = "file"
    path: Path
    follow: bool = False
    from_end: bool = False  # with follow: skip what the file already holds
    poll_s: float = 0.2

    @property
    def label(self) -> str:
        return self.path.name

    def describe(self) -> dict[str, Any]:
        return {"source": self.kind, "path": str(self.path), "follow": self.follow, "from_end": self.from_end}

    def open(self, say: Say) -> Source:
        tail = analyze.FileTail(self.path)
        try:
            tail.open(at_end=self.from_end)  # now, so a missing file is reported before anything starts
        except OSError as exc:
            raise AttachError(f"cannot read {self.path}: {exc.strerror or exc}") from exc

        def chunks(stop: threading.Event) -> Iterator[bytes]:
            try:
                while True:
                    data = tail.read(READ_SIZE)
                    if data:
                        yield data
                        continue
                    if not self.follow or stop.is_set():
                        return
                    change, rest = tail.check()
                    if rest:
                        yield rest
                    if change == tail.ROTATED:
                        say(f"kvtrace: {self.path} was rotated; following the new file")
                    elif change == tail.TRUNCATED:
                        say(f"kvtrace: {self.path} was truncated; reading it again from the start")
                    else:
                        stop.wait(self.poll_s)
            finally:
                tail.close()

        return chunks


@dataclass(frozen=True, slots=True)
class StdinSource:
    """Standard input, e.g. `llama-server ... 2>&1 | kvtrace capture attach --stdin`."""

    kind: ClassVar[str] = "stdin"

    @property
    def label(self) -> str:
        return "stdin"

    def describe(self) -> dict[str, Any]:
        return {"source": self.kind}

    def open(self, say: Say) -> Source:
        return FdSource(0)


def _stream(url: str, what: str, connect_timeout_s: float) -> Source:
    """GET `url` and stream its body. Connects (and checks the answer) before the capture starts."""
    client = httpx.Client(trust_env=False, timeout=httpx.Timeout(connect_timeout_s, read=None))
    try:
        resp = client.send(client.build_request("GET", url), stream=True)
    except httpx.HTTPError as exc:
        client.close()
        raise AttachError(f"cannot connect to {what} at {url}: {type(exc).__name__}: {exc}") from exc
    if resp.status_code != 200:
        resp.close()
        client.close()
        raise AttachError(f"{what} answered HTTP {resp.status_code} for {url}")

    def chunks(stop: threading.Event) -> Iterator[bytes]:
        closed_by_us = threading.Event()

        def close_on_stop() -> None:
            # A quiet stream would block the read forever: closing it is the only way to end the read.
            stop.wait()
            closed_by_us.set()
            resp.close()

        threading.Thread(target=close_on_stop, name="kvtrace-stream-close", daemon=True).start()
        try:
            yield from resp.iter_raw()
        except Exception:
            if not closed_by_us.is_set():
                raise
        finally:
            stop.set()
            resp.close()
            client.close()

    return chunks


@dataclass(frozen=True, slots=True)
class UrlSource:
    """Any HTTP URL whose answer is a log, streamed until it ends or a stop rule fires."""

    kind: ClassVar[str] = "url"
    url: str
    connect_timeout_s: float = 10.0

    @property
    def label(self) -> str:
        return "url"

    def describe(self) -> dict[str, Any]:
        return {"source": self.kind, "url": llama_args.redact_text(self.url)}

    def open(self, say: Say) -> Source:
        return _stream(self.url, "the log stream", self.connect_timeout_s)


def llama_swap_url(base: str, model: str | None) -> str:
    base = base.rstrip("/")
    stream = f"/logs/stream/{model}" if model else "/logs/stream/upstream"
    path = base if "/logs/stream" in base else base + stream
    return path + ("&" if "?" in path else "?") + "no-history"


@dataclass(frozen=True, slots=True)
class LlamaSwapStream:
    """llama-swap's log endpoint: one model's log, or every upstream's (`model` None)."""

    kind: ClassVar[str] = "llama-swap"
    url: str  # llama-swap's base URL (or its /logs/stream/... URL)
    model: str | None = None
    connect_timeout_s: float = 10.0

    @property
    def label(self) -> str:
        return self.model or "llama-swap"

    def describe(self) -> dict[str, Any]:
        return {"source": self.kind, "url": llama_args.redact_text(self.url), "model": self.model,
                "warning": LLAMA_SWAP_WARNING}

    def open(self, say: Say) -> Source:
        say(LLAMA_SWAP_WARNING)
        return _stream(llama_swap_url(self.url, self.model), "llama-swap", self.connect_timeout_s)
