"""`--record`: a streaming reverse proxy on the port the user's client already uses, in front of the server that
moved to a private loopback port. Every request passes through unchanged (aiohttp, both sides): the body as
sent, the answer's bytes as they arrive, each server-sent event out at once. A client that goes away closes the
server's connection too, so the server cancels the task as it would have. Each request becomes one record in
the session's recording (kvtrace.capture.recording) when it ends.

The proxy runs its own event loop on a thread of its own; the capture starts it before the server and stops it
after, so no request the client made while the server ran is missing from the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from kvtrace.capture.recording import AnswerReader, RecordedRequest, RecordWriter, kept_headers, parse_body

# Hop-by-hop headers (RFC 9110 7.6.1) belong to one connection: never passed on. Host and Content-Length are
# set again for the next hop.
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "host", "content-length"})
# aiohttp logs a handler's errors with their traceback: each request records its own error instead
_QUIET = logging.getLogger("kvtrace.capture.proxy")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False
MAX_BODY = 256 << 20  # a prompt with images can be large; aiohttp's default is 1 MiB
NOT_LISTENING = ("kvtrace: the server is not listening yet (it is starting, or it exited); "
                 "this request did not reach it")


class ProxyError(Exception):
    """The proxy could not listen (the port is taken, the address is not this machine's): one line."""


@dataclass(slots=True)
class ProxyStats:
    listen: str
    upstream: str
    requests: int = 0
    reached_server: int = 0
    cancelled: int = 0

    def manifest(self) -> dict[str, Any]:
        return {"listen": self.listen, "server": self.upstream, "requests": self.requests,
                "reached_server": self.reached_server, "cancelled": self.cancelled}


def _error(status: int, message: str) -> web.Response:
    """An answer of kvtrace's own, in the shape llama-server's errors have."""
    kind = "unavailable_error" if status == 503 else "server_error"
    return web.json_response({"error": {"code": status, "message": message, "type": kind}}, status=status)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class RecordingProxy:
    """Listens on (host, port), passes everything to `upstream`, records each request into `out`."""

    def __init__(self, host: str, port: int, upstream: str, out: Path,
                 say: Callable[[str], None] | None = None) -> None:
        self.host, self.port = host, port
        self.upstream = upstream.rstrip("/")
        self.writer: RecordWriter | None = None
        self.out = Path(out)
        self.say = say or (lambda _m: None)
        self.stats = ProxyStats(_url(host, port), self.upstream)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kvtrace-proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None
        self._next_id = 0
        self._in_flight = 0
        self._stopping = False

    # ---- start and stop, from the capture's thread ----

    def start(self) -> None:
        """Listen now (before the server starts): ProxyError when the port cannot be had."""
        self.writer = RecordWriter(self.out)  # before the first request can arrive
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        except OSError as exc:
            self._shutdown_loop()
            self.writer.close()
            with contextlib.suppress(OSError):
                if self.out.stat().st_size == 0:
                    self.out.unlink()
            why = exc.strerror or str(exc)
            raise ProxyError(f"cannot listen on {self.stats.listen} to record the client's requests: {why}; "
                             f"stop what uses port {self.port}, or give the server another --port") from None

    async def _start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a client that goes away cancels its handler at once, which closes the server's
        # connection: the server then stops the task as it would for the client itself
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, logger=_QUIET)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, shutdown_timeout=1.0)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._client = aiohttp.ClientSession(
            auto_decompress=False,  # the bytes as the server sent them
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
        )

    def stop(self) -> ProxyStats:
        """Stop listening; requests still in flight are cut (and recorded as cut); the file is complete."""
        if not self._thread.is_alive():
            return self.stats
        self._stopping = True
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=15)
        self._shutdown_loop()
        if self.writer is not None:
            self.writer.close()
        return self.stats

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()  # cancels the handlers still running: each records itself
        if self._client is not None:
            await self._client.close()

    def _shutdown_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._loop.is_running():
            self._loop.close()

    # ---- one request ----

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        rid, self._next_id = self._next_id, self._next_id + 1
        self._in_flight += 1
        start = time.time()
        raw = await request.read()
        body, body_b64 = parse_body(raw, request.headers.get("Content-Type", ""))
        streamed = isinstance(body, dict) and body.get("stream") is True
        rec = RecordedRequest(id=rid, method=request.method, path=request.path_qs,
                              headers=kept_headers(request.headers.items()), body=body, body_b64=body_b64,
                              start=start, in_flight=self._in_flight, stream=streamed)
        reader = AnswerReader(streamed)
        upstream: aiohttp.ClientResponse | None = None
        response: web.StreamResponse | None = None
        ended = False
        last_event = start
        try:
            assert self._client is not None
            headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
            try:
                upstream = await self._client.request(request.method, self.upstream + request.path_qs,
                                                      headers=headers, data=raw, allow_redirects=False)
            except aiohttp.ClientConnectorError as exc:
                rec.reached_server, rec.error = False, f"{type(exc).__name__}: {exc}"
                return _error(503, NOT_LISTENING)
            except aiohttp.ClientError as exc:
                rec.error = f"the server closed the connection without answering ({type(exc).__name__})"
                return _error(502, "kvtrace: " + rec.error)
            rec.status = upstream.status
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in _HOP or k.lower() == "content-length":
                    response.headers.add(k, v)
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                # a write to a client that has gone raises: an event counts once it was passed on
                await response.write(chunk)
                if events := reader.feed(chunk):
                    rec.events += events
                    last_event = time.time()
                    if rec.first_token is None and reader.first_token_seen:
                        rec.first_token = last_event
            await response.write_eof()
            ended = True
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            # a client that reads up to the stream's `[DONE]` closes its connection at once, often before the
            # server's last bytes (the chunked ending) came: that is an answer read to its end, not a cancel
            if not reader.whole:
                rec.cancelled, rec.cancelled_at = True, time.time()
                if rec.events:  # where in the stream: the events passed on, and how long after the last one
                    rec.cancel_gap = round(rec.cancelled_at - last_event, 6)
                if self._stopping:
                    rec.error = "the capture stopped before the answer ended"
            raise
        except aiohttp.ClientError as exc:  # the server went away in the middle of its answer
            rec.error = f"the server's answer broke off ({type(exc).__name__})"
            if request.transport is not None:
                request.transport.close()  # the client sees the answer break off too
            return response if response is not None else _error(502, "kvtrace: " + rec.error)
        finally:
            self._in_flight -= 1
            if upstream is not None:
                if ended:
                    upstream.release()
                else:
                    upstream.close()  # the server sees its client go away and cancels the task
            reader.close()
            rec.end = time.time()
            rec.timings, rec.answer = reader.timings, reader.answer()
            if rec.first_token is None and not streamed and reader.first_token_seen:
                rec.first_token = rec.end
            self._record(rec)

    def _record(self, rec: RecordedRequest) -> None:
        self.stats.requests += 1
        self.stats.reached_server += rec.reached_server
        self.stats.cancelled += rec.cancelled
        if self.writer is not None:
            try:
                self.writer.write(rec)
            except OSError as exc:  # a full disk: said once a request, the traffic itself goes on
                self.say(f"kvtrace: could not record request {rec.id}: {exc.strerror or exc}")


__all__ = ["ProxyError", "ProxyStats", "RecordingProxy"]
