"""How fast `kvtrace --help` and `kvtrace capture run --help` answer (target: <= 0.3 s each).

Runs the installed `kvtrace` entry point (the one beside this Python) as a user would: the first run after
clearing the bytecode caches of the project (cold), then the median of several warm runs.

    python benchmarks/cli_help.py [--runs 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.3
COMMANDS = (["--help"], ["capture", "run", "--help"], ["triage", "--help"])


def kvtrace() -> list[str]:
    beside = Path(sys.executable).with_name("kvtrace")
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "kvtrace.analyze"]


def clear_bytecode() -> None:
    for cache in ROOT.rglob("__pycache__"):
        if ".venv" not in cache.parts:
            shutil.rmtree(cache, ignore_errors=True)


def timed(args: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([*kvtrace(), *args], cwd=ROOT, capture_output=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"kvtrace {' '.join(args)} failed: {proc.stderr.decode(errors='replace')[-300:]}")
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for cmd in COMMANDS:
        clear_bytecode()
        cold = timed(cmd)
        warm = statistics.median(timed(cmd) for _ in range(args.runs))
        rows.append({"command": "kvtrace " + " ".join(cmd), "cold_s": round(cold, 3), "warm_s": round(warm, 3),
                     "warm_vs_target": round(warm / TARGET_S, 2)})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'command':32} {'cold':>8} {'warm':>8}  warm / {TARGET_S} s target")
        for r in rows:
            print(f"{r['command']:32} {r['cold_s']:>7.3f}s {r['warm_s']:>7.3f}s  {r['warm_vs_target']:.2f}x")
    return 0 if all(r["warm_s"] <= TARGET_S for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
