"""Many reports at once: one row per log with its signature, clustered so the same bug sits together.

Rows sort by signature (catalogue order: most specific first), then failing side, then the failure's own words
where they tell one bug from another (an assert's condition, a CUDA error, a load error: `failure`), then a
similarity key (the rule's key: variant, spec type), then name; a cluster is one (signature, side, failure). Parsing
runs in
worker processes with `jobs` > 1 (each worker returns a small row, not the tables).
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvtrace.analyze.findings.signatures import ORDER
from kvtrace.analyze.reader.session import RAW_LOG
from kvtrace.analyze.views.report import escape

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult


@dataclass(slots=True)
class TriageRow:
    report: str  # the file (or session folder) name, not its path: tables get pasted in public
    signature: str
    side: str
    key: str
    kind: str
    seq_id: int | None
    x: int | None
    y: int | None
    position_errors: int
    failures: int
    spec_type: str
    build: str
    gpus: int | None
    acceptance: float | str | None  # "synthetic" where the server chose what was accepted
    failure: str = ""  # the failure's own words where they tell one bug from another (Match.identity)
    # what the verdict stands on (analyze/reader/proof.py): log, runtime, prose; None: no failure and no log line
    proof: str | None = None
    cluster: int = 0
    source: str = ""
    error: str = ""  # the one-line reason a log could not be read (then the rest is empty)
    truncated: bool = False  # read only in part
    warnings: tuple[str, ...] = ()


COLUMNS = ("cluster", "report", "signature", "side", "key", "kind", "proof", "seq_id", "x", "y", "position_errors",
           "failures", "spec_type", "build", "gpus", "acceptance", "failure")


def _name(source: str) -> str:
    path = Path(source)
    return "stdin" if source == "-" else (path.name if path.name != RAW_LOG else f"{path.parent.name}/{RAW_LOG}")


def triage_row(source: str, read: Callable[[str], ParseResult] | None = None) -> TriageRow:
    """Parse one log into its row (top-level, so worker processes can run it); `read` parses it some other
    way (on a cluster's worker: a URL, a big log's pieces on the cluster)."""
    from kvtrace import analyze
    from kvtrace.analyze.findings.signatures import match_signature

    try:
        result = (read or analyze.parse)(source)
    except analyze.InputError as exc:
        return TriageRow(_name(source), "", "", "", "", None, None, None, 0, 0, "", "", None, None, source=source,
                         error=str(exc))
    v = result.verdict
    m = match_signature(result)
    return TriageRow(
        report=_name(source), signature=m.name, side=v.component, key=m.match.key, kind=v.kind, seq_id=v.seq_id,
        x=v.last_pos, y=v.batch_start, position_errors=int(v.n_position_errors), failures=len(result.errors),
        spec_type=m.env.spec_type, build=m.env.build, gpus=m.env.n_gpus or None,
        acceptance="synthetic" if (v.acceptance or {}).get("synthetic") else (v.acceptance or {}).get("rate"),
        failure=m.match.identity, proof=v.proof, source=source, truncated=result.truncated,
        warnings=tuple(result.warnings),
    )


def triage_rows(sources: Iterable[str], jobs: int = 1, progress: bool = False) -> list[TriageRow]:
    """Rows in input order; `jobs` > 1 parses in that many processes."""
    sources = list(sources)
    bar: Callable[[Iterable[TriageRow]], Iterable[TriageRow]] = lambda it: it  # noqa: E731
    if progress:
        from tqdm import tqdm

        def bar(it: Iterable[TriageRow]) -> Iterable[TriageRow]:
            wrapped: Iterable[TriageRow] = tqdm(it, total=len(sources), unit="log", desc="triage", file=sys.stderr,
                                                leave=False)
            return wrapped

    if jobs <= 1 or len(sources) <= 1:
        return list(bar(map(triage_row, sources)))
    with ProcessPoolExecutor(max_workers=min(jobs, len(sources))) as pool:
        return list(bar(pool.map(triage_row, sources, chunksize=1)))


def cluster(rows: list[TriageRow]) -> list[TriageRow]:
    """Sorted so reports of one bug sit together, each with its cluster number (1, 2, ...)."""
    good = sorted((r for r in rows if not r.error),
                  key=lambda r: (ORDER.get(r.signature, len(ORDER)), r.side, r.failure, r.key, r.spec_type, r.report))
    n, last = 0, None
    for r in good:
        if (r.signature, r.side, r.failure) != last:
            n, last = n + 1, (r.signature, r.side, r.failure)
        r.cluster = n
    return good


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.1%}"
    return str(value)


def to_markdown(rows: list[TriageRow]) -> str:
    n = len({r.cluster for r in rows})
    out = [f"{len(rows)} report{'s' if len(rows) != 1 else ''}, {n} cluster{'s' if n != 1 else ''}", "",
           "| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in rows:
        out.append("| " + " | ".join(escape(_cell(getattr(r, c))) for c in COLUMNS) + " |")
    return "\n".join(out) + "\n"


def to_csv(rows: list[TriageRow]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow(["" if getattr(r, c) is None else getattr(r, c) for c in COLUMNS])
    return buf.getvalue()
