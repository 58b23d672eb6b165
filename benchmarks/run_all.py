"""Run every benchmark in turn (`make bench`). Each prints its own figures and ratios to its target."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = [
    ["cli_help.py"],
    ["reader_speed.py"],  # engine logs (healthy, stale-drafter) and real server captures in one run
    ["long_line.py"],  # a whole triage of one pasted 1 MB line per family's opening: linear growth
    ["engine_capture.py"],
    ["capture_overhead.py"],
    ["dashboard_first_chart.py"],
    ["follow_cost.py"],
    ["live_under_load.py"],
    ["triage_jobs.py"],
    ["proxy_cost.py"],
    # false alarms of the health findings over inputs known healthy (a count, not a speed)
    ["health_findings.py", "tests/fixtures/corpus", "tests/fixtures/scenarios", "--engine", "1"],
]


def main() -> int:
    failed = 0
    for args in RUNS:
        print(f"\n=== {' '.join(args)}", flush=True)
        failed += subprocess.run([sys.executable, str(HERE / args[0]), *args[1:]]).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
