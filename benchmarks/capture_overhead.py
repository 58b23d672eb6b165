"""What `kvtrace capture run --quiet` costs a program that logs as fast as it can.

A child replays a real llama.cpp log until it has written --lines lines, as fast as it can (or paced to
--rate MB/s, like a busy server). The log is a real llama-server b11434 batch-debug capture made on the
spot when `make server` has built one, else the corpus's bug-report logs. Each configuration runs --repeat
times (median kept):

- plain:    CMD > file                         (the child alone, output to a file)
- wrapped:  kvtrace capture run --quiet -- CMD (the child writes raw.log; chunk times, live parsing)
- start-up: kvtrace capture run --quiet -- true (the tool's fixed cost, measured apart)

Printed: wall and CPU seconds of each, the child's own wall time (it times itself, so this is what the
wrapper does to the program it watches), and the ratios. Target: beyond start-up, <= 5 % added wall time.

    python benchmarks/capture_overhead.py [--lines 3000000] [--repeat 3] [--rate MBPS] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtrace.analyze.reader.session import KEY_LIVE, RAW_LOG, log_of, read_manifest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KVTRACE = str(Path(sys.executable).parent / "kvtrace")
SOURCES = [ROOT / "tests" / "fixtures" / "corpus" / "00_beellama-28-multigpu-dflash-seed.log",
           ROOT / "tests" / "fixtures" / "corpus" / "01_beellama-27-dflash-drafter-consecutive.log"]

CHILD = r"""
import os, sys, time
n, rate, timing_path = int(sys.argv[1]), float(sys.argv[2]) * 1e6, sys.argv[3]
lines = []
for p in sys.argv[4:]:
    lines += open(p, "rb").read().splitlines(keepends=True)
step = max(1, len(lines) // 64)
blocks = [b"".join(lines[i:i + step]) for i in range(0, len(lines), step)]
per_block = [b.count(b"\n") for b in blocks]
t0 = time.perf_counter()
written = sent = 0
while written < n:
    for block, k in zip(blocks, per_block):
        view = memoryview(block)
        while view:
            view = view[os.write(1, view):]
        written += k
        sent += len(block)
        if rate:
            ahead = sent / rate - (time.perf_counter() - t0)
            if ahead > 0:
                time.sleep(ahead)
        if written >= n:
            break
open(timing_path, "w").write("%f %d" % (time.perf_counter() - t0, written))
"""


def replay_sources(root: Path) -> tuple[list[Path], str]:
    """A fresh real llama-server capture (tiny target + drafter, 3 requests) if a server is built."""
    from kvtrace.capture.llama_server import find_llama_server
    from kvtrace.capture.models import ensure_models

    server = find_llama_server()
    if server is None:
        return SOURCES, "corpus bug-report logs"
    pair = ensure_models()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = root / "server-session"
    subprocess.run([KVTRACE, "capture", "run", "--ping", "3", "--quiet", "--out", str(out), "--", str(server),
                    "-m", str(pair.target), "-md", str(pair.drafter), "--spec-type", "draft-simple", "--host",
                    "127.0.0.1", "--port", str(port), "-c", "512"], capture_output=True, check=True)
    return [log_of(out)], "a real llama-server b11434 capture (batch + KV debug, tiny draft pair)"


def measure(argv: list[str], stdout_path: Path | None, timing: Path | None) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    if stdout_path is not None:
        with open(stdout_path, "wb") as out:
            rc = subprocess.run(argv, stdout=out, stderr=subprocess.DEVNULL).returncode
    else:
        rc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    if rc not in (0, 1):  # 1: the replayed log holds position errors, which the capture reports
        raise SystemExit(f"{argv[0]} exited with {rc}")
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result = {"wall_s": wall, "cpu_s": cpu}
    if timing is not None:
        child_s, lines = timing.read_text().split()
        result["child_wall_s"] = float(child_s)
        result["lines"] = int(lines)
    return result


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in runs), 4) for k in runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=3_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rate", type=float, default=0.0, help="MB/s the child writes at (0: as fast as it can)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-") as tmp:
        root = Path(tmp)
        child = root / "child.py"
        child.write_text(CHILD)
        timing = root / "timing.txt"
        sources, source_name = replay_sources(root)
        cmd = [sys.executable, str(child), str(args.lines), str(args.rate), str(timing), *map(str, sources)]
        plain, wrapped, startup = [], [], []
        coverage: list[float] = []  # share of raw.log the live parse had read when the wrapper returned
        steps = tqdm(total=3 * args.repeat, desc="capture overhead", file=sys.stderr, unit="run")
        for i in range(args.repeat):
            plain.append(measure(cmd, root / "plain.log", timing))
            steps.update()
            session = root / f"s{i}"
            wrapped.append(measure([KVTRACE, "capture", "run", "--quiet", "--out", str(session), "--", *cmd],
                                   None, timing))
            size = log_of(session).stat().st_size
            if size != (root / "plain.log").stat().st_size:
                raise SystemExit(f"{RAW_LOG} has {size} bytes, the plain run wrote a different amount")
            live = read_manifest(session).get(KEY_LIVE) or {}
            parsed = (live.get("stats") or {}).get("bytes_parsed") or 0
            coverage.append(1.0 if live.get("complete") else parsed / max(size, 1))
            os.remove(log_of(session))
            steps.update()
            startup.append(measure([KVTRACE, "capture", "run", "--quiet", "--out", str(root / f"t{i}"), "--",
                                    "true"], None, None))
            steps.update()
        steps.close()
        mb = (root / "plain.log").stat().st_size / 1e6
    p, w, s = median(plain), median(wrapped), median(startup)
    figures = {
        "source": source_name,
        "rate_mb_s": args.rate,
        "lines": int(p["lines"]),
        "mb": round(mb, 1),
        "plain": p,
        "wrapped": w,
        "startup": s,
        "wall_ratio": round(w["wall_s"] / p["wall_s"], 3),
        "wall_ratio_beyond_startup": round((w["wall_s"] - s["wall_s"]) / p["wall_s"], 3),
        "child_wall_ratio": round(w["child_wall_s"] / p["child_wall_s"], 3),
        "cpu_ratio": round(w["cpu_s"] / p["cpu_s"], 3),
        "live_coverage": round(statistics.median(coverage), 3),
    }
    if args.json:
        print(json.dumps(figures))
        return
    pace = f"paced at {args.rate:g} MB/s" if args.rate else "as fast as it can"
    print(f"child output: {figures['lines']:,} lines, {figures['mb']:.1f} MB, {pace}, replaying {source_name}")
    print(f"{'':10} {'wall s':>8} {'cpu s':>8} {'child s':>8}")
    print(f"{'plain':10} {p['wall_s']:8.3f} {p['cpu_s']:8.3f} {p['child_wall_s']:8.3f}   CMD > file")
    print(f"{'wrapped':10} {w['wall_s']:8.3f} {w['cpu_s']:8.3f} {w['child_wall_s']:8.3f}   "
          "kvtrace capture run --quiet -- CMD")
    print(f"{'start-up':10} {s['wall_s']:8.3f} {s['cpu_s']:8.3f} {'':>8}   kvtrace capture run --quiet -- true")
    print(f"wall ratio wrapped/plain: {figures['wall_ratio']:.3f}; beyond start-up: "
          f"{figures['wall_ratio_beyond_startup']:.3f} (target <= 1.05)")
    print(f"child's own wall time, wrapped/plain: {figures['child_wall_ratio']:.3f}")
    print(f"cpu ratio wrapped/plain: {figures['cpu_ratio']:.3f} (the live parse runs beside the child, at idle "
          "priority; at the end the wrapper waits for it only when at most 4 MB are left)")
    print(f"live parse coverage when the wrapper returned: {figures['live_coverage']:.1%} of {RAW_LOG} "
          f"(the summary says so; {RAW_LOG} is complete)")


if __name__ == "__main__":
    main()
