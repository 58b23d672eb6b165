"""What the triage workflow pays to install kvtrace: the core (what `kvtrace reply` and `triage` need) against the
core with the dashboard extra (what every install pulled before the dashboard became an extra), each into a fresh
venv from one wheel of this checkout. Every wheel is downloaded once into a local folder first and installed from
there with no index, so the figure is pip's own work (resolve, unpack, byte-compile), not the network of this
machine; a runner also downloads, which the wheels' size stands for. On a shared machine the wall time follows
the load; the CPU time (user and system, of pip and its children) does not.

    python benchmarks/triage_install.py [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
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
    spec = f"{wheel}[{extra}]" if extra else str(wheel)
    report = where / f"{extra or 'core'}.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index",
                    "--find-links", str(where / "wheels"), "--dry-run", "--ignore-installed", "--report", str(report),
                    spec], check=True)
    names = {item["download_info"]["url"].rsplit("/", 1)[-1] for item in json.loads(report.read_text())["install"]}
    wheels_mb = sum((where / "wheels" / n).stat().st_size for n in names if (where / "wheels" / n).exists()) / 1e6
    t0 = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "--no-index",
                    "--find-links", str(where / "wheels"), spec], check=True)
    seconds = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime  # the machine's load left out
    site = next((venv / "lib").glob("python3*/site-packages"))
    # the installed core reads and replies without the dashboard's packages
    probe = "import importlib.util as u; print(u.find_spec('streamlit') is None, u.find_spec('plotly') is None)"
    absent = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True).stdout.split()
    return {"install": "kvtrace" + (f"[{extra}]" if extra else " (core)"), "seconds": round(seconds, 1),
            "cpu_seconds": round(cpu, 1), "wheels_mb": round(wheels_mb, 1), "installed_mb": round(_size(site) / 1e6, 1),
            "without_streamlit": absent == ["True", "True"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvtrace-install-") as tmp:
        where = Path(tmp)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(where / "dist"), str(ROOT)],
                       check=True)
        (wheel,) = (where / "dist").glob("kvtrace-*.whl")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary",
                        ":all:", "-d", str(where / "wheels"), f"{wheel}[dashboard]"], check=True)
        rows = [install(wheel, "", where), install(wheel, "dashboard", where)]
    core, full = rows
    ratio = {k: round(float(str(core[k])) / float(str(full[k])), 2)
             for k in ("seconds", "cpu_seconds", "wheels_mb", "installed_mb")}
    if args.json:
        print(json.dumps({"rows": rows, "core_vs_with_dashboard": ratio}, indent=2))
    else:
        for r in rows:
            print(f"{r['install']:26} {r['seconds']:>6} s ({r['cpu_seconds']} s CPU)  wheels {r['wheels_mb']:>6} MB  "
                  f"installed {r['installed_mb']:>6} MB  without streamlit/plotly: {r['without_streamlit']}")
        print(f"core / with dashboard: {ratio['seconds']} of the time, {ratio['cpu_seconds']} of the CPU time, "
              f"{ratio['wheels_mb']} of the download, "
              f"{ratio['installed_mb']} of the installed size")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
