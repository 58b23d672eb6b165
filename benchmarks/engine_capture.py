"""How long a 1,000-cycle embedded-engine capture takes (real llama.cpp, generated tiny models, CPU).

Prints seconds per capture (model loading included, model generation not) for a healthy run and a
stale-drafter run, and the cost ratio of LLAMA_KV_CACHE_DEBUG's extra lines.

    python benchmarks/engine_capture.py [--cycles 1000] [--draft 4] [--json]
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
    t0 = time.perf_counter()
    result = run_engine(config, Session(out))
    seconds = time.perf_counter() - t0
    return {
        "seconds": round(seconds, 3),
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
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-") as tmp:
        root = Path(tmp)
        ensure_models(root / "models", seed=0)  # generation is a one-off; not part of the figure
        runs = {
            "healthy": one(root / "models", root / "a", args.cycles, fault="none", draft=args.draft),
            "stale-drafter": one(root / "models", root / "b", args.cycles, fault="stale-drafter", draft=args.draft),
            "healthy, no kv-debug": one(
                root / "models", root / "c", args.cycles, fault="none", draft=args.draft, kv_debug=False
            ),
        }
    ratio = runs["healthy"]["seconds"] / runs["healthy, no kv-debug"]["seconds"]
    if args.json:
        print(json.dumps({"runs": runs, "kv_debug_cost_ratio": round(ratio, 2)}))
        return
    for name, r in runs.items():
        print(
            f"{name:22} {r['cycles']:5d} cycles in {r['seconds']:6.2f} s  ({r['cycles_per_s']:7.1f} cycles/s, "
            f"{r['decodes']} decodes, {r['failures']} refused, {RAW_LOG} {r['raw_log_mb']} MB)"
        )
    print(f"kv-debug on/off time ratio: {ratio:.2f}x")


if __name__ == "__main__":
    main()
