"""The client's requests, as `--record` keeps them and `kvtrace replay` sends them again: one JSON object a line.

Each line is one request: what was sent (method, path, the headers that matter, the JSON body), when (start,
first token, end, how many were in flight), how it ended (status, the client cancelling, the response's
`timings`, a digest of the answer). Never `Authorization`, cookies or keys: the headers are a short list of
harmless ones, and a body's key fields are dropped. The proxy, the replay and the shape all write and read
these records here, and reading checks every line: a cut or hand-edited file is one clear error.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

# Sent again by a replay; everything else (Authorization, cookies, x-api-key, tracing ids) is never recorded.
KEPT_HEADERS = ("content-type", "accept", "user-agent")
# Body fields that carry a credential in some clients: dropped from the record.
SECRET_BODY_KEYS = frozenset({"api_key", "apikey", "api-key", "authorization", "token", "access_token"})
FORMAT = 1


class RecordingError(Exception):
    """A recording that cannot be read: one line that says which line of which file, and why."""


@dataclass(slots=True)
class Answer:
    """What came back, as far as a replay needs it: the text's digest (to tell the same answer), why it ended."""

    sha256: str | None = None
    chars: int = 0
    finish_reason: str | None = None


@dataclass(slots=True)
class RecordedRequest:
    id: int  # order of arrival, from 0
    method: str
    path: str  # with the query string
    headers: dict[str, str]
    body: Any  # the JSON body; None without one (or with a body that is no JSON: body_b64)
    start: float  # unix seconds, when the request arrived
    end: float | None = None  # when the answer ended, or the client went away
    first_token: float | None = None  # the first streamed event carrying generated text
    in_flight: int = 1  # requests in flight when this one arrived, itself included
    stream: bool = False
    events: int = 0  # server-sent events passed on to the client
    cancelled: bool = False  # the client went away before the answer ended
    cancelled_at: float | None = None
    # where in the chunk stream the client went away: seconds after the last event passed on to it (None before
    # the first); with `events`, where a replay cuts, since a proxy cannot see which events the client read from
    # its own buffers
    cancel_gap: float | None = None
    status: int | None = None  # the server's HTTP status; None when it never answered
    reached_server: bool = True  # False: the server was not listening yet (kvtrace answered 503 itself)
    timings: dict[str, Any] | None = None  # the response's own `timings` (llama-server)
    answer: Answer = field(default_factory=Answer)
    error: str | None = None
    body_b64: str | None = None  # a body that is not JSON, as it was
    replay_of: int | None = None  # a replay's record: the recorded request it sent again
    # A shape's record (kvtrace redact): how the replay fills in what the made-up text cannot say, see
    # kvtrace.capture.shape
    shape: dict[str, Any] | None = None

    @property
    def offset_of_cancel(self) -> float | None:
        return None if self.cancelled_at is None else self.cancelled_at - self.start

    def body_bytes(self) -> bytes:
        if self.body_b64 is not None:
            return base64.b64decode(self.body_b64)
        return b"" if self.body is None else json.dumps(self.body).encode()

    def to_json(self) -> str:
        return json.dumps({"v": FORMAT, **asdict(self)}, ensure_ascii=False, separators=(",", ":"))


def kept_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers if k.lower() in KEPT_HEADERS}


def without_secrets(body: Any) -> Any:
    """The body without fields that hold a credential (top level and nested objects)."""
    if isinstance(body, dict):
        return {k: without_secrets(v) for k, v in body.items() if str(k).lower() not in SECRET_BODY_KEYS}
    if isinstance(body, list):
        return [without_secrets(v) for v in body]
    return body


def parse_body(raw: bytes, content_type: str) -> tuple[Any, str | None]:
    """(JSON body, None), or (None, base64) for a body that is not JSON; (None, None) for no body."""
    if not raw:
        return None, None
    if "json" in content_type.lower() or raw[:1] in (b"{", b"["):
        try:
            return without_secrets(json.loads(raw)), None
        except ValueError:
            pass
    return None, base64.b64encode(raw).decode()


# ---- answers: a JSON body or a stream of server-sent events -------------------------------------------------

def _text_of(obj: dict[str, Any]) -> str | None:
    """The generated text one answer object (or streamed event) carries: OpenAI's chat and completion shapes,
    or llama-server's own /completion (`content`)."""
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        c = choices[0]
        part = c.get("delta") if isinstance(c.get("delta"), dict) else c.get("message")
        if isinstance(part, dict):
            text = part.get("content")
            return text if isinstance(text, str) else None
        return c.get("text") if isinstance(c.get("text"), str) else None
    content = obj.get("content")
    return content if isinstance(content, str) else None


def _generated(obj: dict[str, Any]) -> bool:
    """Whether a streamed event carries generated text (content, reasoning or a tool call's pieces)."""
    if _text_of(obj):
        return True
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        delta = choices[0].get("delta")
        if isinstance(delta, dict):
            return bool(delta.get("reasoning_content") or delta.get("tool_calls"))
    return False


def _finish_reason(obj: dict[str, Any]) -> str | None:
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        return reason if isinstance(reason, str) else None
    stop_type = obj.get("stop_type")  # /completion
    return stop_type if isinstance(stop_type, str) and obj.get("stop") else None


def _data_of(event: bytes) -> bytes:
    """A server-sent event's data: its `data:` lines joined (llama-server sends one, `data: ` and the JSON)."""
    if event.startswith(b"data: ") and b"\n" not in event:
        return event[6:].strip()
    return b"".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))


class AnswerReader:
    """Reads an answer as it passes, without holding it up: the server-sent events of a stream (split at blank
    lines, counted), or the whole JSON body. Keeps the digest of the generated text, the finish reason, the
    `timings`, when the first token came; `keep_text` also keeps the text (a shape's replay sends it on)."""

    def __init__(self, streamed: bool, keep_text: bool = False) -> None:
        self.streamed = streamed
        self.keep_text = keep_text
        self.events = 0
        self.first_token_seen = False
        self.timings: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.done = False  # the stream's `[DONE]` came: the answer is whole, whatever happens to the connection
        self.text: list[str] = []
        self._digest = hashlib.sha256()
        self._chars = 0
        self._buffer = bytearray()
        self._any_text = False
        # events after the first token, read when the answer ends: the proxy passes each chunk on without
        # decoding its JSON (that cost a streamed answer about a fifth of its speed on a fast server)
        self._pending: list[bytes] = []

    def feed(self, chunk: bytes) -> int:
        """Take the next bytes; returns how many whole events they completed (0 for a body that is no stream)."""
        self._buffer += chunk
        if not self.streamed:
            return 0
        done = 0
        while True:
            cut, sep = self._event_end()
            if cut < 0:
                return done
            event = bytes(self._buffer[:cut])
            del self._buffer[: cut + sep]
            self.events += 1
            if self.first_token_seen:
                self._pending.append(event)
                self.done = self.done or b"[DONE]" in event
            else:
                self._event(event)
            done += 1

    def _event_end(self) -> tuple[int, int]:
        for sep in (b"\n\n", b"\r\n\r\n"):
            cut = self._buffer.find(sep)
            if cut >= 0:
                return cut, len(sep)
        return -1, 0

    def _event(self, event: bytes) -> None:
        data = _data_of(event)
        if data == b"[DONE]":
            self.done = True
        if not data or data == b"[DONE]":
            return
        try:
            obj = json.loads(data)
        except ValueError:
            return
        if isinstance(obj, dict):
            self._object(obj)

    def _object(self, obj: dict[str, Any]) -> None:
        text = _text_of(obj)
        if text:
            self._any_text = True
            self._digest.update(text.encode())
            self._chars += len(text)
            if self.keep_text:
                self.text.append(text)
        if not self.first_token_seen and _generated(obj):
            self.first_token_seen = True
        reason = _finish_reason(obj)
        if reason:
            self.finish_reason = reason
        timings = obj.get("timings")
        if isinstance(timings, dict):
            self.timings = timings

    def _drain(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        # one JSON decode for the whole answer: per event, decoding cost more than passing it on did
        datas = [_data_of(event) for event in pending]
        if datas[-1] == b"[DONE]":
            self.done = True
            datas.pop()
        try:
            objs = json.loads(b"[" + b",".join(d for d in datas if d) + b"]")
        except ValueError:  # an event that is not JSON (or a second [DONE]): one at a time, as they came
            for event in pending:
                self._event(event)
            return
        for obj in objs:
            if isinstance(obj, dict):
                self._object(obj)

    def close(self) -> None:
        """The answer has ended: the events kept for later, or a body that is no stream, are read now."""
        self._drain()
        if not self.streamed and self._buffer:
            try:
                obj = json.loads(bytes(self._buffer))
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                self._object(obj)
        self._buffer.clear()

    @property
    def whole(self) -> bool:
        """The answer has come to its end: a stream's `[DONE]`, or its finish reason with its `timings`."""
        self._drain()
        return self.done or (self.finish_reason is not None and self.timings is not None)

    def answer(self) -> Answer:
        return Answer(self._digest.hexdigest() if self._any_text else None, self._chars, self.finish_reason)

    def full_text(self) -> str:
        self._drain()
        return "".join(self.text)


def text_digest(text: str) -> str:
    """The digest an answer's text gets (Answer.sha256), for a text a later request sends back."""
    return hashlib.sha256(text.encode()).hexdigest()


# ---- the file ---------------------------------------------------------------------------------------------

class RecordWriter:
    """Appends records, one whole line per write, flushed at once: a capture killed at any point leaves only
    whole lines behind. Safe to call from several threads."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file: IO[str] = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.count = 0

    def write(self, record: RecordedRequest) -> None:
        line = record.to_json() + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            self.count += 1

    def close(self) -> None:
        with self._lock:
            self._file.close()


def write_records(records: Iterable[RecordedRequest], path: Path) -> None:
    """A whole recording at once (a shape, a repro), written beside and moved into place."""
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    tmp.write_text("".join(r.to_json() + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)


_NUMBER = (int, float)
# field -> (allowed types, required); bool is checked apart (it is an int to Python)
_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    "id": ((int,), True), "method": ((str,), True), "path": ((str,), True), "headers": ((dict,), True),
    "start": (_NUMBER, True), "end": (_NUMBER, False), "first_token": (_NUMBER, False),
    "in_flight": ((int,), False), "stream": ((bool,), False), "events": ((int,), False),
    "cancelled": ((bool,), False), "cancelled_at": (_NUMBER, False), "cancel_gap": (_NUMBER, False),
    "status": ((int,), False),
    "reached_server": ((bool,), False), "timings": ((dict,), False), "answer": ((dict,), False),
    "error": ((str,), False), "body_b64": ((str,), False), "replay_of": ((int,), False), "shape": ((dict,), False),
}
_BOOLS = {"stream", "cancelled", "reached_server"}


def _check(obj: Any, where: str) -> RecordedRequest:
    if not isinstance(obj, dict):
        raise RecordingError(f"{where}: not a JSON object")
    for name, (types, required) in _TYPES.items():
        value = obj.get(name)
        if value is None:
            if required:
                raise RecordingError(f"{where}: `{name}` is missing")
            continue
        is_bool = isinstance(value, bool)
        if (name in _BOOLS) != is_bool or not isinstance(value, types):
            raise RecordingError(f"{where}: `{name}` is {json.dumps(value)[:40]}, not a {types[0].__name__}")
    if not str(obj["path"]).startswith("/"):
        raise RecordingError(f"{where}: `path` {obj['path'][:40]!r} does not start with /")
    if obj.get("body") is not None and obj.get("body_b64") is not None:
        raise RecordingError(f"{where}: both `body` and `body_b64`")
    if obj.get("body_b64") is not None:
        try:
            base64.b64decode(obj["body_b64"], validate=True)
        except ValueError:
            raise RecordingError(f"{where}: `body_b64` is not base64") from None
    known = {f.name for f in fields(RecordedRequest)}
    values = {k: v for k, v in obj.items() if k in known}
    answer = values.pop("answer", None) or {}
    try:
        values["answer"] = Answer(**{k: answer[k] for k in ("sha256", "chars", "finish_reason") if k in answer})
        return RecordedRequest(**values)
    except TypeError as exc:
        raise RecordingError(f"{where}: {exc}") from None


def iter_records(path: Path) -> Iterator[RecordedRequest]:
    name = Path(path).name
    try:
        f = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise RecordingError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with f:
        try:
            for n, line in enumerate(f, 1):
                where = f"{name} line {n}"
                if not line.strip():
                    continue
                if not line.endswith("\n"):
                    raise RecordingError(f"{where}: the line is cut short (no end of line): the file was cut or "
                                         "edited; remove that line to use the rest")
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise RecordingError(f"{where}: not JSON ({exc.msg}): the file was cut or edited") from None
                yield _check(obj, where)
        except UnicodeDecodeError:
            raise RecordingError(f"{name}: not UTF-8 text: not a recording of kvtrace's") from None


def read_records(path: Path) -> list[RecordedRequest]:
    """Every record of a recording, checked; RecordingError for a file that is cut, edited or empty."""
    records = list(iter_records(path))
    if not records:
        raise RecordingError(f"{path}: no requests in it (the client sent nothing while it was recorded)")
    ids = [r.id for r in records]
    if len(set(ids)) != len(ids):
        raise RecordingError(f"{path}: request ids repeat: the file was edited or two files were joined")
    return records


__all__ = ["Answer", "AnswerReader", "KEPT_HEADERS", "RecordWriter", "RecordedRequest", "RecordingError",
           "iter_records", "kept_headers", "parse_body", "read_records", "text_digest", "without_secrets",
           "write_records"]
