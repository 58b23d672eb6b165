"""Healthy real llama-server captures in the dashboard, in headless Chromium: one per speculative type
(draft-simple, upstream DFlash, n-gram). Each shows no divergence, no shading "apart", failing side none.
The screenshots (test-artifacts/healthy-*.png) are the README's "What a healthy run looks like"."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.analyze.dashboard.test_browser import (  # noqa: F401
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_FLAGS,
    _legend,
    _wait_idle,
    server,
    wait_for_the_whole_page,
)

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "scenarios"
SHOWN = ("draft-simple-4slots", "draft-dflash-1slot", "ngram-mod-2slots")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="chromium not installed (make browser)"),
]


def _metric(page, label: str) -> str:  # noqa: ANN001 - playwright Page
    return str(page.locator("[data-testid='stMetric']").filter(has_text=label).first.inner_text())


@pytest.mark.parametrize("name", SHOWN)
def test_healthy_capture_in_chromium(server: str, name: str) -> None:  # noqa: F811 - the fixture
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None, "chromium is required in CI: run `make browser`"
    path = FIXTURES / f"{name}.log.gz"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1250})
            page.goto(server, wait_until="domcontentloaded")
            _wait_idle(page)
            page.locator("[data-testid='stFileUploaderDropzoneInput']").set_input_files([str(path)])
            wait_for_the_whole_page(page)
            assert page.locator("[data-testid='stException']").count() == 0
            assert page.get_by_role("heading", name="Healthy", exact=True).count() == 1
            assert "none" in _metric(page, "First divergence").lower()
            assert "none" in _metric(page, "Failing side").lower()
            legend = _legend(page)
            assert "target" in legend and not any("apart" in entry for entry in legend), legend
            if not name.startswith("ngram"):
                assert "drafter" in legend
            page.screenshot(path=str(ARTIFACTS / f"healthy-{name}.png"))
        finally:
            browser.close()


def test_a_default_np_capture_opens_on_its_busy_sequence(server: str) -> None:  # noqa: F811 - the fixture
    """-np auto gives four slots; the one client lands on whichever the server picks, and sequence 0 has only
    the warm-up: the page opens on the sequence with the batches, and the selector says how many each has."""
    from playwright.sync_api import sync_playwright

    from kvtrace import analyze
    from kvtrace.analyze.findings.positions import batches_per_sequence

    assert CHROMIUM is not None, "chromium is required in CI: run `make browser`"
    path = FIXTURES / "draft-simple-defaults.log.gz"
    counts = batches_per_sequence(analyze.parse(path))
    busy = max(counts, key=lambda s: counts[s])
    assert len(counts) > 1 and counts[busy] > counts.get(0, 0), counts  # the fixture is what the test is about
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1250})
            page.goto(server, wait_until="domcontentloaded")
            _wait_idle(page)
            page.locator("[data-testid='stFileUploaderDropzoneInput']").set_input_files([str(path)])
            wait_for_the_whole_page(page)
            assert page.locator("[data-testid='stException']").count() == 0
            picker = page.locator("[data-testid='stSelectbox']").filter(has_text="Sequence / slot").first
            # the picked option is shown in the box (an input's value or a div, by Streamlit version)
            shown = picker.evaluate("el => el.innerText + ' ' + Array.from(el.querySelectorAll('input'))"
                                    ".map(i => i.value).join(' ')")
            assert f"{busy} ({counts[busy]:,} batches)" in shown, shown
            page.screenshot(path=str(ARTIFACTS / "healthy-default-np.png"))
        finally:
            browser.close()


def test_the_gap_view_of_the_real_capture_draws_the_band_over_an_envelope(server: str) -> None:  # noqa: F811
    """The real 2-slot b11434 capture: the drafter-minus-target chart is the range per time bucket (a filled
    area), with the dotted tolerance band drawn on top of it."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None, "chromium is required in CI: run `make browser`"
    path = ROOT / "tests" / "fixtures" / "server" / "b11434-draft-simple-2slots-head.log.gz"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.goto(server, wait_until="domcontentloaded")
            _wait_idle(page)
            page.locator("[data-testid='stFileUploaderDropzoneInput']").set_input_files([str(path)])
            wait_for_the_whole_page(page)
            assert page.locator("[data-testid='stException']").count() == 0
            charts = page.locator("[data-testid='stPlotlyChart']")
            gap = charts.nth(1)  # the chart under the position chart, left
            gap.scroll_into_view_if_needed()
            gap.locator(".main-svg").first.wait_for(timeout=30_000)
            assert gap.locator(".scatterlayer .fills path").count() >= 1, "no envelope drawn"
            band = gap.locator(".layer-above .shapelayer path")
            assert band.count() >= 1, "no tolerance band above the data"
            style = band.first.get_attribute("style") or ""
            assert "stroke-dasharray" in style, style  # the dotted outline
            page.screenshot(path=str(ARTIFACTS / "gap-envelope-real-capture.png"), full_page=True)
        finally:
            browser.close()
