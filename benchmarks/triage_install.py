"""What the triage workflow pays to install kvtrace: the core (what `kvtrace reply` and `triage` need) against the
core with the dashboard extra (what every install pulled before the dashboard became an extra), each into a fresh
venv from one wheel of this checkout, with pip's cache (the wheels this machine already has) so the figure is the
install itself; a runner also downloads, which the installed size stands for.

    python benchmarks/triage_install.py [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def install(wheel: Path, extra: str, where: Path) -> dict[str, object]:
    venv = where / (extra or "core")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    spec = f"{wheel}[{extra}]" if extra else str(wheel)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", spec], check=True)
    seconds = time.perf_counter() - t0
    site = next((venv / "lib").glob("python3*/site-packages"))
    # the installed core reads and replies without the dashboard's packages
    probe = "import importlib.util as u; print(u.find_spec('streamlit') is None, u.find_spec('plotly') is None)"
    absent = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True).stdout.split()
    return {"install": "kvtrace" + (f"[{extra}]" if extra else " (core)"), "seconds": round(seconds, 1),
            "installed_mb": round(_size(site) / 1e6, 1), "without_streamlit": absent == ["True", "True"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvtrace-install-") as tmp:
        where = Path(tmp)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(where / "dist"), str(ROOT)],
                       check=True)
        (wheel,) = (where / "dist").glob("kvtrace-*.whl")
        rows = [install(wheel, "", where), install(wheel, "dashboard", where)]
    core, full = rows
    ratio = {"seconds": round(float(core["seconds"]) / float(full["seconds"]), 2),  # type: ignore[arg-type]
             "installed_mb": round(float(core["installed_mb"]) / float(full["installed_mb"]), 2)}  # type: ignore[arg-type]
    if args.json:
        print(json.dumps({"rows": rows, "core_vs_with_dashboard": ratio}, indent=2))
    else:
        for r in rows:
            print(f"{r['install']:26} {r['seconds']:>6} s  {r['installed_mb']:>7} MB  "
                  f"without streamlit/plotly: {r['without_streamlit']}")
        print(f"core / with dashboard: {ratio['seconds']} of the time, {ratio['installed_mb']} of the size")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
