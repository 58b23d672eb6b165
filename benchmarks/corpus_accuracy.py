"""How well triage reads labelled real bug reports: field accuracy, kind accuracy, named-signature coverage.

A labelled set is a folder of logs and a labels.json (the format of tests/fixtures/corpus/labels.json:
one entry per file, `expected` with error_kind, component, seq_id, last_pos_X, batch_start_Y, n_errors;
`failing: false` marks a log with no failure in it whose kind is not draft_stats_only). Files that start
with a header block (LABELS.md: everything up to the first line that is exactly `---`) are read with
`--header`.

Printed: field accuracy (six fields per report, `unsure` skipped), kind accuracy (`unsure` skipped too),
and of the failing reports how many get a named signature (not `unclassified`) against the target of
80 %; then every miss.

    python benchmarks/corpus_accuracy.py [FOLDER ...] [--labels labels.json] [--header] [--json] [--quiet]

Several folders (one per blind batch) are scored each on its own, one line each, then their misses.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtrace.analyze import parse  # noqa: E402
from kvtrace.analyze.findings.signatures import match_signature  # noqa: E402

FIELDS = (("error_kind", "kind"), ("component", "component"), ("seq_id", "seq_id"),
          ("last_pos_X", "last_pos"), ("batch_start_Y", "batch_start"), ("n_errors", "n_position_errors"))
TARGET = 0.80


def _label(value: str) -> int | str | None:
    if value == "none":
        return None
    return int(value) if value.lstrip("-").isdigit() else value


def failing(entry: dict[str, Any]) -> bool:
    """A report with a failure in it (the ones a signature should name)."""
    return entry["expected"]["error_kind"] != "draft_stats_only" and entry.get("failing", True)


def read(path: Path, header: bool) -> bytes:
    data = path.read_bytes()
    if header:
        lines = data.splitlines(keepends=True)
        for i, line in enumerate(lines):
            if line.strip() == b"---":
                return b"".join(lines[i + 1:])
    return data


def score(folder: Path, labels: dict[str, dict[str, Any]], header: bool = False) -> dict[str, Any]:
    right = total = kinds = kinds_total = n_failing = named = 0
    misses: list[str] = []
    signatures: dict[str, str] = {}
    for name, entry in sorted(labels.items()):
        path = folder / name
        if not path.exists():  # the same report kept under another suffix (corpus-dev's .txt files)
            path = next(folder.glob(Path(name).stem + ".*"), path)
        if not path.exists():
            misses.append(f"{name}: not in {folder.name}, skipped")
            continue
        result = parse(read(path, header), name=name)
        got = result.verdict.to_dict()
        sig = match_signature(result)
        signatures[name] = sig.name
        for label_key, got_key in FIELDS:
            want = entry["expected"][label_key]
            if want == "unsure":
                continue
            total += 1
            ok = got[got_key] == _label(want)
            right += ok
            if not ok:
                misses.append(f"{name}: {label_key} {got[got_key]!r} != {want!r}")
        if entry["expected"]["error_kind"] != "unsure":  # like the fields: a label that could go either way
            kinds_total += 1
            kinds += got["kind"] == entry["expected"]["error_kind"]
        if failing(entry):
            n_failing += 1
            if sig.name != "unclassified":
                named += 1
            else:
                misses.append(f"{name}: no named signature ({got['kind']}, {got['component']})")
    return {"reports": len(signatures), "field_accuracy": right / total if total else 0.0, "fields": total,
            "kind_right": kinds, "kinds": kinds_total, "failing": n_failing, "named": named,
            "named_share": named / n_failing if n_failing else 1.0, "signatures": signatures, "misses": misses}


def row(name: str, s: dict[str, Any]) -> str:
    """One folder's figures on one line: reports, field accuracy, kind accuracy, named share."""
    return (f"{name}: {s['reports']} reports, field {s['field_accuracy']:.3f} ({s['fields']} fields), "
            f"kind {s['kind_right']}/{s['kinds']} = {s['kind_right'] / s['kinds'] if s['kinds'] else 0:.3f}, "
            f"named {s['named']}/{s['failing']} = {s['named_share']:.0%} (target {TARGET:.0%})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    corpus = Path(__file__).resolve().parents[1] / "tests/fixtures/corpus"
    ap.add_argument("folders", nargs="*", type=Path, default=[corpus], metavar="FOLDER",
                    help="labelled folders, each scored on its own (a batch per folder)")
    ap.add_argument("--labels", type=Path, help="labels.json (default: FOLDER/labels.json; one folder only)")
    ap.add_argument("--header", action="store_true", help="strip each file's header block up to the first `---`")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quiet", action="store_true", help="the figures only, not the misses")
    args = ap.parse_args()
    if args.labels and len(args.folders) > 1:
        ap.error("--labels goes with one folder")
    scores = {}
    for folder in args.folders:
        labels_file = args.labels or folder / "labels.json"
        if not labels_file.is_file():
            print(f"{folder}: no labels.json", file=sys.stderr)
            return 2
        labels = json.loads(labels_file.read_text(encoding="utf-8"))
        scores[str(folder)] = score(folder, labels, args.header)
    if args.json:
        print(json.dumps(scores if len(scores) > 1 else next(iter(scores.values())), indent=2))
        return 0
    for name, s in scores.items():
        print(row(Path(name).name, s))
    for name, s in scores.items():
        if s["misses"] and not args.quiet:
            print(f"{Path(name).name} misses:")
            for m in s["misses"]:
                print("  " + m)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
