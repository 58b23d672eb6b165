"""How long a big log takes to show its first chart in the dashboard. Target: within 5 s, chart before tables.

    python benchmarks/dashboard_first_chart.py [--log PATH] [--size-mb 100] [--fault stale-drafter] [--json]
    python benchmarks/dashboard_first_chart.py --floor --capture CAPTURE.log.gz [--turns 3]   # against the floor
    python benchmarks/dashboard_first_chart.py --floor --capture C.log.gz --before ../before   # and an older checkout

The log: --log PATH; else --capture (a real llama-server capture, gzip: the 124 MB b11434 draft-simple two-slot
one for the figures in benchmarks/README.md); else the reader benchmark's log (real engine output with batch
dumps and find_slot lines, repeated to size; built once under benchmarks/out/). Measured in one run, page
cache warm:

- library: analyze.parse(path) -> position_figure -> the figure's JSON (what Streamlit sends the browser);
- app: the whole first script run of app.py opened on the path (KVTRACE_OPEN), through Streamlit's
  AppTest: hashing the file, parsing, every chart, the tables and the raw view;
- browser (what a user waits for): `kvtrace dashboard PATH` running, headless Chromium opens the page,
  and the clock stops when the position chart is drawn (and, separately, when the first table is), on a
  server just started (the first open). Skipped if chromium is missing (`make browser`).

--floor: each page opened on a server just started, in turns, the clock from opening the page to a drawn
line of the first chart: the floor (a bare Streamlit page with one 3-point Plotly chart), the small session by
path and under --follow, the capture (unpacked once under benchmarks/out/) by path, and the upload of its .gz
(the clock includes loading the page with the uploader and the upload itself; the first chart of a big upload
is the one of its head, labelled as partial, as a followed log's is of what is read so far).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from reader_speed import big_log  # noqa: E402 - the reader benchmark's log, built once and shared

TARGET_S = 5.0
# headless Chromium on a machine with no network beyond loopback (the browser test's flags)
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]


def _unpacked(gz: Path) -> Path:
    """The real capture as a plain file (built once under benchmarks/out/): a path opened on the machine."""
    import gzip

    out = ROOT / "benchmarks" / "out" / gz.name.removesuffix(".gz")
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(gz, "rb") as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return out


def library(path: Path) -> dict[str, float | int]:
    import plotly.io as pio

    from kvtrace import analyze
    from kvtrace.analyze.views.figures import position_figure

    t0 = time.perf_counter()
    result = analyze.parse(path)
    t1 = time.perf_counter()
    fig = position_figure(result, seq_id=result.verdict.seq_id)
    t2 = time.perf_counter()
    spec = pio.to_json(fig, validate=False)
    t3 = time.perf_counter()
    points = sum(len(tr.y) if tr.y is not None else 0 for tr in fig.data)
    return {
        "parse_s": round(t1 - t0, 2),
        "figure_s": round(t2 - t1, 3),
        "json_s": round(t3 - t2, 3),
        "first_chart_s": round(t3 - t0, 2),
        "lines": result.lines,
        "batches": len(result.batches),
        "kv_rows": len(result.kv),
        "points_drawn": points,
        "json_kb": round(len(spec) / 1024, 1),
    }


def app(path: Path) -> dict[str, float | bool]:
    from streamlit.testing.v1 import AppTest

    os.environ["KVTRACE_OPEN"] = str(path)
    t0 = time.perf_counter()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.run()
    wall = time.perf_counter() - t0
    return {"app_first_run_s": round(wall, 2), "app_charts": len(at.get("plotly_chart")),
            "app_exception": bool(at.exception)}


def browser(path: Path) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    from kvtrace.analyze.dashboard.launch import launch

    chromium = shutil.which("chromium")
    if chromium is None:
        return {}
    dash = launch(path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{dash.url}/_stcore/health", timeout=2).close()
                break
            except OSError:
                time.sleep(0.2)
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
            page = b.new_page(viewport={"width": 1500, "height": 1200})
            t0 = time.perf_counter()
            page.goto(dash.url)
            # a drawn line of the position chart (the empty frame shown while the log is read has none)
            page.wait_for_selector("[data-testid='stPlotlyChart'] .scatterlayer .trace .js-line", state="attached",
                                   timeout=120_000)
            wall = time.perf_counter() - t0
            page.wait_for_selector("[data-testid='stDataFrame']", state="attached", timeout=120_000)
            tables = time.perf_counter() - t0
            b.close()
    finally:
        dash.proc.terminate()
        dash.proc.wait()
    return {"browser_first_chart_s": round(wall, 2), "browser_first_table_s": round(tables, 2)}


FLOOR_PAGE = """import plotly.graph_objects as go
import streamlit as st

st.plotly_chart(go.Figure(go.Scatter(x=[0, 1, 2], y=[0, 1, 0], mode="lines")))
"""
CHART = "[data-testid='stPlotlyChart'] .scatterlayer .trace .js-line"


def _serve(cmd: list[str], env: dict[str, str], port: int, cwd: Path = ROOT) -> Any:
    import subprocess

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
    deadline = time.monotonic() + 180  # a loaded machine starts a server slowly
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the server on port {port} did not come up")


def _packages_of(checkout: Path, tmp: Path) -> Path:
    """A folder whose `kvtrace` is `checkout`'s analyze/ and capture/ (what package-dir maps), for PYTHONPATH."""
    shim = tmp / f"packages-{abs(hash(str(checkout.resolve())))}"
    (shim / "kvtrace").mkdir(parents=True, exist_ok=True)
    for name in ("analyze", "capture"):
        link = shim / "kvtrace" / name
        if not link.is_symlink():
            link.symlink_to(checkout.resolve() / name, target_is_directory=True)
    return shim


def _one_open(kind: str, arg: Path | None, chromium: str, floor_script: Path, checkout: Path = ROOT) -> float:
    """One first open on a server just started: seconds from page.goto to a drawn line of the first chart.
    `checkout`: whose page is served (another checkout's runs from its own folder, so its packages come first)."""
    from playwright.sync_api import sync_playwright

    from kvtrace.analyze.dashboard.launch import streamlit_command
    from kvtrace.analyze.reader.session import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("KVTRACE_OPEN", "KVTRACE_FOLLOW")}
    if kind == "floor":
        cmd = streamlit_command("127.0.0.1", port)
        cmd[cmd.index("kvtrace.analyze.dashboard.serve")] = "streamlit"  # plain `streamlit run`, same flags
        cmd[cmd.index("run") + 1] = str(floor_script)
    else:
        cmd = streamlit_command("127.0.0.1", port)
        cmd[cmd.index("run") + 1] = str(checkout / "analyze" / "dashboard" / "app.py")
        if checkout != ROOT:  # its own packages: the venv's editable install maps kvtrace to this checkout
            env["PYTHONPATH"] = str(_packages_of(checkout, floor_script.parent))
        if kind in ("path", "follow") and arg is not None:
            env["KVTRACE_OPEN"] = str(arg.resolve())
            if kind == "follow":
                env["KVTRACE_FOLLOW"] = "1"
    proc = _serve(cmd, env, port, cwd=checkout)
    try:
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
            page = b.new_page(viewport={"width": 1500, "height": 1200})
            t0 = time.perf_counter()
            page.goto(f"http://127.0.0.1:{port}")
            if kind == "upload" and arg is not None:
                page.locator("[data-testid='stFileUploaderDropzoneInput']").set_input_files([str(arg)])
            page.wait_for_selector(CHART, state="attached", timeout=180_000)
            wall = time.perf_counter() - t0
            b.close()
    finally:
        proc.terminate()
        proc.wait()
    return wall


def floor_table(small: Path, big: Path | None, big_gz: Path | None, turns: int, before: Path | None = None,
                only: list[str] | None = None) -> list[dict[str, Any]]:
    """The floor page (bare Streamlit, one three-point Plotly chart) and kvtrace's pages, in turns in one run;
    with `before` (another checkout), its pages too, each right after this checkout's."""
    import statistics
    import tempfile

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed: make browser")
    kvtrace: list[tuple[str, str, Path | None]] = [(f"small session ({small.name}), by path", "path", small),
                                                   (f"small session ({small.name}) under --follow", "follow", small)]
    if big is not None:
        kvtrace.append((f"{big.name}, {big.stat().st_size / 1e6:.0f} MB, by path (first open)", "path", big))
    if big_gz is not None:
        kvtrace.append((f"upload of {big_gz.name}, {big_gz.stat().st_size / 1e6:.0f} MB", "upload", big_gz))
    floor_page = ("floor: bare Streamlit, one 3-point chart", "floor", None, ROOT)
    pages: list[tuple[str, str, Path | None, Path]] = [floor_page]
    for label, kind, arg in (page for page in kvtrace if not only or page[1] in only):
        if before is not None:
            pages.append((f"before: {label}", kind, arg, before.resolve()))
        pages.append((label, kind, arg, ROOT))
    times: dict[str, list[float]] = {page[0]: [] for page in pages}
    with tempfile.TemporaryDirectory() as tmp:
        floor_script = Path(tmp) / "floor.py"
        floor_script.write_text(FLOOR_PAGE)
        for _ in range(turns):
            for label, kind, arg, checkout in pages:
                times[label].append(_one_open(kind, arg, chromium, floor_script, checkout))
    floor = statistics.median(times[pages[0][0]])
    return [{"page": label, "runs_s": [round(x, 2) for x in times[label]],
             "median_s": round(statistics.median(times[label]), 2),
             "ratio_to_floor": round(statistics.median(times[label]) / floor, 2)} for label, *_ in pages]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", type=Path, help="the log to open (default: --capture's, else a built one)")
    ap.add_argument("--capture", type=Path, help="a real capture, gzip (the 124 MB b11434 draft-simple two-slot "
                    "one for the README's figures): opened by path (unpacked) and uploaded (as it is)")
    ap.add_argument("--size-mb", type=int, default=100)
    ap.add_argument("--fault", default="stale-drafter", choices=["stale-drafter", "none", "no-rollback"],
                    help="engine fault of the repeated capture (default: the failure this tool is for)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--floor", action="store_true", help="the floor page beside kvtrace's pages, in turns, each "
                    "a first open on a fresh server: medians and ratios to the floor (issue 20)")
    ap.add_argument("--small", type=Path, default=ROOT / "samples" / "stale-drafter",
                    help="with --floor: the small session (default: samples/stale-drafter)")
    ap.add_argument("--gz", type=Path, help="with --floor: a .gz to upload (default: --capture)")
    ap.add_argument("--turns", type=int, default=3, help="with --floor: runs of each page (default 3)")
    ap.add_argument("--before", type=Path, help="with --floor: another checkout (say `git worktree add ../before "
                    "main`, its reader's C extension built or copied in) whose pages are measured in the same turns, "
                    "each right before this checkout's, its packages first on PYTHONPATH")
    ap.add_argument("--only", nargs="+", choices=["path", "follow", "upload"],
                    help="with --floor: only these of kvtrace's pages (default: all); the small and the big log "
                    "are both opened for `path`")
    args = ap.parse_args()
    if args.floor:
        capture = args.capture if args.capture is not None and args.capture.is_file() else None
        if args.capture is not None and capture is None:
            raise SystemExit(f"{args.capture}: no such file")
        big = args.log or (_unpacked(capture) if capture is not None and capture.suffix == ".gz" else capture)
        gz = args.gz or (capture if capture is not None and capture.suffix == ".gz" else None)
        rows = floor_table(args.small, big, gz, args.turns, args.before, args.only)
        if args.json:
            print(json.dumps(rows))
            return
        for r in rows:
            print(f"{r['page']:60} median {r['median_s']:5.2f} s  {r['ratio_to_floor']:4.2f}x the floor  "
                  f"runs {r['runs_s']}")
        return
    path = args.log or args.capture or big_log(args.size_mb, args.fault)
    path.read_bytes()  # warm the page cache so both measurements read from memory
    out: dict[str, object] = {"log": path.name, "file_mb": round(path.stat().st_size / 1e6, 1)}
    out |= library(path)
    out |= app(path)
    out |= browser(path)
    out["target_s"] = TARGET_S
    out["ratio_library_to_target"] = round(float(out["first_chart_s"]) / TARGET_S, 2)  # type: ignore[arg-type]
    out["ratio_app_to_target"] = round(float(out["app_first_run_s"]) / TARGET_S, 2)  # type: ignore[arg-type]
    if "browser_first_chart_s" in out:
        out["ratio_browser_to_target"] = round(float(out["browser_first_chart_s"]) / TARGET_S, 2)  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(out))
        return
    print(f"log: {out['log']}, {out['file_mb']} MB on disk, {out['lines']:,} lines, {out['batches']:,} batches, "
          f"{out['kv_rows']:,} find_slot rows")
    print(f"parse {out['parse_s']} s + figure {out['figure_s']} s + JSON {out['json_s']} s "
          f"= first chart in {out['first_chart_s']} s ({out['points_drawn']:,} points, {out['json_kb']} KB)")
    print(f"app.py first run on the path (AppTest): {out['app_first_run_s']} s, {out['app_charts']} charts, "
          f"exception: {out['app_exception']}")
    if "browser_first_chart_s" in out:
        print(f"headless Chromium, page opened to position chart drawn: {out['browser_first_chart_s']} s "
              f"(first table: {out['browser_first_table_s']} s)")
    else:
        print("headless Chromium: not measured (chromium not installed; make browser)")
    print(f"ratio to the {TARGET_S:g} s target: library {out['ratio_library_to_target']}, "
          f"app {out['ratio_app_to_target']}, browser {out.get('ratio_browser_to_target', 'n/a')} (<= 1 meets it)")


if __name__ == "__main__":
    main()
