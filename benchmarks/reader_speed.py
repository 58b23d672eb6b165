"""Reader speed and memory: engine logs and real llama-server captures, measured in one run.

    python benchmarks/reader_speed.py                        # healthy + stale-drafter engine logs, real captures
    python benchmarks/reader_speed.py --fault stale-drafter  # one engine log only (and the real captures)
    python benchmarks/reader_speed.py --size-mb 1024 --fault stale-drafter   # the 1 GB memory check
    python benchmarks/reader_speed.py --capture server.log.gz --capture other.log   # more real captures
    python benchmarks/reader_speed.py --real-mb 1024 --capture server.log.gz        # a 1 GB real server log
    python benchmarks/reader_speed.py --pure                 # the walker alone, without its C accelerator

Engine logs: a long engine run (real llama.cpp, LLAMA_BATCH_DEBUG=1 and LLAMA_KV_CACHE_DEBUG=1) captured
once and its raw.log repeated until the size is reached (cached under benchmarks/out/). Real captures: the
llama-server captures in ../shared/data/ next to the repository when present (the run says when they are
absent), committed scenario captures under tests/fixtures/scenarios/ when present, the newest draft-dflash
and n-gram captures of the scenario matrix under scenario-sessions/ (benchmarks/scenarios.py, when the
server is built), and every --capture; a .gz is unpacked once into benchmarks/out/ so that the parse and grep
read the same plain file. --real-mb repeats each real capture to that size (the memory check on a real log).

For each file: `kvtrace parse` in a child process pinned to one core (wall and CPU seconds, MB/s, peak RSS
of that process), and `grep -c 'pos = '` on the same file as the reference; with --jobs N, also the split
parse on N processes. Targets (issue 11): >= 100 MB/s on one core on every log, 250 MB/s the aim; peak RSS
<= 500 MB for a 1 GB log.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out"
SHARED = ROOT.parent / "shared" / "data"  # real captures kept next to the repository, not in it
SCENARIOS = ROOT / "tests" / "fixtures" / "scenarios"
SESSIONS = ROOT / "scenario-sessions"  # where benchmarks/scenarios.py puts its captures by default
sys.path.insert(0, str(ROOT))

from kvtrace.analyze.reader.session import RAW_LOG, log_of  # noqa: E402


def engine_log(fault: str) -> Path:
    """A real engine capture with batch dumps and find_slot lines (and, with a fault, its failures)."""
    path = log_of(OUT / f"engine-{fault}")
    if not path.exists():
        subprocess.run([sys.executable, "-m", "kvtrace.analyze", "capture", "engine", "--fault", fault,
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


def plain(path: Path, min_mb: int) -> Path:
    """A real capture as a plain file of at least `min_mb` (unpacked once; repeated whole when shorter)."""
    if not path.name.endswith(".gz") and path.stat().st_size >= min_mb << 20:
        return path
    out = OUT / f"real-{capture_name(path).removesuffix('.gz')}-{min_mb}mb.log"
    if out.exists():
        return out
    # streamed, never held whole: the children's peak RSS would otherwise start from this process's
    tmp = out.with_suffix(".tmp")
    with open(tmp, "wb") as dst:
        while dst.tell() == 0 or dst.tell() < min_mb << 20:
            with (gzip.open(path) if path.name.endswith(".gz") else open(path, "rb")) as src:
                shutil.copyfileobj(src, dst, 4 << 20)
    tmp.replace(out)
    return out


def capture_name(path: Path) -> str:
    """A capture's name; a session's raw.log is named by its session folder."""
    return f"{path.parent.name}-{RAW_LOG}" if path.name == RAW_LOG else path.name


def real_captures(extra: list[Path]) -> list[Path]:
    found = sorted(SHARED.glob("*.log.gz")) + sorted(SHARED.glob("*.log")) if SHARED.is_dir() else []
    if not found:
        print(f"no real captures in {SHARED} (absent here): only --capture and committed fixtures are measured")
    if SCENARIOS.is_dir():
        found += sorted(SCENARIOS.glob("*.log.gz")) + sorted(SCENARIOS.glob("*.log"))
    # full scenario-matrix captures (benchmarks/scenarios.py, when the server is built): the newest
    # draft-dflash and n-gram ones
    newest: dict[str, Path] = {}
    for raw in sorted(SESSIONS.glob(f"*/{RAW_LOG}")):
        name = raw.parent.name.split("-", 2)[-1]
        if "dflash" in name or "ngram" in name:
            newest[name] = raw
    return found + list(newest.values()) + extra


CHILD = """
import resource, sys, time
t0 = time.perf_counter()
import kvtrace.analyze.reader.parser  # the reader and pandas: a fixed start-up cost, reported apart
imp = time.perf_counter() - t0
from kvtrace import analyze
jobs = int(sys.argv[2])
t0, c0 = time.perf_counter(), time.process_time()
r = analyze.parse(sys.argv[1], jobs=jobs) if jobs > 1 else analyze.parse(sys.argv[1])
cpu = time.process_time() - c0 + sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the benchmark process across fork and exec
hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:")]
rss = max(hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
          resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(time.perf_counter() - t0, cpu, rss, len(r.batches), len(r.kv), len(r.errors), r.verdict.kind, imp)
"""


def child_env(pure: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("KVTRACE_PURE_PYTHON", None)
    return env | {"KVTRACE_PURE_PYTHON": "1"} if pure else env


def accelerated(pure: bool) -> bool:
    """Whether the parse children read with the C accelerator (analyze/reader/_skim.c)."""
    probe = "from kvtrace.analyze.reader import walker; print(walker._skim is not None)"
    out = subprocess.run([sys.executable, "-c", probe],
                         capture_output=True, text=True, cwd=ROOT, env=child_env(pure), check=True)
    return out.stdout.strip() == "True"


def measure(path: Path, jobs: int = 1, pure: bool = False) -> dict[str, float | int | str]:
    size_mb = path.stat().st_size / 1e6
    # one core for the serial reader; the split parse gets every core
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") and jobs == 1 else []
    out = subprocess.run([*pin, sys.executable, "-c", CHILD, str(path), str(jobs)], check=True,
                         capture_output=True, text=True, cwd=ROOT, env=child_env(pure)).stdout.split()
    wall, cpu, rss_kb = float(out[0]), float(out[1]), int(out[2])
    t0 = time.perf_counter()
    count = subprocess.run(["grep", "-c", "pos = ", str(path)], capture_output=True, text=True).stdout.strip()
    grep_s = time.perf_counter() - t0
    return {
        "file": path.name,
        "jobs": jobs,
        "file_mb": round(size_mb, 1),
        "parse_wall_s": round(wall, 2),
        "import_s": round(float(out[7]), 2),  # before the parse, not counted in its MB/s
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
    ap.add_argument("--size-mb", type=int, default=200, help="size of each engine log")
    ap.add_argument("--fault", action="append", choices=["none", "stale-drafter", "no-rollback"],
                    help="engine run a log is made of: healthy, or failing on every draft after a reset "
                    "(repeatable; default: none and stale-drafter)")
    ap.add_argument("--capture", action="append", type=Path, default=[],
                    help="a real server capture (.log or .log.gz) to measure too (repeatable)")
    ap.add_argument("--real-mb", type=int, default=100,
                    help="real captures shorter than this are repeated whole to this size")
    ap.add_argument("--no-real", action="store_true", help="engine logs only")
    ap.add_argument("--jobs", type=int, default=1, help="also measure the split parse on N processes")
    ap.add_argument("--keep", action="store_true", help="keep the generated engine logs under benchmarks/out/")
    ap.add_argument("--pure", action="store_true", help="the walker alone, without its C accelerator "
                    "(KVTRACE_PURE_PYTHON=1): as where it is not built")
    args = ap.parse_args()
    missing = [str(p) for p in args.capture if not p.is_file()]
    if missing:
        raise SystemExit(f"reader_speed: no such capture: {', '.join(missing)}")
    OUT.mkdir(parents=True, exist_ok=True)
    fast = accelerated(args.pure)
    print(f"reader: {'with' if fast else 'without'} the C accelerator (analyze/reader/_skim.c)"
          + (" (--pure)" if args.pure else "" if fast else ": not built on this machine"), flush=True)
    runs: list[tuple[str, Path]] = []
    for fault in args.fault or ["none", "stale-drafter"]:
        runs.append((f"engine, --fault {fault}", big_log(args.size_mb, fault)))
    if not args.no_real:
        for cap in real_captures(args.capture):
            runs.append((f"real capture {capture_name(cap)}", plain(cap, args.real_mb)))
    rows = []
    for label, path in runs:
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # page-cache it for both readers
        for jobs in sorted({1, args.jobs}):
            result = measure(path, jobs, args.pure) | {"log": label, "accelerator": fast}
            rows.append(result)
            print(json.dumps(result), flush=True)
            where = "on one core" if jobs == 1 else f"with --jobs {jobs}"
            print(f"reader ({label}): {result['parse_mb_s']} MB/s {where} "
                  f"({result['ratio_to_target']}x the 100 MB/s target; CPU time: {result['parse_mb_s_cpu']} MB/s), "
                  f"peak RSS {result['peak_rss_mb']} MB for {result['file_mb']} MB; grep -c: "
                  f"{result['grep_mb_s']} MB/s, parse takes {result['ratio_parse_to_grep']}x grep's time", flush=True)
    print("\n| log | MB | jobs | parse | ratio to 100 MB/s | peak RSS | grep -c | parse / grep |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['log']} | {r['file_mb']} | {r['jobs']} | {r['parse_mb_s']} MB/s | {r['ratio_to_target']}x | "
              f"{r['peak_rss_mb']} MB | {r['grep_mb_s']} MB/s | {r['ratio_parse_to_grep']}x |")
    if not args.keep:
        for label, path in runs:
            if label.startswith("engine"):
                path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
