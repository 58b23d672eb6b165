"""A run that llama.cpp repaired, in the dashboard in headless Chromium: a real healthy b11434 capture with the
draft mirror's stale-drafter trims in it reads "Healthy, drafter memory trimmed N times", not a failure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.analyze.dashboard.test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_FLAGS, server, upload_and_wait  # noqa: F401
from tests.analyze.dashboard.test_browser_healthy import _metric
from tests.analyze.reader.test_newer_upstream import with_trims

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="chromium not installed (make browser)"),
]


def test_the_healthy_headline_counts_the_trims(server: str, tmp_path: Path) -> None:  # noqa: F811 - the fixture
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None, "chromium is required in CI: run `make browser`"
    path = with_trims(tmp_path, n=3)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            page = upload_and_wait(browser, server, [Path(path)])
            heading = page.get_by_role("heading", name="Healthy, drafter memory trimmed 3 times", exact=True)
            assert heading.count() == 1
            assert page.get_by_role("heading", name="Healthy", exact=True).count() == 0
            assert "none" in _metric(page, "Failing side").lower()
            assert page.get_by_text("trimmed it 3 times, first at X = 40 / Y = 30").count() >= 1
            page.screenshot(path=str(ARTIFACTS / "healthy-trimmed.png"))
        finally:
            browser.close()
