"""`kvtrace dashboard SESSION --follow` in real headless Chromium while a real capture writes the session:
the counters grow and the first position error appears without a reload; the end of the capture shows.

One capture is the embedded engine, paced (real llama.cpp, a real DFlash drafter left stale at a reset);
the other a real llama-server (`make server`) under `kvtrace capture run --ping`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvtrace.analyze.reader.session import free_port
from kvtrace.capture.llama_server import find_llama_server
from kvtrace.capture.models import ensure_models
from tests.analyze.dashboard.test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_FLAGS
from tests.conftest import wait_for_dashboard

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="chromium not installed (make browser)"),
]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("KVTRACE_OPEN", "KVTRACE_FOLLOW")}


def _kvtrace(*args: str, log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "wb")  # noqa: SIM115 - the child owns it
    return subprocess.Popen([sys.executable, "-m", "kvtrace.analyze", *args], cwd=ROOT, env=_env(), stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextmanager
def _dashboard(session: Path, name: str) -> Iterator[str]:
    """`kvtrace dashboard SESSION --follow`, as a user runs it; stopped by SIGTERM, its port checked free."""
    port = free_port()
    proc = _kvtrace("dashboard", str(session), "--follow", "--port", str(port), log=ARTIFACTS / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_dashboard(port, proc)
        yield url
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        import socket

        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0, "the server outlived kvtrace dashboard"
    finally:
        _stop(proc)


def _metric(page, label: str) -> int | None:  # noqa: ANN001 - playwright Page
    """A metric's value as shown now, or None while it is not on the page."""
    values = page.locator("[data-testid='stMetric']").evaluate_all(
        """(els, label) => els.filter(e => e.querySelector("[data-testid='stMetricLabel']")?.textContent.trim() === label)
                              .map(e => e.querySelector("[data-testid='stMetricValue']")?.textContent ?? "")""", label)
    return int(values[0].replace(",", "")) if values and values[0].strip() else None


def _watch(url: str, shot: str, start: Callable[[], None], *, expect_error: bool) -> dict[str, list[int]]:
    """Open the page on the empty session, start the capture, then read the counters as they change; the page
    is never reloaded."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None, "chromium is required in CI: run `make browser`"
    seen: dict[str, list[int]] = {"batches": [], "errors": []}  # while the capture runs (before its end shows)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1600})
            page.goto(url, wait_until="domcontentloaded")
            page.get_by_text("waiting for the capture to write raw.log").wait_for(timeout=60_000)
            page.evaluate("window.__kvtraceNoReload = 1")  # gone if the page were loaded again
            start()
            deadline = time.monotonic() + 240
            ended = page.get_by_text("The capture has ended")
            while time.monotonic() < deadline:
                if ended.count():
                    break
                batches, errors = _metric(page, "Batches"), _metric(page, "Position errors")
                if batches is not None and errors is not None and not ended.count():  # drawn once there is a batch
                    seen["batches"].append(batches)
                    seen["errors"].append(errors)
                if expect_error and seen["errors"] and seen["errors"][-1] > 0:
                    page.get_by_text("Position error logged at line").first.wait_for(timeout=30_000)
                    page.screenshot(path=str(ARTIFACTS / f"{shot}-first-error.png"), full_page=True)
                    expect_error = False  # seen; now wait for the end
                time.sleep(0.5)
            ended.first.wait_for(timeout=60_000)
            assert page.evaluate("window.__kvtraceNoReload") == 1, "the page was reloaded"
            assert page.locator("[data-testid='stException']").count() == 0
            page.wait_for_selector("[data-testid='stPlotlyChart'] .main-svg", timeout=60_000)
            final = _metric(page, "Batches")
            seen["final_batches"] = [final] if final is not None else []
            page.screenshot(path=str(ARTIFACTS / f"{shot}-ended.png"), full_page=True)
        finally:
            browser.close()
    return seen


def test_follow_a_paced_engine_capture_in_chromium(tmp_path: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    ensure_models()  # made before the clock starts
    session = tmp_path / "engine-live"
    session.mkdir()  # the dashboard may open the folder before the capture has written anything
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        procs.append(_kvtrace("capture", "engine", "--spec-type", "draft-dflash", "--fault", "stale-drafter",
                              "--pace", "0.1", "--cycles", "80", "--out", str(session),
                              log=ARTIFACTS / "follow-engine-capture.log"))

    try:
        with _dashboard(session, "follow-engine-dashboard") as url:
            seen = _watch(url, "follow-engine", start, expect_error=True)
        assert procs and procs[0].wait(timeout=120) == 0
    finally:
        for proc in procs:
            _stop(proc)
    batches, errors = seen["batches"], seen["errors"]
    # While the capture ran, the counters grew on the open page (never going down), and the stale drafter's
    # position errors appeared: none at first, then some, all before the capture ended.
    assert len(set(batches)) >= 2 and batches == sorted(batches), batches
    assert errors[0] == 0 and errors[-1] > 0 and errors == sorted(errors), errors


@pytest.mark.server
@pytest.mark.skipif(find_llama_server() is None and not os.environ.get("CI"),
                    reason="llama-server is not built here: run `make server`")
def test_follow_a_real_llama_server_capture_in_chromium(tmp_path: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    server = find_llama_server()
    assert server is not None, "llama-server is not built: `make server` builds it (CI must run it)"
    pair = ensure_models()
    session = tmp_path / "server-live"
    session.mkdir()
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        procs.append(_kvtrace(
            "capture", "run", "--ping", "16", "--max-tokens", "96", "--quiet", "--out", str(session), "--",
            str(server), "-m", str(pair.target), "-md", str(pair.drafter), "--spec-type", "draft-simple",
            "--host", "127.0.0.1", "--port", str(free_port(start=18000)), "-c", "512", "-np", "1",
            log=ARTIFACTS / "follow-server-capture.log",
        ))  # fmt: skip

    try:
        with _dashboard(session, "follow-server-dashboard") as url:
            seen = _watch(url, "follow-server", start, expect_error=False)
        assert procs and procs[0].wait(timeout=300) == 0
    finally:
        for proc in procs:
            _stop(proc)
    batches = seen["batches"]
    assert len(set(batches)) >= 2 and batches == sorted(batches), batches  # grew while the server ran
    assert seen["final_batches"] and seen["final_batches"][0] >= max(batches) and seen["final_batches"][0] > 100
