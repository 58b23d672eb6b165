"""`--ping N`: wait until the server answers /health, send N chat requests, record what came back.

Each request's draft counts (`timings.draft_n`, `draft_n_accepted`) show whether speculative decoding ran.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kvtrace.capture.llama_args import base_url

DEFAULT_PROMPT = "Write a short story about a lighthouse keeper."
DEFAULT_MAX_TOKENS = 64


@dataclass(slots=True)
class PingOptions:
    """What `--ping` asks for: one object from the command line through the capture to the manifest."""

    n: int = 0
    prompt: str = DEFAULT_PROMPT
    max_tokens: int = DEFAULT_MAX_TOKENS
    concurrency: int = 1
    health_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    health_path: str = "/health"
    model: str | None = None
    request_params: dict[str, Any] = field(default_factory=dict)  # more request fields (a llama-swap model's)


@dataclass(slots=True)
class PingConfig:
    """The options, plus where the server listens (read off its command line)."""

    options: PingOptions
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None

    @property
    def base_url(self) -> str:
        return base_url(self.host, self.port)

    def manifest(self) -> dict[str, Any]:
        """What the manifest records (never the API key)."""
        return {"url": self.base_url, **asdict(self.options)}


@dataclass(slots=True)
class RequestRecord:
    request: int
    started: float  # unix seconds
    latency_s: float
    status: int | None  # HTTP status; None when no answer came
    ok: bool
    draft_n: int | None
    draft_n_accepted: int | None
    prompt_n: int | None
    predicted_n: int | None
    finish_reason: str | None
    content_chars: int | None
    error: str | None


@dataclass(slots=True)
class PingResult:
    healthy: bool = False
    health_wait_s: float | None = None
    error: str | None = None
    records: list[RequestRecord] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        answered = [r for r in self.records if r.ok]
        return {
            "healthy": self.healthy,
            "health_wait_s": self.health_wait_s,
            "error": self.error,
            "sent": len(self.records),
            "answered": len(answered),
            "draft_n": sum(r.draft_n or 0 for r in answered),
            "draft_n_accepted": sum(r.draft_n_accepted or 0 for r in answered),
        }


def server_message(body: str) -> str:
    """What a server says in an error answer: llama.cpp's (and OpenAI's) JSON `error.message` when the body is
    one, else the body itself, on one line and cut short."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    err = data.get("error") if isinstance(data, dict) else None
    message = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else None
    text = message if isinstance(message, str) and message.strip() else body
    return " ".join(text.split())[:300]


def _failure(status: int | None, message: str | None) -> str:
    return f"HTTP {status}: {message}" if status is not None else str(message)


def _int(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def _headers(cfg: PingConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}


def wait_healthy(
    cfg: PingConfig, alive: Callable[[], bool], stop: threading.Event
) -> tuple[bool, str | None]:
    """Poll /health until 200; False and why if the program died, time ran out, or stop was set."""
    return wait_until_healthy(cfg.base_url + cfg.options.health_path, _headers(cfg), alive, stop,
                              cfg.options.health_timeout_s)


def wait_until_healthy(url: str, headers: dict[str, str], alive: Callable[[], bool], stop: threading.Event,
                       timeout_s: float) -> tuple[bool, str | None]:
    """Poll `url` until 200; False and why if the program died, time ran out, or stop was set."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    with httpx.Client(trust_env=False, timeout=5.0, headers=headers) as client:
        while True:
            if stop.is_set():
                return False, "stopped before the server became healthy"
            if not alive():
                return False, "the program exited before it answered " + url
            try:
                resp = client.get(url)
                if resp.status_code == 200:
                    return True, None
                last = _failure(resp.status_code, server_message(resp.text)) if resp.text.strip() else \
                    f"HTTP {resp.status_code}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            if time.monotonic() >= deadline:
                return False, f"no healthy answer from {url} within {timeout_s:g} s (last: {last})"
            stop.wait(0.25)


def chat_once(client: httpx.Client, cfg: PingConfig, i: int) -> RequestRecord:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": cfg.options.prompt}],
        "max_tokens": cfg.options.max_tokens,
        "stream": False,
    }
    if cfg.options.model:
        body["model"] = cfg.options.model
    body.update(cfg.options.request_params)
    started = time.time()
    t0 = time.perf_counter()
    try:
        resp = client.post(cfg.base_url + "/v1/chat/completions", json=body)
    except httpx.HTTPError as exc:
        return RequestRecord(
            i,
            started,
            time.perf_counter() - t0,
            None,
            False,
            None,
            None,
            None,
            None,
            None,
            None,
            f"{type(exc).__name__}: {exc}",
        )
    latency = time.perf_counter() - t0
    try:
        data = resp.json()
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    timings = data.get("timings") or {}
    choice = (data.get("choices") or [{}])[0] if isinstance(data.get("choices"), list) else {}
    content = ((choice or {}).get("message") or {}).get("content")
    ok = resp.status_code == 200 and bool(data.get("choices"))
    error = None if ok else server_message(resp.text) or "an answer without choices"
    return RequestRecord(
        request=i,
        started=started,
        latency_s=latency,
        status=resp.status_code,
        ok=ok,
        draft_n=_int(timings.get("draft_n")),
        draft_n_accepted=_int(timings.get("draft_n_accepted")),
        prompt_n=_int(timings.get("prompt_n")),
        predicted_n=_int(timings.get("predicted_n")),
        finish_reason=(choice or {}).get("finish_reason"),
        content_chars=len(content) if isinstance(content, str) else None,
        error=error,
    )


def send_requests(cfg: PingConfig) -> list[RequestRecord]:
    with httpx.Client(trust_env=False, timeout=cfg.options.request_timeout_s, headers=_headers(cfg)) as client:
        if cfg.options.concurrency <= 1:
            return [chat_once(client, cfg, i) for i in range(cfg.options.n)]
        with ThreadPoolExecutor(max_workers=cfg.options.concurrency) as pool:
            return list(pool.map(lambda i: chat_once(client, cfg, i), range(cfg.options.n)))


def write_requests(records: list[RequestRecord], path: Path) -> None:
    import pandas as pd  # only a pinged capture needs it

    columns = list(RequestRecord.__dataclass_fields__)
    df = pd.DataFrame([asdict(r) for r in records], columns=columns)
    for col in ("status", "draft_n", "draft_n_accepted", "prompt_n", "predicted_n", "content_chars"):
        df[col] = df[col].astype("Int64")
    df.to_parquet(path, index=False)


class Pinger(threading.Thread):
    """Runs beside the capture (a kvtrace.capture.runner.Driver); `done` is set when it has finished, whatever
    the outcome."""

    def __init__(
        self, cfg: PingConfig, alive: Callable[[], bool], out_path: Path, say: Callable[[str], None]
    ) -> None:
        # the thread's name is the driver's: the manifest's key and the stop reason's word ("ping done")
        super().__init__(name="ping", daemon=True)
        self.cfg = cfg
        self.alive = alive
        self.out_path = out_path
        self.say = say
        self.stop = threading.Event()
        self.done = threading.Event()
        self.result = PingResult()

    @property
    def healthy(self) -> bool:
        return self.result.healthy

    @property
    def error(self) -> str | None:
        return self.result.error

    def summary(self) -> dict[str, Any]:
        return self.result.summary()

    def run(self) -> None:
        try:
            t0 = time.monotonic()
            ok, why = wait_healthy(self.cfg, self.alive, self.stop)
            self.result.health_wait_s = round(time.monotonic() - t0, 3)
            if not ok:
                self.result.error = why
                return
            self.result.healthy = True
            self.say(
                f"kvtrace: server healthy after {self.result.health_wait_s:.1f} s; "
                f"sending {self.cfg.options.n} request(s)"
            )
            self.result.records = send_requests(self.cfg)
            write_requests(self.result.records, self.out_path)
            s = self.result.summary()
            self.say(
                f"kvtrace: {s['answered']}/{s['sent']} answered; drafted {s['draft_n']}, "
                f"accepted {s['draft_n_accepted']}"
            )
            if s["answered"] < s["sent"]:
                first = next(r for r in self.result.records if not r.ok)
                self.result.error = (f"{s['sent'] - s['answered']} of {s['sent']} requests failed; the first "
                                     f"(request {first.request}): {_failure(first.status, first.error)}")
        except Exception as exc:  # reported in the manifest; the capture itself goes on
            self.result.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()
