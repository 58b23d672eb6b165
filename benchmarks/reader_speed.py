"""Reader speed and memory on a big batch-debug log made from real engine output.

    python benchmarks/reader_speed.py                               # >= 200 MB healthy log
    python benchmarks/reader_speed.py --fault stale-drafter         # every draft failing, as in the seed report
    python benchmarks/reader_speed.py --size-mb 1024 --fault stale-drafter   # the 1 GB memory check

Builds the log once (cached under benchmarks/out/), by capturing a long engine run (real llama.cpp,
LLAMA_BATCH_DEBUG=1 and LLAMA_KV_CACHE_DEBUG=1) and repeating its raw.log until the size is reached. Then, in
the same run: `kvtrace parse` of the file in a child process pinned to one core (wall and CPU seconds, MB/s,
peak RSS of that process), and `grep -c 'pos = '` on the same file as the reference.
Targets (issue "Log reader"): >= 100 MB/s on one core; peak RSS <= 500 MB for a 1 GB log.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"


def engine_log(fault: str) -> Path:
    """A real engine capture with batch dumps and find_slot lines (and, with a fault, its failures)."""
    path = OUT / f"engine-{fault}" / "raw.log"
    if not path.exists():
        subprocess.run([sys.executable, "-m", "analyze", "capture", "engine", "--fault", fault,
                        "--requests", "4", "--cycles", "250", "--draft", "4", "--out", str(path.parent)],
                       check=True, stdout=subprocess.DEVNULL)
    return path


def big_log(size_mb: int, fault: str) -> Path:
    path = OUT / f"batch-debug-{fault}-{size_mb}mb.log"
    if path.exists() and path.stat().st_size >= size_mb << 20:
        return path
    seed = engine_log(fault).read_bytes()
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        written = 0
        while written < size_mb << 20:
            f.write(seed)
            written += len(seed)
    tmp.replace(path)
    return path


CHILD = """
import resource, sys, time, analyze
t0, c0 = time.perf_counter(), time.process_time()
r = analyze.parse(sys.argv[1])
print(time.perf_counter() - t0, time.process_time() - c0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
      len(r.batches), len(r.kv), len(r.errors), r.verdict.kind)
"""


def measure(path: Path) -> dict[str, float | int | str]:
    size_mb = path.stat().st_size / 1e6
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    out = subprocess.run([*pin, sys.executable, "-c", CHILD, str(path)], check=True, capture_output=True,
                         text=True, cwd=ROOT).stdout.split()
    wall, cpu, rss_kb = float(out[0]), float(out[1]), int(out[2])
    t0 = time.perf_counter()
    count = subprocess.run(["grep", "-c", "pos = ", str(path)], capture_output=True, text=True).stdout.strip()
    grep_s = time.perf_counter() - t0
    return {
        "file_mb": round(size_mb, 1),
        "parse_wall_s": round(wall, 2),
        "parse_cpu_s": round(cpu, 2),
        "parse_mb_s": round(size_mb / wall, 1),
        "parse_mb_s_cpu": round(size_mb / cpu, 1),
        "ratio_to_target_cpu": round(size_mb / cpu / 100, 2),
        "peak_rss_mb": round(rss_kb / 1024, 1),
        "grep_s": round(grep_s, 3),
        "grep_mb_s": round(size_mb / grep_s, 1),
        "ratio_parse_to_grep": round(wall / grep_s, 1),
        "grep_count": int(count or 0),
        "batches": int(out[3]),
        "kv_rows": int(out[4]),
        "errors": int(out[5]),
        "verdict": out[6],
        "target_mb_s": 100,
        "ratio_to_target": round(size_mb / wall / 100, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--fault", default="none", choices=["none", "stale-drafter", "no-rollback"],
                    help="engine run the log is made of: healthy, or failing on every draft after a reset")
    ap.add_argument("--keep", action="store_true", help="keep the generated log under benchmarks/out/")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    path = big_log(args.size_mb, args.fault)
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # page-cache it for both readers
    result = measure(path)
    print(json.dumps(result, indent=2))
    print(f"reader ({args.fault}): {result['parse_mb_s']} MB/s on one core "
          f"({result['ratio_to_target']}x the 100 MB/s target; CPU time: {result['parse_mb_s_cpu']} MB/s), "
          f"peak RSS {result['peak_rss_mb']} MB for {result['file_mb']} MB; grep -c: {result['grep_mb_s']} MB/s, "
          f"parse takes {result['ratio_parse_to_grep']}x grep's time")
    if not args.keep:
        path.unlink()


if __name__ == "__main__":
    main()
