"""The log named on the dashboard's command line is read while its server starts, and handed over once."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvtrace import analyze
from kvtrace.analyze.dashboard import preload

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "samples" / "stale-drafter"


def test_the_preloaded_parse_is_the_parse_and_is_handed_over_once(tmp_path: Path) -> None:
    session = tmp_path / "s"
    shutil.copytree(SAMPLE, session)
    preload.start(str(session))
    got = preload.take(str(session))
    assert got is not None
    result, error = got
    assert error is None and result is not None
    assert result.verdict.to_dict() == analyze.parse(session).verdict.to_dict()
    assert preload.take(str(session)) is None  # once: the page caches it from there


def test_other_bytes_at_the_same_path_are_not_taken(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes((SAMPLE / "raw.log").read_bytes())
    preload.start(str(log))
    with open(log, "ab") as fh:
        fh.write(b"one more line\n")
    os.utime(log, ns=(1, 1))
    assert preload.take(str(log)) is None


def test_a_missing_or_unreadable_log_leaves_the_message_to_the_page(tmp_path: Path) -> None:
    preload.start(str(tmp_path / "nope.log"))
    assert preload.take(str(tmp_path / "nope.log")) is None
    (tmp_path / "bad.gz").write_bytes(b"\x1f\x8b\x08\x00broken")
    preload.start(str(tmp_path / "bad.gz"))
    got = preload.take(str(tmp_path / "bad.gz"))
    # the reader's own answer, never an exception: what was there (nothing) and that the gzip ends early
    assert got is not None
    result, error = got
    assert error is None and result is not None
    assert result.warnings == analyze.parse(tmp_path / "bad.gz").warnings
    assert len(result.warnings) == 1 and "compressed data ends early" in result.warnings[0]
    assert result.verdict.kind == "no_log"


def test_a_job_no_page_took_is_stopped_and_its_file_removed(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes((SAMPLE / "raw.log").read_bytes())
    preload.start(str(log))
    job = next(iter(preload._jobs.values()))  # noqa: SLF001 - what the server leaves behind if it forgets
    preload.discard()
    assert job.proc.poll() is not None and not job.out.exists()
    assert preload.take(str(log)) is None


def test_an_upload_is_parsed_in_a_child_under_its_name_and_its_bytes_removed() -> None:
    import gzip
    import hashlib

    data = gzip.compress((SAMPLE / "raw.log").read_bytes(), mtime=0)
    digest = hashlib.sha256(data).hexdigest()
    preload.start_upload(digest, data, "report.log.gz")
    job = preload._jobs[f"upload:{digest}"]  # noqa: SLF001 - to see its folder go
    assert job.folder is not None and job.folder.is_dir()
    got = preload.take_upload(digest, len(data))
    assert got is not None
    result, error = got
    whole = analyze.parse(data, name="report.log.gz")
    assert error is None and result is not None and result.source == "report.log.gz"
    assert result.verdict.to_dict() == whole.verdict.to_dict() and result.batches.equals(whole.batches)
    assert not job.folder.exists() and preload.take_upload(digest, len(data)) is None  # once


def test_an_upload_no_page_took_is_stopped_and_its_bytes_removed() -> None:
    data = (SAMPLE / "raw.log").read_bytes()
    preload.start_upload("0" * 64, data, "x.log")
    job = preload._jobs["upload:" + "0" * 64]  # noqa: SLF001
    assert preload.take_upload("0" * 64, len(data) + 1) is None  # other bytes under the digest: not these
    assert job.folder is not None and not job.folder.exists()
    preload.start_upload("1" * 64, data, "x.log")
    job = preload._jobs["upload:" + "1" * 64]  # noqa: SLF001
    preload.discard()
    assert job.proc.poll() is not None and job.folder is not None and not job.folder.exists()


def test_an_upload_whose_name_cannot_be_an_argument_is_left_to_the_page() -> None:
    data = (SAMPLE / "raw.log").read_bytes()
    preload.start_upload("2" * 64, data, "bad\x00name.log")
    assert "upload:" + "2" * 64 not in preload._jobs  # noqa: SLF001 - nothing started, nothing left behind
    assert preload.take_upload("2" * 64, len(data)) is None


def _group(pgid: int) -> list[int]:
    """The processes of a process group, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


# A user's machine with one core or no /proc cannot show the split parse's pieces; CI has both and must run it.
@pytest.mark.skipif(((os.cpu_count() or 1) < 2 or not Path("/proc/self/stat").exists()) and not os.environ.get("CI"),
                    reason="the split parse needs two cores and /proc to be seen")
def test_a_job_stopped_mid_parse_leaves_none_of_its_pieces_processes(tmp_path: Path) -> None:
    import time

    log = tmp_path / "big.log"
    raw = (SAMPLE / "raw.log").read_bytes()
    log.write_bytes(raw * ((40 << 20) // len(raw)))  # 40 MB of real engine output: read in pieces
    preload.start(str(log))
    job = next(iter(preload._jobs.values()))  # noqa: SLF001
    deadline = time.monotonic() + 60
    while len(_group(job.proc.pid)) < 2 and job.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the child has started its pieces' processes
    assert len(_group(job.proc.pid)) >= 2, "the parse ended before it was read in pieces"
    preload.discard()
    deadline = time.monotonic() + 10
    while _group(job.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _group(job.proc.pid) == []
