"""How a whole triage grows with one pasted line of 1 MB (issue 36, item 5): each family's opening repeated, 64 KB
against 1 MB. A linear reader takes 16 times as long for 16 times the line (the reference is the 64 KB run of the
same opening, measured in the same run); a quadratic one 256 times. `--regexes` also gives the slowest single
regex of the reader on 1 MB of its own openings (target: under 1 s each).

    python benchmarks/long_line.py [--regexes] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.analyze.reader.test_linear import FAMILY_OPENINGS, MB, REGEXES, triage_s  # noqa: E402  # the tests' own
from tests.analyze.regex_samples import openings  # noqa: E402


def slowest_regex() -> tuple[str, str, float]:
    worst = ("", "", 0.0)
    for name, rx in REGEXES.items():
        for opening in openings(rx):
            line = (opening * (MB // len(opening) + 1))[:MB]
            start = time.perf_counter()
            rx.search(line)
            took = time.perf_counter() - start
            if took > worst[2]:
                worst = (name, opening, took)
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--regexes", action="store_true", help="also time every regex alone (about a minute)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        triage_s(folder, "x", 1024, 0)  # the reader's imports, outside the figures
        for i, opening in enumerate(FAMILY_OPENINGS):
            small = min(triage_s(folder, opening, MB // 16, 10 * i + run) for run in (1, 2))
            big = triage_s(folder, opening, MB, 10 * i + 3)
            rows.append({"opening": opening, "kb64_s": round(small, 3), "mb1_s": round(big, 3),
                         "growth": round(big / small, 1)})
    worst = slowest_regex() if args.regexes else None
    if args.json:
        print(json.dumps({"triage": rows, "slowest_regex": worst}, indent=2))
        return 0
    print(f"{'opening':28} {'64 KB':>8} {'1 MB':>8}  growth (linear 16, quadratic 256)")
    for r in rows:
        print(f"{r['opening']!r:28} {r['kb64_s']:7.3f}s {r['mb1_s']:7.3f}s  {r['growth']:5.1f}x")
    if worst is not None:
        print(f"slowest regex on 1 MB of its openings: {worst[0]} on {worst[1][:30]!r}: {worst[2]:.3f} s"
              " (target < 1 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
