"""What following a busy capture costs: `kvtrace dashboard SESSION --follow` on a server writing 20 MB/s.

    python benchmarks/follow_cost.py [--rate 20] [--seconds 15] [--log PATH] [--json]

A child process writes a real log into SESSION/raw.log at --rate MB/s (the real 124 MB llama-server b11434
capture when the shared data folder beside the checkout has it, else the reader benchmark's engine log,
repeated as needed). This process does what the dashboard's server does for a followed page, at the same
priority (nice 10): every second it polls kvtrace.analyze.dashboard.follow.Follower (new bytes through the streaming
parser, tables rebuilt at most a quarter of the time) and builds the position figure and its JSON for the
browser. Targets: the following side under one core, the writer's rate unchanged.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from reader_speed import big_log  # noqa: E402 - the reader benchmark's log, built once and shared

from kvtrace.analyze.reader.session import KEY_END, KEY_STOP_REASON, log_of, manifest_of  # noqa: E402

REAL_LOG = ROOT.parent / "shared" / "data" / "server-b11434-draft-simple-2slots.log.gz"

WRITER = """
import sys, time
src, dst, rate, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3]) * 1e6, float(sys.argv[4])
data = open(src, "rb").read()
chunk = 1 << 20
t0 = time.perf_counter()
written = 0
with open(dst, "ab", buffering=0) as out:
    while time.perf_counter() - t0 < seconds:
        i = written % len(data)
        out.write(data[i : i + chunk])
        written += min(chunk, len(data) - i)
        ahead = written / rate - (time.perf_counter() - t0)
        if ahead > 0:
            time.sleep(ahead)
print(written, time.perf_counter() - t0)
"""


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=20.0, help="MB/s the capture writes")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--log", type=Path, help="the log to replay (default: the real capture, if present)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import plotly.io as pio

    from kvtrace.analyze.dashboard.follow import Follower
    from kvtrace.analyze.views.figures import position_figure

    os.nice(10)  # as `kvtrace dashboard --follow` runs its server
    src = args.log or (REAL_LOG if REAL_LOG.is_file() else big_log(100, "stale-drafter"))
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "source.log"
        opener = gzip.open if src.read_bytes()[:2] == b"\x1f\x8b" else open
        with opener(src, "rb") as fh:
            plain.write_bytes(fh.read())
        session = Path(tmp) / "session"
        session.mkdir()
        manifest_of(session).write_text("{}")
        log_of(session).write_bytes(b"")
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(plain), str(log_of(session)), str(args.rate),
                                   str(args.seconds)], stdout=subprocess.PIPE)
        follower = Follower(session)
        t0, c0 = time.perf_counter(), _cpu()
        polls = figures = 0
        while writer.poll() is None:
            tick = time.perf_counter()
            state = follower.poll()
            polls += 1
            if state.result is not None and len(state.result.batches):
                fig = position_figure(state.result, seq_id=state.result.verdict.seq_id)
                pio.to_json(fig, validate=False)
                figures += 1
            time.sleep(max(0.0, 1.0 - (time.perf_counter() - tick)))
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        assert writer.stdout is not None
        written_s, writer_s = writer.stdout.read().split()
        written = int(written_s)
        lag = written - follower.poll().bytes_read
        manifest_of(session).write_text(json.dumps({KEY_END: "now", KEY_STOP_REASON: "benchmark"}))
        t1 = time.perf_counter()
        while not (state := follower.poll()).ended:
            pass
        catch_up = time.perf_counter() - t1
    out = {
        "log": src.name, "rate_mb_s": args.rate, "seconds": round(wall, 1), "written_mb": round(written / 1e6, 1),
        "writer_mb_s": round(written / 1e6 / float(writer_s), 2), "follow_cores": round(cpu / wall, 2),
        "polls": polls, "figures": figures, "lag_at_end_mb": round(lag / 1e6, 1),
        "finish_after_end_s": round(catch_up, 2), "rows": len(state.result.batches) if state.result else 0,
    }  # fmt: skip
    if args.json:
        print(json.dumps(out))
        return
    print(f"replaying {out['log']} at {args.rate:g} MB/s for {out['seconds']} s: {out['written_mb']} MB written "
          f"(the writer achieved {out['writer_mb_s']} MB/s)")
    print(f"following side: {out['follow_cores']} cores (target < 1), {polls} polls, {figures} figures drawn; "
          f"{out['lag_at_end_mb']} MB behind when the writer stopped, finished {out['finish_after_end_s']} s after "
          f"the end was written")
    ratio = float(out["writer_mb_s"]) / args.rate  # type: ignore[arg-type]
    print(f"ratio to target: cores {out['follow_cores']} / 1.0; writer at {ratio:.3f} of its rate")


if __name__ == "__main__":
    main()
