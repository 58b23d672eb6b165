"""Many logs' tables as one Parquet dataset, and SQL over it with DuckDB.

A dataset is a folder with one subfolder per table (`batches`, `kv`, `errors`, `events`, `meta`, and
`verdicts`, one row per log); each log adds one file to each, named after the log, with a `source` column
saying which log a row came from. A new log adds files and rewrites nothing; the same log parsed again
replaces its own files (each written whole, then renamed into place, so a run cut short leaves no half file).
A log that could not be read is a `verdicts` row with its `error` and nothing else.

`query` runs SQL with each table visible by its name, over datasets and over session (or tables) folders
that `kvtrace parse` wrote, whose rows get the folder's name as their `source`. Nothing here prints; duckdb
is imported only by `query`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from kvtrace.analyze.reader.session import VERDICT, table_file
from kvtrace.analyze.reader.source import InputError

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult

EXTRA = "kvtrace[cluster]"
LOG_TABLES = ("batches", "kv", "errors", "events", "meta")
TABLES = (*LOG_TABLES, "verdicts")
VERDICT_COLUMNS = ("source", "error", "kind", "component", "signature", "failure", "spec_type", "build", "gpus",
                   "seq_id", "last_pos", "batch_start", "n_position_errors", "n_errors", "n_batches", "n_resets",
                   "accepted", "generated", "acceptance", "synthetic", "n_stale_trims", "lines", "truncated", "summary",
                   "warnings")


class DatasetError(Exception):
    """A dataset or query that cannot be used as asked: one line."""


@dataclass(slots=True)
class Parsed:
    """One log's tables, or the reason it could not be read."""

    source: str
    result: ParseResult | None
    error: str = ""


def parsed(source: str, read: Callable[[str], ParseResult] | None = None) -> Parsed:
    """Parse one log (top-level, so a cluster's workers can run it); `read` parses it some other way."""
    from kvtrace import analyze

    try:
        return Parsed(source, (read or analyze.parse)(source))
    except InputError as exc:
        return Parsed(source, None, str(exc))


def log_key(source: str) -> str:
    """A log's file name in every table: its name, readable, and a hash of the whole source (two logs
    with one name in different folders stay apart)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", source.rstrip("/").rsplit("/", 1)[-1])[:60] or "log"
    return f"{stem}-{hashlib.sha1(source.encode()).hexdigest()[:12]}"


def verdict_row(p: Parsed) -> dict[str, Any]:
    """The `verdicts` row of one log: its verdict, signature and environment, or its error."""
    row: dict[str, Any] = dict.fromkeys(VERDICT_COLUMNS)
    row.update(source=p.source, error=p.error or None)
    if p.result is None:
        return row
    from kvtrace.analyze.findings.signatures import match_signature

    v = p.result.verdict
    m = match_signature(p.result)
    acc = v.acceptance or {}
    row.update(kind=v.kind, component=v.component, signature=m.name, failure=m.match.identity or None,
               spec_type=m.env.spec_type or None,
               build=m.env.build or None, gpus=m.env.n_gpus or None, seq_id=v.seq_id, last_pos=v.last_pos,
               batch_start=v.batch_start, n_position_errors=int(v.n_position_errors), n_errors=v.n_errors,
               n_batches=v.n_batches, n_resets=v.n_resets, accepted=acc.get("accepted"),
               generated=acc.get("generated"), acceptance=acc.get("rate"), synthetic=bool(acc.get("synthetic")),
               n_stale_trims=len(v.stale_trims), lines=p.result.lines,
               truncated=p.result.truncated, summary=v.summary, warnings=json.dumps(p.result.warnings))
    return row


def _verdicts_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))
    ints = ("gpus", "seq_id", "last_pos", "batch_start", "n_position_errors", "n_errors", "n_batches", "n_resets",
            "accepted", "generated", "n_stale_trims", "lines")
    for col in ints:
        df[col] = df[col].astype("Int64")
    df["acceptance"] = df["acceptance"].astype("Float64")
    for col in ("truncated", "synthetic"):  # synthetic: the server made the acceptance up (not the drafter's)
        df[col] = df[col].astype("boolean")
    for col in ("error", "kind", "component", "signature", "failure", "spec_type", "build", "summary", "warnings"):
        df[col] = df[col].astype("string")
    return df


def write_log(dataset: Path, p: Parsed) -> list[Path]:
    """Write one log's files into the dataset (replacing its own from an earlier run)."""
    key = log_key(p.source)
    frames: dict[str, pd.DataFrame] = dict(p.result.tables()) if p.result is not None else {}
    frames["verdicts"] = _verdicts_frame([verdict_row(p)])
    written = []
    for name in TABLES:
        path = dataset / name / f"{key}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        df = frames.get(name)
        if df is None:  # unreadable now: what an earlier run wrote for it is gone too
            path.unlink(missing_ok=True)
            continue
        if name != "verdicts":
            df = df.copy()
            df.insert(0, "source", p.source)
        part = path.with_name(f".{path.name}.part")
        df.to_parquet(part, index=False)
        os.replace(part, path)
        written.append(path)
    return written


def is_dataset(path: Path) -> bool:
    return (path / "verdicts").is_dir()


def _files(folder: Path, name: str) -> list[Path]:
    """A folder's files of one table: a dataset's table folder, or the one file `kvtrace parse` wrote."""
    if is_dataset(folder):
        return sorted((folder / name).glob("*.parquet"))
    single = folder / table_file(name)
    return [single] if name != "verdicts" and single.is_file() else []


def _sql_list(paths: Sequence[Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def _folder_verdicts(folder: Path) -> pd.DataFrame | None:
    """A session's (or tables folder's) verdict.json as a `verdicts` row."""
    path = folder / VERDICT
    if not path.is_file():
        return None
    v = json.loads(path.read_text(encoding="utf-8"))
    acc = v.get("acceptance") or {}
    row = dict.fromkeys(VERDICT_COLUMNS) | {k: v.get(k) for k in VERDICT_COLUMNS if k in v}
    row.update(source=folder.name, accepted=acc.get("accepted"), generated=acc.get("generated"),
               acceptance=acc.get("rate"), synthetic=bool(acc.get("synthetic")),
               n_stale_trims=len(v.get("stale_trims") or []), warnings=None)
    return _verdicts_frame([row])


# what `kvtrace query` runs: questions, never a statement that writes (COPY ... TO, EXPORT, ATTACH, CREATE, SET,
# INSTALL) or changes the connection's settings
READ_ONLY_STATEMENTS = ("SELECT", "EXPLAIN")


def _read_only(con: Any, sql: str, files: list[str]) -> None:
    """Hold a query to reading: each of its statements a SELECT (or EXPLAIN), and the connection locked to the
    dataset's own files (no other file read or written, no extension installed), where DuckDB has the settings."""
    for statement in con.extract_statements(sql):
        kind = str(statement.type).rsplit(".", 1)[-1]
        if kind not in READ_ONLY_STATEMENTS:
            raise DatasetError(f"query is read-only: only SELECT statements run (this one is {kind})")
    import duckdb

    try:
        con.execute("SET allowed_paths = ?", [sorted(set(files))])
    except duckdb.Error:  # DuckDB before 1.2 has no allowed_paths: the statement check above still holds
        return
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def query(sql: str, folders: Sequence[Path]) -> pd.DataFrame:
    """Run `sql` over the folders' tables (each visible by its name) and give the result."""
    try:
        import duckdb
    except ImportError:
        raise DatasetError(f"query needs duckdb: pip install '{EXTRA}'") from None
    for folder in folders:
        if not folder.is_dir():
            raise DatasetError(f"{folder}: no such folder; pass a dataset (kvtrace parse --dataset) or a "
                               "parsed session folder")
        if not is_dataset(folder) and not any(_files(folder, n) for n in LOG_TABLES):
            raise DatasetError(f"{folder}: no tables here; run kvtrace parse on it first")
    con = duckdb.connect()
    read: list[str] = []  # every file a view reads: the only ones the query may touch
    try:
        for name in TABLES:
            parts = []
            for i, folder in enumerate(folders):
                files = _files(folder, name)
                read += [str(f) for f in files]
                if name == "verdicts" and not is_dataset(folder):
                    frame = _folder_verdicts(folder)
                    if frame is not None:
                        con.register(f"_verdicts_{i}", frame)
                        parts.append(f"SELECT * FROM _verdicts_{i}")
                elif files and is_dataset(folder):
                    parts.append(f"SELECT * FROM read_parquet({_sql_list(files)}, union_by_name = true)")
                elif files:
                    label = folder.name.replace("'", "''")
                    parts.append(f"SELECT '{label}' AS source, * FROM read_parquet({_sql_list(files)})")
            if parts:
                con.execute(f"CREATE VIEW {name} AS " + " UNION ALL BY NAME ".join(parts))
        try:
            _read_only(con, sql, read)
            return con.execute(sql).df()
        except duckdb.Error as exc:
            raise DatasetError(f"query failed: {str(exc).splitlines()[0]}") from None
    finally:
        con.close()


__all__ = ["TABLES", "DatasetError", "Parsed", "is_dataset", "log_key", "parsed", "query", "verdict_row",
           "write_log"]
