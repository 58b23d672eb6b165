"""The dashboard in a real browser: `streamlit run app.py` on 127.0.0.1, driven by headless Chromium.

Playwright cannot download browsers here, so it drives Debian's /usr/bin/chromium (`make browser`).
Skipped only on a user's machine without chromium; in CI (CI set) a missing browser fails loudly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtrace import analyze
from kvtrace.analyze.dashboard.launch import streamlit_command
from kvtrace.analyze.reader.session import free_port
from tests.conftest import wait_for_dashboard

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "test-artifacts"
SEED = ROOT / "tests" / "fixtures" / "corpus" / "00_beellama-28-multigpu-dflash-seed.log"
STALE = ROOT / "samples" / "stale-drafter" / "raw.log"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]  # fmt: skip

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="chromium not installed (make browser)"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "KVTRACE_OPEN"}
    cmd = streamlit_command("127.0.0.1", port)  # exactly what `kvtrace dashboard` runs
    log = open(ARTIFACTS.mkdir(exist_ok=True) or ARTIFACTS / "streamlit-server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_dashboard(port, proc)  # if it fails, the server's output is in test-artifacts/streamlit-server.log
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _wait_idle(page, timeout_ms: int = 60_000) -> None:  # noqa: ANN001 - playwright Page
    # Streamlit marks the app root `notRunning` once a script run (and its rendering) has finished.
    page.wait_for_selector("[data-testid='stApp'][data-test-script-state='notRunning']", timeout=timeout_ms)


def wait_for_the_whole_page(page, timeout_ms: int = 90_000) -> None:  # noqa: ANN001 - playwright Page
    """After an upload: its page drawn whole (an upload is drawn chart first, the rest after; the empty page
    already has the chart's frame) and idle."""
    page.get_by_text("Take it away").wait_for(state="attached", timeout=timeout_ms)  # the last of a log's page
    page.wait_for_selector("[data-testid='stPlotlyChart'] .main-svg", timeout=timeout_ms)
    _wait_idle(page, timeout_ms)


def upload_and_wait(browser, server: str, files: list[Path], width: int = 1400, height: int = 1250):  # noqa: ANN001, ANN201
    """A new page on the dashboard with `files` uploaded, once its first chart is drawn, the rest of the page
    after it (an upload is drawn chart first) and it is idle, with no exception on it: the opening every upload
    test shares."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(server, wait_until="domcontentloaded")
    _wait_idle(page)
    page.locator("[data-testid='stFileUploaderDropzoneInput']").set_input_files([str(f) for f in files])
    wait_for_the_whole_page(page)
    assert page.locator("[data-testid='stException']").count() == 0
    return page


def _legend(page) -> list[str]:  # noqa: ANN001
    """Legend entries of the first chart (SVG text, so textContent rather than innerText)."""
    chart = page.locator("[data-testid='stPlotlyChart']").first
    return chart.locator(".legendtext").evaluate_all("els => els.map(e => e.textContent)")


def test_upload_and_chart_in_chromium(server: str) -> None:
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None, "chromium is required in CI: run `make browser`"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1900})
            page.goto(server, wait_until="domcontentloaded")
            _wait_idle(page)
            page.locator("[data-testid='stFileUploaderDropzoneInput']").set_input_files([str(SEED), str(STALE)])
            wait_for_the_whole_page(page)
            page.get_by_text("Verdict: inconsistent positions").wait_for(timeout=30_000)
            # The position chart drew its traces: target, drafter and the error segment are in the legend.
            legend = _legend(page)
            assert "drafter" in legend and "position error (X to Y)" in legend, legend
            assert page.locator("[data-testid='stException']").count() == 0
            page.screenshot(path=str(ARTIFACTS / "dashboard-seed.png"), full_page=True)

            # Switch to the engine capture (second upload): positions of both sides are drawn.
            page.locator("[data-testid='stSidebar'] [data-testid='stSelectbox']").filter(has_text="Show").click()
            page.get_by_role("option", name="raw.log").click()
            page.get_by_text("Source: raw.log").wait_for(timeout=30_000)
            _wait_idle(page)
            page.wait_for_selector("[data-testid='stPlotlyChart'] .main-svg", timeout=60_000)
            legend = _legend(page)
            assert "target" in legend and "drafter" in legend, legend
            assert page.locator("[data-testid='stException']").count() == 0
            page.screenshot(path=str(ARTIFACTS / "dashboard-stale-drafter.png"), full_page=True)

            # Choosing the third error row shows the raw log around that error's line, as plain text.
            third = int(analyze.parse(STALE).errors["line"].iloc[2])
            # the errors table by its key (the acceptance section's tables come before it on the page)
            grid = page.locator("[class*='st-key-t-'][class*='-errors'] [data-testid='stDataFrame']").first
            grid.scroll_into_view_if_needed()
            box = grid.bounding_box()
            assert box is not None
            # Header row, then rows of 35 px (Streamlit's default); the first column is the row selector.
            page.mouse.click(box["x"] + 14, box["y"] + 35 + 35 * 2 + 17)
            page.locator("[data-testid='stCode']").filter(has_text=f">> {third} |").wait_for(timeout=30_000)
            _wait_idle(page)
            assert page.locator("[data-testid='stException']").count() == 0
            page.screenshot(path=str(ARTIFACTS / "dashboard-raw-view.png"), full_page=True)
        finally:
            browser.close()


# When each of these is first on the page (ms after it opened), recorded in the page itself.
FIRST_SEEN = """
window.__firstSeen = {};
const watched = {chart: "[data-testid='stPlotlyChart'] .scatterlayer .trace .js-line",
                 metric: "[data-testid='stMetric']", widget: "[data-testid='stSelectbox']",
                 table: "[data-testid='stDataFrame']"};
new MutationObserver(() => {
  for (const [name, sel] of Object.entries(watched))
    if (!(name in window.__firstSeen) && document.querySelector(sel)) window.__firstSeen[name] = performance.now();
}).observe(document, {subtree: true, childList: true});
"""


def test_a_path_opens_chart_first_then_the_whole_page_in_chromium() -> None:
    """`kvtrace dashboard PATH`: the first chart is drawn before any metric, widget or table is on the page,
    and the rest of the page follows by itself (no click), the verdict above the same chart."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None, "chromium is required in CI: run `make browser`"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "KVTRACE_FOLLOW"} | {"KVTRACE_OPEN": str(STALE.parent)}
    log = open(ARTIFACTS.mkdir(exist_ok=True) or ARTIFACTS / "streamlit-server-path.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(streamlit_command("127.0.0.1", port), cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        wait_for_dashboard(port, proc)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1500, "height": 1900})
                page.add_init_script(FIRST_SEEN)
                page.goto(f"http://127.0.0.1:{port}", wait_until="domcontentloaded")
                page.get_by_text("Verdict: inconsistent positions").wait_for(timeout=120_000)
                page.wait_for_selector("[data-testid='stDataFrame']", state="attached", timeout=60_000)
                page.wait_for_selector("[data-testid='stFileUploaderDropzoneInput']", state="attached",
                                       timeout=60_000)
                _wait_idle(page)
                seen = page.evaluate("window.__firstSeen")
                assert set(seen) == {"chart", "metric", "widget", "table"}, seen
                assert seen["chart"] < min(seen["metric"], seen["widget"], seen["table"]), seen
                legend = _legend(page)
                assert "drafter" in legend and "position error (X to Y)" in legend, legend
                assert page.locator("[data-testid='stException']").count() == 0
            finally:
                browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
