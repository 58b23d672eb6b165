"""A capture session: one folder holding raw.log, manifest.json and whatever tables go with them.

Every capture (embedded engine, wrapped server, attached log) writes the same layout, so the reader,
the dashboard and the reports treat them alike.
"""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_ROOT = Path("sessions")
# The files of a session folder: the one contract between the captures that write them and everything that
# reads them. Spelled here only (tests/test_layout.py checks): elsewhere they are these names.
RAW_LOG = "raw.log"
MANIFEST = "manifest.json"
GROUND_TRUTH = "ground_truth.parquet"  # the embedded engine's record of every decode call
REQUESTS = "requests.parquet"  # --ping's requests
CHUNKS = "chunks.parquet"
CHUNKS_JOURNAL = "chunks.journal"  # what a capture writes as chunks arrive; chunks.parquet at the end
SCENARIO = "scenario.json"  # a scenario run: the scenario and how it went
VERDICT = "verdict.json"  # `kvtrace parse` of a session: the verdict, beside the tables (table_file)
SHAREABLE = "shareable.log"  # `kvtrace redact` / `--redact`: raw.log without the prompts and answers
METRICS = "metrics.parquet"  # the server's /metrics, scraped during the capture (t, name, labels, value)
RECORDED = "requests.jsonl"  # --record (and every replay): the client's requests, one JSON object a line
SHAPE = "requests.shape.jsonl"  # `kvtrace redact`: the recorded requests with made-up text of the same shape
REPRO = "repro.jsonl"  # `kvtrace replay --shrink`: the smallest sequence of recorded requests that still fails
FILES = (RAW_LOG, MANIFEST, GROUND_TRUTH, REQUESTS, CHUNKS, CHUNKS_JOURNAL, SCENARIO, VERDICT, SHAREABLE,
         METRICS, RECORDED, SHAPE, REPRO)
JOURNAL_RECORD = struct.Struct("<dqq")  # arrival time (unix s), offset in raw.log, size

# The manifest keys read by something other than the capture that wrote them (the reader, the live view,
# the scenarios); writers and readers both use these names.
KEY_END = "end"  # `kvtrace capture`: when it stopped
KEY_ENDED = "ended"  # the embedded engine: when it stopped
KEY_STOP_REASON = "stop_reason"
KEY_OUTCOME = "outcome"  # the engine's: {"status": ...}
KEY_PID = "kvtrace_pid"  # the capturing process: a live view tells a killed capture from a running one
KEY_HOST = "host"  # host_info()
KEY_COMMAND_LINE = "effective_command_line"  # the program's command line (secrets redacted)
KEY_PROGRAM = "program"  # the captured program: pid, returncode, signal
KEY_LIVE = "live"  # the live parse: stats (with bytes_parsed), complete, failed, triage
KEY_PING_CONFIG = "ping_config"  # --ping's settings, its prompt among them
KEY_REDACTED = "redacted"  # the redacted copy of the log (SHAREABLE): which file, what was removed
KEY_METRICS = "metrics"  # the /metrics scraper: url, scrapes, note (why it ended early); absent when not scraped
KEY_RECORD = "record"  # --record: where kvtrace listened, where the server moved, how many requests it recorded
KEY_REPLAY = "replay"  # a replay: which recording it sent, how many requests were sent and answered

_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


def tool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvtrace")
    except PackageNotFoundError:
        return "0+unknown"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def log_of(folder: Path) -> Path:
    """A session folder's log."""
    return Path(folder) / RAW_LOG


def log_named(path: Path) -> Path:
    """The log a path names: a session folder's raw.log, any other path itself."""
    path = Path(path)
    return log_of(path) if path.is_dir() else path


def manifest_of(folder: Path) -> Path:
    return Path(folder) / MANIFEST


def table_file(table: str) -> str:
    """The file a table of the reader's is written to (`kvtrace parse` writes them beside raw.log)."""
    return f"{table}.parquet"


def folder_of(path: Path) -> Path | None:
    """The session folder a path names: the folder itself, or the one its raw.log (or the redacted copy of
    it, SHAREABLE) lies in; else None."""
    path = Path(path)
    if path.is_dir():
        return path
    return path.parent if path.name in (RAW_LOG, SHAREABLE) else None


def read_manifest(folder: Path) -> dict[str, Any]:
    """A session folder's manifest; {} where there is none or it is not a JSON object (being written, cut)."""
    try:
        manifest = json.loads(manifest_of(folder).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def free_port(host: str = "127.0.0.1", start: int | None = None, tries: int = 50) -> int:
    """A TCP port nothing listens on: the first free one from `start` (one a user can remember), else one the
    OS picks. Every port kvtrace chooses (a server under llama-swap's ${PORT}, RPC servers, the dashboard)
    comes from here."""
    candidates = range(start, start + tries) if start is not None else range(0)
    for port in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def host_info() -> dict[str, str | int | None]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


@dataclass(slots=True)
class Session:
    """A session folder on disk."""

    path: Path

    @property
    def raw_log(self) -> Path:
        return log_of(self.path)

    @property
    def manifest_path(self) -> Path:
        return manifest_of(self.path)

    @property
    def ground_truth(self) -> Path:
        return self.path / GROUND_TRUTH

    def read_manifest(self) -> dict[str, Any]:
        return read_manifest(self.path)

    def write_manifest(self, data: Mapping[str, object]) -> None:
        """Merge `data` into manifest.json, atomically (a reader never sees half a file)."""
        merged = self.read_manifest()
        merged.update(data)
        merged.setdefault("tool", {"name": "kvtrace", "version": tool_version()})
        merged.setdefault(KEY_HOST, host_info())
        tmp = self.manifest_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(merged, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, self.manifest_path)


def session_name(kind: str, label: str = "") -> str:
    """Sortable, readable: 20261130-094512-engine-stale-drafter."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    parts = [stamp, kind] + ([label] if label else [])
    return _SLUG.sub("-", "-".join(parts)).strip("-")


def new_session(kind: str, label: str = "", *, out: Path | None = None, root: Path | None = None) -> Session:
    """Create the folder for a new capture: `out` exactly if given, else a fresh name under `root`."""
    if out is not None:
        path = Path(out)
    else:
        base = Path(root) if root is not None else DEFAULT_ROOT
        path = base / session_name(kind, label)
        n = 2
        while path.exists():
            path = base / f"{session_name(kind, label)}-{n}"
            n += 1
    path.mkdir(parents=True, exist_ok=True)
    return Session(path)


def is_session(path: Path) -> bool:
    path = Path(path)
    return path.is_dir() and log_of(path).is_file()


def list_sessions(root: Path | None = None) -> list[Session]:
    base = Path(root) if root is not None else DEFAULT_ROOT
    if not base.is_dir():
        return []
    return [Session(p) for p in sorted(base.iterdir(), reverse=True) if is_session(p)]


def load_chunks(session_dir: Path) -> pd.DataFrame:
    """Arrival times of a session's chunks (t, offset, nbytes): chunks.parquet, or the journal a capture
    that was killed left behind (a record cut short by the kill is dropped)."""
    import numpy as np
    import pandas as pd

    session_dir = Path(session_dir)
    parquet = session_dir / CHUNKS
    if parquet.exists():
        return pd.read_parquet(parquet)
    journal = session_dir / CHUNKS_JOURNAL
    data = journal.read_bytes() if journal.exists() else b""
    usable = len(data) - len(data) % JOURNAL_RECORD.size
    return pd.DataFrame(np.frombuffer(data[:usable], dtype=[("t", "<f8"), ("offset", "<i8"), ("nbytes", "<i8")]))
