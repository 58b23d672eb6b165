"""A drafter that stopped helping, in the dashboard in headless Chromium: a real engine capture whose drafter goes
silently stale (--fault silent-stale, nothing refused) is not headed "Healthy", and its finding's onset is marked
on the position chart and on acceptance over time."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvtrace import analyze
from kvtrace.analyze.findings.health import health
from kvtrace.analyze.reader.session import new_session
from tests.analyze.dashboard.test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_FLAGS, server, upload_and_wait  # noqa: F401

pytestmark = [
    pytest.mark.browser,
    pytest.mark.engine,
    pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="chromium not installed (make browser)"),
]


def _legends(page) -> list[list[str]]:  # noqa: ANN001 - playwright Page
    """Every chart's legend entries (SVG text, so textContent)."""
    charts = page.locator("[data-testid='stPlotlyChart']")
    return [charts.nth(i).locator(".legendtext").evaluate_all("els => els.map(e => e.textContent)")
            for i in range(charts.count())]


def test_the_onset_is_marked_on_the_charts(server: str, tmp_path: Path) -> None:  # noqa: F811 - the fixture
    from playwright.sync_api import sync_playwright

    from kvtrace.capture.engine import EngineConfig, run_engine

    assert CHROMIUM is not None, "chromium is required in CI: run `make browser`"
    session = new_session("engine", out=tmp_path / "session")
    run_engine(EngineConfig(spec_type="draft-simple", fault="silent-stale", requests=4, cycles=40), session)
    log = tmp_path / "silent-stale.log"
    shutil.copyfile(session.path / "raw.log", log)
    found = health(analyze.parse(str(log)))
    assert [f.finding for f in found] == ["acceptance_collapse"]
    marker = f"onset: acceptance_collapse, slot 0 (line {found[0].onset_line})"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            page = upload_and_wait(browser, server, [log])
            heading = page.get_by_role("heading", name="Drafter stopped helping", exact=False)
            assert heading.count() == 1
            assert page.get_by_role("heading", name="Healthy", exact=True).count() == 0
            page.get_by_text("Health findings").first.wait_for(timeout=30_000)
            page.locator("[data-testid='stPlotlyChart']").nth(1).wait_for(timeout=60_000)
            legends = _legends(page)
            assert any(marker in entries and "drafter" in entries for entries in legends), legends  # the position chart
            assert any("onset: acceptance_collapse, slot 0" in entries and "log (verify steps)" in entries
                       for entries in legends[1:]), legends  # acceptance over time
            page.screenshot(path=str(ARTIFACTS / "health-onset.png"), full_page=True)
        finally:
            browser.close()
