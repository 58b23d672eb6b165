"""The health findings (acceptance_collapse, slot_skew, drafting_stopped, drafter_stale) over logs whose health is
known, to count false alarms before and after a threshold changes ("measure blind first").

Inputs are files, folders of logs (every .log/.txt/.md/.gz in them; a labels.json beside them marks which are
healthy: `error_kind` draft_stats_only, or `failing: false`), and session folders. `--engine N` adds N healthy
embedded-engine runs per speculative type (seeds 0..N-1, needs the engine extra). Printed: one line per input
that fired something, then per group of inputs how many were read and how many fired each finding.

    python benchmarks/health_findings.py tests/fixtures/corpus tests/fixtures/scenarios [SESSIONS ...]
    python benchmarks/health_findings.py --engine 4 --requests 6 --cycles 60
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtrace.analyze import parse  # noqa: E402
from kvtrace.analyze.findings.health import FINDINGS, health  # noqa: E402
from kvtrace.analyze.reader.session import is_session  # noqa: E402

SUFFIXES = (".log", ".txt", ".md", ".gz")


def _healthy_names(folder: Path) -> set[str] | None:
    labels = folder / "labels.json"
    if not labels.is_file():
        return None
    data = json.loads(labels.read_text())
    return {name for name, e in data.items()
            if e["expected"]["error_kind"] == "draft_stats_only" or e.get("failing") is False}


def inputs(paths: list[str]) -> list[tuple[str, Path, bool | None]]:
    """(group, path, labelled healthy or None when not labelled) for every input."""
    out: list[tuple[str, Path, bool | None]] = []
    for p in map(Path, paths):
        if p.is_dir() and not is_session(p):
            names = _healthy_names(p)
            for f in sorted(p.iterdir()):
                if f.is_file() and f.suffix in SUFFIXES:
                    out.append((p.name, f, None if names is None else f.name in names))
                elif f.is_dir() and is_session(f):
                    out.append((p.name, f, None))
        else:
            out.append((p.parent.name if p.is_file() else "sessions", p, None))
    return out


def engine_sessions(n: int, requests: int, cycles: int, root: Path) -> list[tuple[str, Path, bool | None]]:
    from kvtrace.analyze.reader.session import new_session
    from kvtrace.capture.engine import EngineConfig, run_engine

    out: list[tuple[str, Path, bool | None]] = []
    for spec, drafting in (("draft-dflash", "block"), ("draft-eagle3", "block"), ("draft-simple", "block"),
                           ("draft-simple", "chain")):
        for seed in range(n):
            cfg = EngineConfig(spec_type=spec, drafting=drafting, fault="none", requests=requests, cycles=cycles,
                               seed=seed)
            session = new_session("engine", f"{spec}-{drafting}-s{seed}", root=root)
            run_engine(cfg, session)
            out.append((f"engine {spec}/{drafting}", session.path, True))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--engine", type=int, default=0, help="healthy engine runs per speculative type")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--cycles", type=int, default=60)
    args = ap.parse_args()
    todo = inputs(args.paths)
    with tempfile.TemporaryDirectory() as tmp:
        if args.engine:
            todo += engine_sessions(args.engine, args.requests, args.cycles, Path(tmp))
        groups: dict[str, Counter[str]] = {}
        for group, path, healthy in todo:
            c = groups.setdefault(group, Counter())
            c["read"] += 1
            c["labelled healthy"] += healthy is True
            try:
                found = health(parse(str(path)))
            except Exception as exc:  # noqa: BLE001 - a measurement lists what it could not read
                print(f"{path}: not read ({exc})")
                c["not read"] += 1
                continue
            if found:
                c["fired"] += 1
                c["fired on labelled healthy"] += healthy is True
                for f in found:
                    c[f.finding] += 1
                    print(f"{group} | {path.name} | healthy={healthy} | {f.finding} slot {f.slot} line "
                          f"{f.onset_line} {f.confidence}: {f.evidence}")
        print()
        print("| inputs | read | fired | fired on labelled healthy | " + " | ".join(FINDINGS) + " |")
        print("|---|---:|---:|---:|" + "---:|" * len(FINDINGS))
        for group, c in groups.items():
            print(f"| {group} | {c['read']} | {c['fired']} | {c['fired on labelled healthy']} | "
                  + " | ".join(str(c[f]) for f in FINDINGS) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
