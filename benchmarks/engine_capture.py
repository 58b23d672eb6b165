"""How long a 1,000-cycle embedded-engine capture takes (real llama.cpp, generated tiny models, CPU).

Prints seconds per capture (model loading included, model generation not) for a healthy run and a
stale-drafter run, the cost ratio of LLAMA_KV_CACHE_DEBUG's extra lines, and that of writing raw.log as
llama.cpp's JSON log (--log-format jsonl) instead of text. Each setting runs --repeat times, the settings taking
turns, and the fastest run counts (by CPU time, which a busy neighbour changes less than the wall clock; the
ratios are of CPU time).

    python benchmarks/engine_capture.py [--cycles 1000] [--draft 4] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtrace.analyze.reader.session import RAW_LOG, Session, log_of  # noqa: E402
from kvtrace.capture.engine import EngineConfig, run_engine  # noqa: E402
from kvtrace.capture.models import ensure_models  # noqa: E402

REQUESTS = 4


def one(cache: Path, out: Path, cycles: int, **kw: object) -> dict[str, float]:
    out.mkdir()
    config = EngineConfig(cache_dir=cache, requests=REQUESTS, cycles=cycles // REQUESTS, **kw)  # type: ignore[arg-type]
    t0, c0 = time.perf_counter(), time.process_time()
    result = run_engine(config, Session(out))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "seconds": round(seconds, 3),
        "cpu_s": round(cpu, 3),  # the process's CPU time: what a busy neighbour changes least
        "cycles": len(result.cycles),
        "decodes": result.n_decodes,
        "failures": result.n_failures,
        "raw_log_mb": round(log_of(out).stat().st_size / 1e6, 2),
        "cycles_per_s": round(len(result.cycles) / seconds, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--draft", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-") as tmp:
        root = Path(tmp)
        ensure_models(root / "models", seed=0)  # generation is a one-off; not part of the figure
        settings: dict[str, dict[str, object]] = {
            "healthy": {"fault": "none"},
            "stale-drafter": {"fault": "stale-drafter"},
            "healthy, no kv-debug": {"fault": "none", "kv_debug": False},
            "healthy, jsonl": {"fault": "none", "log_format": "jsonl"},
        }
        runs: dict[str, dict[str, float]] = {}
        for i in range(args.repeat):
            for name, kw in settings.items():
                r = one(root / "models", root / f"{len(runs)}-{i}-{name}", args.cycles, draft=args.draft, **kw)
                if name not in runs or r["cpu_s"] < runs[name]["cpu_s"]:
                    runs[name] = r
    ratio = runs["healthy"]["cpu_s"] / runs["healthy, no kv-debug"]["cpu_s"]
    jsonl = runs["healthy, jsonl"]["cpu_s"] / runs["healthy"]["cpu_s"]
    if args.json:
        print(json.dumps({"runs": runs, "kv_debug_cost_ratio": round(ratio, 2), "jsonl_cost_ratio": round(jsonl, 2)}))
        return
    for name, r in runs.items():
        print(
            f"{name:22} {r['cycles']:5d} cycles in {r['seconds']:6.2f} s, {r['cpu_s']:6.2f} s CPU  "
            f"({r['cycles_per_s']:7.1f} cycles/s, "
            f"{r['decodes']} decodes, {r['failures']} refused, {RAW_LOG} {r['raw_log_mb']} MB)"
        )
    print(f"kv-debug on/off CPU time ratio: {ratio:.2f}x")
    print(f"jsonl/text CPU time ratio: {jsonl:.2f}x")


if __name__ == "__main__":
    main()
