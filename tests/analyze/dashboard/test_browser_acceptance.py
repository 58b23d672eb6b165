"""The acceptance section in headless Chromium: a real llama-server capture (draft-simple, four slots) uploaded to
the real dashboard draws acceptance over time, per draft position and per request, with the per-slot table."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.analyze.dashboard.test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_FLAGS, server, upload_and_wait  # noqa: F401

ROOT = Path(__file__).resolve().parents[3]
FOURSLOTS = ROOT / "tests" / "fixtures" / "scenarios" / "draft-simple-4slots.log.gz"
TITLES = ("draft acceptance over time", "acceptance per draft position", "acceptance per request (8 requests)")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="chromium not installed (make browser)"),
]


def test_the_three_acceptance_views_are_drawn(server: str) -> None:  # noqa: F811 - the fixture
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None, "chromium is required in CI: run `make browser`"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            page = upload_and_wait(browser, server, [FOURSLOTS])
            heading = page.get_by_role("heading", name="Acceptance", exact=True)
            heading.scroll_into_view_if_needed()
            for title in TITLES:
                chart = page.locator("[data-testid='stPlotlyChart']").filter(
                    has=page.locator(".gtitle", has_text=title))
                chart.first.wait_for(timeout=30_000)
                assert chart.count() == 1, title
                # drawn: the plot area holds marks of some size (markers, a line or bars), not only its axes
                drawn = chart.first.evaluate(
                    "e => [...e.querySelectorAll('.scatterlayer path.point, .scatterlayer path.js-line, "
                    ".barlayer .point path')].filter(p => { const b = p.getBBox(); return b.width > 0 && "
                    "b.height > 0; }).length")
                assert drawn > 0, title
            slots = page.locator("[data-testid='stDataFrame']").filter(has_text="requests").first
            slots.wait_for(timeout=30_000)  # a table's frontend loads on its own, after the charts'
            assert slots.count() == 1
            page.screenshot(path=str(ARTIFACTS / "acceptance.png"), full_page=True)
        finally:
            browser.close()
