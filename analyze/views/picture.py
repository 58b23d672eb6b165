"""Figures written as picture files (PNG or SVG) through Plotly's own static export, kaleido, which drives an
installed Chromium or Chrome. A browser is never downloaded: BROWSER_PATH names one, else the usual names on
PATH are looked for, and where none is found `BrowserMissing` says what to install.

The page kaleido draws in loads plotly.js from the installed plotly package and no MathJax, so nothing is
fetched over the network.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import plotly.graph_objects as go

from kvtrace.analyze.views.figures import PICTURE_HEIGHT, PICTURE_WIDTH

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
INSTALL_HINT = ("no Chromium or Chrome to draw the picture with: install one (Debian/Ubuntu: apt-get install "
                "chromium) or set BROWSER_PATH to its executable")
FORMATS = ("png", "svg")
RENDER_TIMEOUT_S = 90  # a first start of Chromium on a busy machine takes seconds; a stuck one fails here


class BrowserMissing(Exception):
    """No browser to draw with; the message says what to install."""


class PictureError(Exception):
    """The browser was found but the picture could not be drawn or written; the message is one line."""


def find_browser() -> str | None:
    """BROWSER_PATH when set (and only it: a wrong one is an error, not a reason to pick another), else the
    first Chromium or Chrome on PATH."""
    named = os.environ.get("BROWSER_PATH")
    if named:
        return named if os.path.isfile(named) and os.access(named, os.X_OK) else None
    for name in BROWSER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _sizes(fig: go.Figure) -> tuple[int, int]:
    return int(fig.layout.width or PICTURE_WIDTH), int(fig.layout.height or PICTURE_HEIGHT)


async def _draw(fig: go.Figure, fmts: Sequence[str], browser: str) -> list[bytes]:
    """Every format from one browser start (a start is most of the time a picture takes)."""
    import kaleido

    width, height = _sizes(fig)
    async with kaleido.Kaleido(path=browser, mathjax=False, timeout=RENDER_TIMEOUT_S, n=1) as k:
        return [bytes(await k.calc_fig(fig, opts={"format": fmt, "width": width, "height": height}))
                for fmt in fmts]


def render(fig: go.Figure, fmts: Sequence[str]) -> list[bytes]:
    """The figure as PNG and/or SVG bytes, one per format asked, at its own width and height (the picture
    size when it has none)."""
    bad = [f for f in fmts if f not in FORMATS]
    if bad:
        raise ValueError(f"picture format must be one of {FORMATS}, not {bad[0]!r}")
    browser = find_browser()
    if browser is None:
        raise BrowserMissing(INSTALL_HINT)
    # a thread of its own: its event loop can never meet a caller's (a notebook's, a server's)
    with ThreadPoolExecutor(max_workers=1) as pool:
        try:
            return pool.submit(asyncio.run, _draw(fig, fmts, browser)).result()
        except Exception as exc:  # kaleido and choreographer raise many kinds; the caller wants one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise PictureError(f"the browser at {browser} could not draw the picture: {first[:300]}") from exc


def write_pictures(fig: go.Figure, wanted: Sequence[tuple[Path, str]]) -> list[int]:
    """Write the figure to each (path, format) with one browser start; return the bytes written to each."""
    drawn = render(fig, [fmt for _, fmt in wanted])
    for (out, _), data in zip(wanted, drawn, strict=True):
        try:
            out.write_bytes(data)
        except OSError as exc:
            raise PictureError(f"{out}: cannot write: {exc.strerror or exc}") from exc
    return [len(data) for data in drawn]


__all__ = ["BROWSER_NAMES", "FORMATS", "INSTALL_HINT", "BrowserMissing", "PictureError", "find_browser", "render",
           "write_pictures"]
