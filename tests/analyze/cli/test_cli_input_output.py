"""Input read only in part, and outputs that cannot be written, through the real `kvtrace` entry point (the
same `main()` a user's shell runs, so its exit codes and one-line messages are what is checked)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvtrace import analyze

ROOT = Path(__file__).resolve().parents[3]
STALE = ROOT / "samples" / "stale-drafter" / "raw.log"
HEALTHY = ROOT / "samples" / "healthy" / "raw.log"
CORPUS = sorted((ROOT / "tests" / "fixtures" / "corpus").glob("*.log"))


def kvtrace(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtrace.analyze", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def cut_gz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = gzip.compress(STALE.read_bytes())
    path = tmp_path_factory.mktemp("cut") / "stale-cut.log.gz"
    path.write_bytes(data[: len(data) // 2])
    return path


def _warned(proc: subprocess.CompletedProcess[str], path: Path) -> bool:
    return f"kvtrace: warning: {path}: compressed data ends early; read what was there" in proc.stderr


def test_triage_warns_and_says_truncated_in_json(cut_gz: Path) -> None:
    proc = kvtrace("triage", str(cut_gz))
    assert proc.returncode == 0 and _warned(proc, cut_gz), proc.stderr
    proc = kvtrace("triage", "--json", str(cut_gz))
    assert proc.returncode == 0 and _warned(proc, cut_gz)
    assert json.loads(proc.stdout)["truncated"] is True
    whole = kvtrace("triage", "--json", str(STALE))
    assert json.loads(whole.stdout)["truncated"] is False and "warning" not in whole.stderr


def test_parse_json_says_truncated(cut_gz: Path, tmp_path: Path) -> None:
    proc = kvtrace("parse", "--json", str(cut_gz), "-o", str(tmp_path / "tables"))
    assert proc.returncode == 0 and _warned(proc, cut_gz)
    (summary,) = json.loads(proc.stdout)
    assert summary["truncated"] is True and summary["warnings"]


def test_report_says_it_was_read_in_part(cut_gz: Path) -> None:
    proc = kvtrace("report", str(cut_gz))
    assert proc.returncode == 0 and _warned(proc, cut_gz)
    assert "**Read in part:** the input ended early" in proc.stdout
    assert "Read in part" not in kvtrace("report", str(STALE)).stdout


def test_compare_export_and_table_warn(cut_gz: Path, tmp_path: Path) -> None:
    proc = kvtrace("compare", str(cut_gz), str(HEALTHY))
    # the first half of the stale-drafter capture has no failure yet: neither side fails, exit 0
    assert proc.returncode == 0 and "verdict: unchanged" in proc.stdout and _warned(proc, cut_gz), proc.stderr
    proc = kvtrace("export", str(cut_gz), "--perfetto", str(tmp_path / "t.json"))
    assert proc.returncode == 0 and _warned(proc, cut_gz)
    proc = kvtrace("triage", "--table", str(cut_gz), str(HEALTHY))
    assert proc.returncode == 0 and _warned(proc, cut_gz)


def test_a_file_that_shrinks_while_read_is_read_in_part(tmp_path: Path) -> None:
    """A log truncated by its writer between open and read: the size promised at open is not what came."""
    from kvtrace.analyze.reader.source import iter_chunks, open_source

    path = tmp_path / "shrinks.log"
    path.write_bytes(STALE.read_bytes())
    opened = open_source(path)
    with open(path, "r+b") as fh:
        fh.truncate(1000)
    text = "".join(iter_chunks(opened))
    opened.stream.close()
    assert len(text) < STALE.stat().st_size and opened.truncated  # what was buffered at open, no more
    assert any("shrank while it was read" in w for w in opened.warnings)


@pytest.mark.parametrize("log", CORPUS, ids=lambda p: p.stem[:24])
def test_a_verdict_read_in_part_claims_no_side_its_errors_do_not_show(log: Path) -> None:
    """Cut anywhere, a log's failing side is one its own error rows name, or unknown: the absence of the
    speculative lines in what was read proves nothing about what was not."""
    data = gzip.compress(log.read_bytes())
    for share in (0.3, 0.5, 0.7, 0.9):
        result = analyze.parse(data[: int(len(data) * share)])
        if not result.truncated:
            continue
        v = result.verdict
        if v.component != "unknown":
            assert v.component in set(result.errors["component"]), (share, v.component)


def test_unwritable_outputs_are_usage_errors(tmp_path: Path) -> None:
    long_name = str(tmp_path / ("x" * 300))
    cases = [
        ("parse", str(STALE), "-o", "/proc/kvtrace-tables"),
        ("parse", str(STALE), "-o", long_name),
        ("report", str(STALE), "-o", "/proc/kvtrace-report.md"),
        ("report", str(STALE), "-o", long_name + ".md"),
        ("export", str(STALE), "--perfetto", "/proc/kvtrace-trace.json"),
        ("export", str(STALE), "--perfetto", long_name + ".json"),
    ]
    for args in cases:
        proc = kvtrace(*args)
        assert proc.returncode == 2, (args, proc.returncode, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvtrace: "), (args, proc.stderr)
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


def test_dashboard_on_stdin_says_what_to_do_instead() -> None:
    proc = kvtrace("dashboard", "-")
    assert proc.returncode == 2
    assert "cannot read stdin" in proc.stderr and "pass a log file, a session folder or - for stdin" not in proc.stderr
