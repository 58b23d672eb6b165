"""The position chart as a picture (`kvtrace report --png/--svg`, `kvtrace compare --png`): the figure's traces
checked against the parse, the PNG drawn by the real Chromium through kaleido and read back pixel by pixel, and
the one line a machine without a browser gets.

The pictures need Debian's /usr/bin/chromium (`make browser`): skipped only on a user's machine without it; in
CI (CI set) a missing browser fails loudly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import plotly.io as pio
import pytest
from PIL import Image

from kvtrace import analyze
from kvtrace.analyze.findings.positions import floats
from kvtrace.analyze.views.figures import (
    COLOURS,
    PICTURE_HEIGHT,
    PICTURE_WIDTH,
    picture_figure,
    stacked_figure,
)
from kvtrace.analyze.views.report import attach_line

ROOT = Path(__file__).resolve().parents[3]
# the embedded engine's stale-drafter fault: a real llama.cpp run (tools/samples.py made it)
STALE = ROOT / "samples" / "stale-drafter"
HEALTHY = ROOT / "samples" / "healthy"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def needs_browser(fn):  # noqa: ANN001, ANN201 - a test function
    """Marks a test that draws with the real Chromium, and gives it time for the browser's start."""
    fn = pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                            reason="chromium not installed (make browser)")(fn)
    return pytest.mark.timeout(300)(pytest.mark.browser(fn))


def _spec(fig) -> dict:  # noqa: ANN001 - a plotly Figure
    return json.loads(pio.to_json(fig, validate=False))


def _decode(value: object) -> np.ndarray:
    if isinstance(value, dict):
        import base64

        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
    return np.array([np.nan if v is None else v for v in (value or [])], dtype=float)


def _kvtrace(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtrace.analyze", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)


def test_the_picture_holds_target_drafter_and_each_error_from_x_to_y() -> None:
    result = analyze.parse(STALE)
    spec = _spec(picture_figure(result, title="stale-drafter"))
    assert (spec["layout"]["width"], spec["layout"]["height"]) == (PICTURE_WIDTH, PICTURE_HEIGHT)
    traces = {d["name"]: d for d in spec["data"]}
    assert {"target", "drafter", "position error (X to Y)", "reset"} <= set(traces)
    assert traces["target"]["line"]["color"] == COLOURS["target"]
    assert traces["drafter"]["line"]["color"] == COLOURS["drafter"]
    # every refused batch of sequence 0 is one segment from its stored max X up to its batch start Y
    err = result.errors
    err = err[err["last_pos"].notna() & err["batch_start"].notna() & (err["seq_id"] == 0)]
    assert len(err) > 10
    y = _decode(traces["position error (X to Y)"]["y"])
    drawn = sorted(zip(y[0::3].tolist(), y[1::3].tolist(), strict=True))
    assert drawn == sorted(zip(floats(err["last_pos"]).tolist(), floats(err["batch_start"]).tolist(), strict=True))
    # the stale drafter: X stays at 17 while Y climbs past it
    assert {x for x, _ in drawn} >= {17.0} and max(y for _, y in drawn) > 25
    # the first divergence is marked by its line, with the signature whose evidence starts in the same block
    texts = [a.get("text", "") for a in spec["layout"]["annotations"]]
    assert [t for t in texts if "divergence" in t or "onset" in t] == ["first divergence (line 1395): stale_drafter_kv"]
    assert spec["layout"]["title"]["text"] == "stale-drafter"


def test_a_failure_without_positions_is_marked_at_its_onset() -> None:
    """A report of a full KV cache has no X and Y to diverge by: the picture marks where the failure starts,
    the first line the signature cites."""
    result = analyze.parse(ROOT / "tests" / "fixtures" / "corpus" / "13_llamacpp-4185-docker-compose-kv-free-space.log")
    texts = [a.get("text", "") for a in _spec(picture_figure(result))["layout"]["annotations"]]
    assert [t for t in texts if "divergence" in t or "onset" in t] == ["onset: kv_cache_full (line 5)"]


def test_a_healthy_run_has_no_error_and_no_onset_in_its_picture() -> None:
    spec = _spec(picture_figure(analyze.parse(HEALTHY)))
    names = {d["name"] for d in spec["data"]}
    assert {"target", "drafter"} <= names
    assert not any(n.startswith("position error") for n in names)
    assert not [a for a in spec["layout"].get("annotations", []) if "onset" in a.get("text", "")]


def test_the_compare_picture_stacks_the_runs_on_one_time_axis() -> None:
    spec = _spec(stacked_figure(analyze.parse(STALE), analyze.parse(HEALTHY), names=("A: <stale>", "B: healthy")))
    layout = spec["layout"]
    assert layout["xaxis"]["matches"] == "x2"  # shared: one time axis
    assert layout["yaxis"]["domain"][0] > layout["yaxis2"]["domain"][1]  # A above B
    by_name = {d["name"]: d for d in spec["data"]}
    assert {"target (A)", "drafter (A)", "position error (X to Y) (A)", "target (B)", "drafter (B)"} <= set(by_name)
    assert by_name["target (A)"]["xaxis"] == "x" and by_name["target (B)"]["xaxis"] == "x2"
    for name in ("target (A)", "target (B)"):  # each run from its own start
        x = _decode(by_name[name]["x"])
        assert 0 <= np.nanmin(x) < 0.1
    assert "A: &lt;stale&gt;" in [a["text"] for a in layout["annotations"]]  # names as text, never markup


def _colour_share(img: Image.Image, hex_colour: str) -> float:
    rgb = np.asarray(img.convert("RGB")).reshape(-1, 3)
    want = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)])
    return float((np.abs(rgb.astype(int) - want).sum(axis=1) <= 30).mean())


@needs_browser
def test_report_writes_the_png_and_svg_of_a_failing_engine_session(tmp_path: Path) -> None:
    png, svg, comment = tmp_path / "chart.png", tmp_path / "chart.svg", tmp_path / "comment.md"
    out = _kvtrace("report", str(STALE), "--format", "github", "--png", str(png), "--svg", str(svg), "-o", str(comment))
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines()[-2:] == [f"{png}: position chart, PNG, {png.stat().st_size:,} bytes",
                                            f"{svg}: position chart, SVG, {svg.stat().st_size:,} bytes"]
    with Image.open(png) as img:
        assert img.format == "PNG" and img.size == (PICTURE_WIDTH, PICTURE_HEIGHT)
        grey = np.asarray(img.convert("L"))
        assert (grey < 250).mean() > 0.05, "the picture is (nearly) blank"
        # the target's blue, the drafter's orange and the errors' red are drawn: a few hundred pixels each at least
        for colour in ("target", "drafter", "error"):
            assert _colour_share(img, COLOURS[colour]) > 0.0002, colour
    text = svg.read_text(encoding="utf-8")
    assert text.lstrip().startswith("<svg") and "first divergence (line" in text and "KV position" in text
    # the comment says how to attach the picture, in one line
    body = comment.read_text(encoding="utf-8")
    assert [line for line in body.splitlines() if "chart.png" in line] == [attach_line("chart.png")]


@needs_browser
def test_compare_writes_the_two_runs_one_above_the_other(tmp_path: Path) -> None:
    png = tmp_path / "before-after.png"
    out = _kvtrace("compare", str(STALE), str(HEALTHY), "--png", str(png))
    assert out.returncode == 0, out.stderr  # fixed
    assert "fixed" in out.stdout
    with Image.open(png) as img:
        width, height = img.size
        assert width == PICTURE_WIDTH and height > PICTURE_HEIGHT
        rgb = np.asarray(img.convert("RGB"))
        top, bottom = rgb[: height // 2], rgb[height // 2:]
        red = np.array([int(COLOURS["error"][i:i + 2], 16) for i in (1, 3, 5)])
        # the stale run's errors are in the top half only: the healthy run below has none
        assert (np.abs(top.astype(int) - red).sum(axis=2) <= 30).mean() > 0.001
        assert (np.abs(bottom.astype(int) - red).sum(axis=2) <= 30).mean() < 0.0005


@pytest.mark.parametrize("how", ["BROWSER_PATH pointing nowhere", "no browser on PATH"])
def test_no_browser_is_one_line_saying_what_to_install_and_exit_2(tmp_path: Path, how: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "BROWSER_PATH"}
    if how.startswith("BROWSER_PATH"):
        env["BROWSER_PATH"] = str(tmp_path / "no-such-chromium")
    else:
        empty = tmp_path / "bin"
        empty.mkdir()
        env["PATH"] = str(empty)
    png = tmp_path / "chart.png"
    for args in (["report", str(STALE), "--png", str(png)], ["compare", str(STALE), str(HEALTHY), "--svg", str(png)]):
        out = _kvtrace(*args, env=env)
        assert out.returncode == 2, out.stderr
        assert out.stdout == ""  # failed before the report or the comparison was printed
        lines = out.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvtrace: no Chromium or Chrome"), lines
        assert "apt-get install chromium" in lines[0] and "BROWSER_PATH" in lines[0]
        assert not png.exists()


def test_the_attach_line_names_only_a_safe_file_name() -> None:
    line = attach_line("../x/@team <img src=x>`chart`.png")
    # the folders, the mention, the markup and the backticks are gone; what is left is the file's name
    assert "`teamimgsrcxchart.png`" in line and "@" not in line and "<" not in line
    assert line.count("`") == 2


def test_the_readme_shows_the_picture_make_samples_draws() -> None:
    from tools.samples import PICTURE, PICTURED

    picture = ROOT / "samples" / PICTURED / PICTURE
    assert f"](samples/{PICTURED}/{PICTURE})" in (ROOT / "README.md").read_text(encoding="utf-8")
    with Image.open(picture) as img:
        assert img.format == "PNG" and img.size == (PICTURE_WIDTH, PICTURE_HEIGHT)
        assert _colour_share(img, COLOURS["error"]) > 0.0002  # the failing sample's X to Y marks


@needs_browser
def test_a_picture_that_cannot_be_written_is_one_line_and_exit_2(tmp_path: Path) -> None:
    png = tmp_path / "no-such-folder" / "chart.png"
    out = _kvtrace("report", str(STALE), "--png", str(png))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [f"kvtrace: {png}: cannot write: No such file or directory"]
