"""`kvtrace replay`: send a recording's requests again, as the client sent them, to a server under capture.

Same order, same concurrency, same streaming and cancels, same gaps. A request waits for every request that had
ended before it started in the recording (so a conversation's next turn still follows the answer before it),
then for its gap: the time it waited after them then (`as_fast`: no gaps). A request the client cancelled is
cancelled where the client went away in the chunk stream: after as many streamed events as were passed on to it,
and as long after the last of them (the same place in the answer at temperature 0), or after as many seconds when
nothing was streamed. Each request sent is recorded in the new session's recording
too, so a replay can be replayed, compared and shrunk like the recording itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from kvtrace.capture.ping import wait_until_healthy
from kvtrace.capture.recording import AnswerReader, RecordedRequest, RecordWriter
from kvtrace.capture.shape import linked_ids, shaped_body


@dataclass(slots=True)
class ReplayOptions:
    as_fast: bool = False  # no gaps: each request as soon as the ones it waited for have ended
    health_path: str = "/health"
    health_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    api_key: str | None = None  # the new server's --api-key, sent as the client's was
    settle_s: float = 0.0  # after the last answer: a followed log catches up before the capture stops


@dataclass(slots=True)
class ReplaySpec:
    """What to replay (a library call's, or the command line's, choice) and where it came from."""

    records: list[RecordedRequest]
    options: ReplayOptions = field(default_factory=ReplayOptions)
    source: str = ""  # the recording's path, for the manifest


@dataclass(slots=True)
class Step:
    """One request of the plan: the ones it waits for, and how long after them (or after the first) it starts."""

    record: RecordedRequest
    after: list[int]  # indexes into the plan
    offset: float  # seconds after the first request started
    gap: float  # seconds after the last of `after` ended


def plan(records: list[RecordedRequest]) -> list[Step]:
    """The requests that reached the server, in the order they arrived, each with what it waits for."""
    sent = sorted((r for r in records if r.reached_server), key=lambda r: (r.start, r.id))
    if not sent:
        return []
    t0 = sent[0].start
    steps = []
    for j, rec in enumerate(sent):
        after = [i for i in range(j) if sent[i].end is not None and sent[i].end <= rec.start]  # type: ignore[operator]
        last_end = max((sent[i].end for i in after), default=None)  # type: ignore[type-var]
        gap = rec.start - last_end if last_end is not None else rec.start - t0
        steps.append(Step(rec, after, rec.start - t0, max(0.0, gap)))
    return steps


def answered_alike(recorded: RecordedRequest, replayed: RecordedRequest) -> bool:
    """The replay answered a request at least as well as the recording: a success, or the same status."""
    ok = replayed.status is not None and 200 <= replayed.status < 300
    return ok or replayed.status == recorded.status


@dataclass(slots=True)
class ReplayTally:
    recorded: int = 0  # requests of the recording that reached its server: the ones sent again
    sent: int = 0
    answered: int = 0  # answered at least as well as recorded (answered_alike)
    same_text: int = 0  # the same answer, word for word (the digests agree)
    cancelled: int = 0
    not_replayed: int = 0  # recorded, but they never reached the server then (it was not listening yet)

    def to_dict(self) -> dict[str, int]:
        return {"recorded": self.recorded, "sent": self.sent, "answered": self.answered,
                "same_text": self.same_text, "cancelled": self.cancelled, "not_replayed": self.not_replayed}


class Replayer(threading.Thread):
    """A kvtrace.capture.runner.Driver: waits for the server's health, replays, records, sets `done`."""

    def __init__(self, spec: ReplaySpec, base_url: str, out: Path, alive: Callable[[], bool],
                 say: Callable[[str], None]) -> None:
        super().__init__(name="replay", daemon=True)  # the manifest's key and the stop reason's word
        self.spec = spec
        self.base_url = base_url.rstrip("/")
        self.out = Path(out)
        self.alive = alive
        self.say = say
        self.stop = threading.Event()
        self.done = threading.Event()
        self._healthy = False
        self._error: str | None = None
        self.health_wait_s: float | None = None
        self.tally = ReplayTally()
        self.results: list[RecordedRequest] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def error(self) -> str | None:
        return self._error

    def summary(self) -> dict[str, Any]:
        return {"healthy": self._healthy, "health_wait_s": self.health_wait_s, "error": self._error,
                "source": self.spec.source, "url": self.base_url, "as_fast": self.spec.options.as_fast,
                **self.tally.to_dict()}

    def _headers(self) -> dict[str, str]:
        key = self.spec.options.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def run(self) -> None:
        try:
            opts = self.spec.options
            t0 = time.monotonic()
            ok, why = wait_until_healthy(self.base_url + opts.health_path, self._headers(), self.alive, self.stop,
                                         opts.health_timeout_s)
            self.health_wait_s = round(time.monotonic() - t0, 3)
            if not ok:
                self._error = why
                return
            self._healthy = True
            steps = plan(self.spec.records)
            self.tally.recorded = len(steps)
            self.tally.not_replayed = len(self.spec.records) - len(steps)
            self.say(f"kvtrace: server healthy after {self.health_wait_s:.1f} s; replaying {len(steps)} "
                     f"request(s){' as fast as they can go' if opts.as_fast else ' with their gaps'}")
            writer = RecordWriter(self.out)
            try:
                asyncio.run(self._replay(steps, writer))
            finally:
                writer.close()
            t = self.tally
            self.say(f"kvtrace: replayed {t.sent} of {t.recorded}: {t.answered} answered as recorded, "
                     f"{t.same_text} with the same text, {t.cancelled} cancelled as the client did")
            if opts.settle_s and not self.stop.is_set():
                self.stop.wait(opts.settle_s)
        except Exception as exc:  # reported in the manifest; the capture itself stops as usual
            self._error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()

    async def _replay(self, steps: list[Step], writer: RecordWriter) -> None:
        opts = self.spec.options
        loop = asyncio.get_running_loop()
        started = [asyncio.Event() for _ in steps]
        ended_at: list[float | None] = [None] * len(steps)
        ended = [asyncio.Event() for _ in steps]
        needed = linked_ids(s.record for s in steps)
        answers: dict[int, str] = {}  # recorded id -> the text this replay got for it (a shape's links)
        in_flight = 0
        t0 = loop.time()
        timeout = aiohttp.ClientTimeout(total=opts.request_timeout_s, sock_connect=10)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector,
                                         skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding")) as http:

            async def one(j: int, step: Step) -> None:
                nonlocal in_flight
                if j:
                    await started[j - 1].wait()
                for i in step.after:
                    await ended[i].wait()
                if not opts.as_fast:
                    last = max((ended_at[i] or 0.0 for i in step.after), default=None)
                    at = max(t0 + step.offset, last + step.gap if last is not None else t0)
                    await asyncio.sleep(max(0.0, at - loop.time()))
                if self.stop.is_set():
                    started[j].set()
                    ended[j].set()
                    return
                in_flight += 1
                started[j].set()
                try:
                    new = await self._send(http, j, step.record, in_flight, answers,
                                           keep_text=step.record.id in needed)
                finally:
                    in_flight -= 1
                    ended_at[j] = loop.time()
                    ended[j].set()
                self.results.append(new)
                writer.write(new)
                self._count(step.record, new)

            tasks = [asyncio.create_task(one(j, s)) for j, s in enumerate(steps)]
            stopper = asyncio.create_task(self._watch_stop(tasks))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks)
            stopper.cancel()

    async def _watch_stop(self, tasks: list[asyncio.Task[None]]) -> None:
        """`stop` set (the capture is ending): requests in flight are cut, none is started."""
        while not self.stop.is_set():
            await asyncio.sleep(0.1)
        for t in tasks:
            t.cancel()

    def _count(self, recorded: RecordedRequest, new: RecordedRequest) -> None:
        t = self.tally
        t.sent += 1
        t.answered += answered_alike(recorded, new)
        t.same_text += recorded.answer.sha256 is not None and recorded.answer.sha256 == new.answer.sha256
        t.cancelled += new.cancelled and recorded.cancelled

    async def _fitting(self, http: aiohttp.ClientSession, rec: RecordedRequest,
                       answers: dict[int, str]) -> dict[int, str]:
        """A shape's linked answers this replay got that have as many tokens as the user's had (the server's own
        /tokenize counts them): sent back, the prompt keeps its length and the cache is reused as it was then."""
        fitting = {}
        for link in (rec.shape or {}).get("links") or []:
            k = int(link[1])
            text = answers.get(k)
            if text is None:
                continue
            if len(link) < 3:  # a shape without the count: sent back as it is
                fitting[k] = text
                continue
            try:
                async with http.post(self.base_url + "/tokenize", json={"content": text},
                                     headers=self._headers()) as resp:
                    tokens = (await resp.json()).get("tokens") if resp.status == 200 else None
            except (aiohttp.ClientError, ValueError):
                tokens = None
            if isinstance(tokens, list) and len(tokens) == int(link[2]):
                fitting[k] = text
        return fitting

    async def _send(self, http: aiohttp.ClientSession, j: int, rec: RecordedRequest, in_flight: int,
                    answers: dict[int, str], keep_text: bool) -> RecordedRequest:
        body = shaped_body(rec, await self._fitting(http, rec, answers)) if rec.shape is not None else rec.body
        new = RecordedRequest(id=j, method=rec.method, path=rec.path, headers=dict(rec.headers), body=body,
                              body_b64=rec.body_b64, start=time.time(), in_flight=in_flight, stream=rec.stream,
                              replay_of=rec.id)
        data = new.body_bytes()
        reader = AnswerReader(rec.stream, keep_text=keep_text)
        # the client read this many events, then went away: at temperature 0, the same place in the answer
        cut_after_events = rec.events if rec.cancelled and rec.stream and rec.events > 0 else None
        cut_after_s = rec.offset_of_cancel if rec.cancelled and cut_after_events is None else None
        headers = {**rec.headers, **self._headers()}
        last_event = new.start
        try:
            async with asyncio.timeout(cut_after_s):
                async with http.request(rec.method, self.base_url + rec.path, data=data or None,
                                        headers=headers, allow_redirects=False) as resp:
                    new.status = resp.status
                    async for chunk in resp.content.iter_any():
                        if events := reader.feed(chunk):
                            new.events += events
                            last_event = time.time()
                            if new.first_token is None and reader.first_token_seen:
                                new.first_token = last_event
                        if cut_after_events is not None and new.events >= cut_after_events:
                            # read up to there and go away as long after that event as the client did (one chunk
                            # can hold more events): the same place in the chunk stream
                            new.events = cut_after_events
                            if rec.cancel_gap:
                                await asyncio.sleep(rec.cancel_gap)
                            new.cancelled, new.cancelled_at = True, time.time()
                            new.cancel_gap = round(new.cancelled_at - last_event, 6)
                            resp.close()  # the server sees the client go away, as it did then
                            break
        except TimeoutError:
            new.cancelled, new.cancelled_at = True, time.time()
        except asyncio.CancelledError:
            new.cancelled, new.cancelled_at = True, time.time()
            new.error = "the replay stopped before the answer ended"
        except aiohttp.ClientConnectorError as exc:
            new.reached_server, new.error = False, f"{type(exc).__name__}: {exc}"
        except aiohttp.ClientError as exc:
            new.error = f"{type(exc).__name__}: {exc}"
        reader.close()
        new.end = time.time()
        new.timings, new.answer = reader.timings, reader.answer()
        if new.first_token is None and not rec.stream and reader.first_token_seen:
            new.first_token = new.end
        if keep_text and not new.cancelled:
            answers[rec.id] = reader.full_text()
        return new


__all__ = ["ReplayOptions", "ReplaySpec", "ReplayTally", "Replayer", "Step", "answered_alike", "plan"]
