"""The server's own counters beside its log: GET /metrics about once a second and once at the end, into the
session's metrics.parquet (long form: t, name, labels, value).

llama-server serves /metrics when started with `--metrics` (Prometheus text format). The scraper runs in a
thread of its own and never touches the log: a server without the endpoint, or one that goes away, only
ends the scraping, with one line saying so.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

INTERVAL_S = 1.0
_TIMEOUT_S = 2.0  # one scrape; the server answers /metrics from its task loop, which a long batch delays
_NO_ENDPOINT = (404, 405, 501)  # llama-server without --metrics answers 501; other programs 404


@dataclass(slots=True)
class Sample:
    t: float  # unix seconds of the scrape
    name: str
    labels: str  # the sample's labels as sorted JSON ("{}" for none)
    value: float


def parse_metrics(text: str, t: float) -> list[Sample]:
    """The samples of one Prometheus text exposition (ValueError when it is not one)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [Sample(t, s.name, json.dumps(s.labels, sort_keys=True), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]


def write_samples(samples: list[Sample], path: Path) -> None:
    import pandas as pd

    df = pd.DataFrame({"t": [s.t for s in samples], "name": [s.name for s in samples],
                       "labels": [s.labels for s in samples], "value": [s.value for s in samples]})
    df = df.astype({"t": "float64", "name": "string", "labels": "string", "value": "float64"})
    df.to_parquet(path, index=False)


@dataclass(slots=True)
class ScrapeSummary:
    url: str
    scrapes: int = 0
    note: str | None = None  # why the scraping ended early or never began; None when it ran to the end
    from_start: bool = False  # the server was started by this capture: its counters began at 0 within it
    samples: list[Sample] = field(default_factory=list)

    def manifest(self) -> dict[str, Any]:
        return {"url": self.url, "scrapes": self.scrapes, "note": self.note, "from_start": self.from_start}


class MetricsScraper(threading.Thread):
    """Scrapes `base_url`/metrics every `interval_s` until `finish()`, which scrapes once more and writes the
    samples. `alive` says whether the server's program, started by this capture, still runs (None: a server
    that was running already)."""

    def __init__(self, base_url: str, out_path: Path, say: Callable[[str], None], *,
                 api_key: str | None = None, alive: Callable[[], bool] | None = None,
                 interval_s: float = INTERVAL_S) -> None:
        super().__init__(name="kvtrace-metrics", daemon=True)
        self.url = base_url.rstrip("/") + "/metrics"
        self.out_path = out_path
        self.say = say
        self.alive = alive
        self.interval_s = interval_s
        self.summary = ScrapeSummary(self.url, from_start=alive is not None)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._halt = threading.Event()
        self._ended = False  # no more scrapes: the endpoint is missing or the server went away
        self._scrape_lock = threading.Lock()
        self._client = httpx.Client(trust_env=False, timeout=_TIMEOUT_S, headers=self._headers)

    def _end(self, note: str) -> None:
        if not self._ended:
            self._ended = True
            self.summary.note = note
            self.say(f"kvtrace: {note}; the log is captured as usual")

    def scrape(self) -> None:
        """One scrape; failures before the first answer are the server starting up, after it its end."""
        if self._ended:
            return
        with self._scrape_lock:
            t = time.time()
            try:
                resp = self._client.get(self.url)
            except httpx.HTTPError as exc:
                if self.summary.scrapes:
                    why = "the program ended" if self.alive is not None and not self.alive() else \
                        f"the server stopped answering ({type(exc).__name__})"
                    self._end(f"{why}: the counters from {self.url} end at the last of {self.summary.scrapes} "
                              "scrapes")
                elif self.alive is not None and not self.alive():
                    self._end(f"the program ended before it answered {self.url}: no server counters")
                return
            if resp.status_code in _NO_ENDPOINT:
                self._end(f"the server has no {self.url} (HTTP {resp.status_code}): no server counters")
                return
            if resp.status_code != 200:
                return  # loading (503) or busy: the next scrape may answer
            try:
                samples = parse_metrics(resp.text, t)
            except ValueError:
                self._end(f"{self.url} did not answer in the Prometheus text format: no server counters")
                return
            self.summary.samples.extend(samples)
            self.summary.scrapes += 1

    def run(self) -> None:
        try:
            while not self._halt.is_set() and not self._ended:
                self.scrape()
                self._halt.wait(self.interval_s)
        except Exception as exc:  # the counters are a second witness: never the capture's failure
            self._end(f"scraping {self.url} failed ({type(exc).__name__}: {exc})")

    def finish(self) -> ScrapeSummary:
        """Stop, scrape once more (the counters as the run ends), write metrics.parquet; always returns."""
        self._halt.set()
        if self.is_alive():
            self.join(_TIMEOUT_S + 1)
        try:
            if not self.is_alive():  # else a scrape still waits on the server: that one is the last
                self.scrape()
        except Exception as exc:
            self._end(f"scraping {self.url} failed ({type(exc).__name__}: {exc})")
        finally:
            self._client.close()
        if not self.summary.scrapes and self.summary.note is None:
            self._end(f"the server never answered {self.url}: no server counters")
        if self.summary.samples:
            try:
                write_samples(self.summary.samples, self.out_path)
            except (OSError, ValueError) as exc:
                self.say(f"kvtrace: could not write {self.out_path.name}: {exc}")
        return self.summary
