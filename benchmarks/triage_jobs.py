"""How much `kvtrace triage --table --jobs N` gains over one process, on a pile of real engine logs.

Makes LOGS engine captures (real llama.cpp, generated tiny models, faults in turn), then times
kvtrace.analyze.views.triage.triage_rows over them with jobs = 1 and jobs = N (default: the CPU count), checks the rows
are identical, and prints seconds, logs per second and the speed-up ratio.

    python benchmarks/triage_jobs.py [--logs 16] [--cycles 200] [--jobs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtrace.analyze.reader.session import Session, log_of  # noqa: E402
from kvtrace.analyze.views.triage import cluster, triage_rows  # noqa: E402
from kvtrace.capture.engine import EngineConfig, run_engine  # noqa: E402

FAULTS = ("none", "stale-drafter", "no-rollback")


def timed(paths: list[str], jobs: int) -> tuple[float, list]:
    t0 = time.perf_counter()
    rows = cluster(triage_rows(paths, jobs=jobs))
    return time.perf_counter() - t0, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logs", type=int, default=16)
    ap.add_argument("--cycles", type=int, default=200, help="draft/verify cycles per request (3 requests a log)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-") as tmp:
        paths = []
        for i in range(args.logs):
            out = Path(tmp) / f"log{i:03d}"
            out.mkdir()
            run_engine(EngineConfig(fault=FAULTS[i % len(FAULTS)], requests=3, cycles=args.cycles, seed=i),
                       Session(out))
            paths.append(str(out))
        mb = sum(log_of(Path(p)).stat().st_size for p in paths) / 1e6
        serial, rows1 = timed(paths, 1)
        parallel, rows_n = timed(paths, args.jobs)
        assert [(r.report, r.signature) for r in rows1] == [(r.report, r.signature) for r in rows_n]
    result = {"logs": args.logs, "log_mb": round(mb, 1), "jobs": args.jobs,
              "serial_s": round(serial, 3), "parallel_s": round(parallel, 3),
              "serial_logs_per_s": round(args.logs / serial, 2), "parallel_logs_per_s": round(args.logs / parallel, 2),
              "speedup": round(serial / parallel, 2)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"triage --table over {args.logs} engine logs ({result['log_mb']} MB): "
              f"jobs=1 {result['serial_s']} s ({result['serial_logs_per_s']} logs/s), "
              f"jobs={args.jobs} {result['parallel_s']} s ({result['parallel_logs_per_s']} logs/s), "
              f"speed-up x{result['speedup']}")


if __name__ == "__main__":
    main()
