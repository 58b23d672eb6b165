"""`parse(jobs=N)` / `kvtrace parse --jobs N`: one log cut at input-batch dumps, read in pieces and merged,
gives exactly the serial tables. Pieces are forced small so that every kind of cut occurs: right after a
failure, right before one whose side comes from a hint in the piece before, between a batch and its
find_slot lines' signature, across buffers and requests."""

from __future__ import annotations

import gzip
import shutil
import threading
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from kvtrace import analyze
from kvtrace.analyze.cli import cli
from kvtrace.analyze.reader.split import cut_points, split_walk
from kvtrace.analyze.reader.walker import HINT_GAP

ROOT = Path(__file__).resolve().parents[3]
SERVER = ROOT / "tests" / "fixtures" / "server" / "b11434-draft-simple-2slots-head.log.gz"
SCENARIOS = sorted((ROOT / "tests" / "fixtures" / "scenarios").glob("*.log.gz"))


def assert_split(path: Path, piece_bytes: int) -> None:
    """The log really is read in pieces (not handed back to the serial reader)."""
    assert split_walk(path, 1, piece_bytes) is not None


def assert_same(a: analyze.ParseResult, b: analyze.ParseResult) -> None:
    for name in ("batches", "kv", "errors", "events"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), obj=name)
    assert a.meta == b.meta
    assert a.verdict.to_dict() == b.verdict.to_dict()


@pytest.fixture(scope="module")
def server_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real llama-server b11434 capture (two slots, draft-simple), unpacked: pieces are cut in plain files."""
    path = tmp_path_factory.mktemp("server") / "raw.log"
    with gzip.open(SERVER) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


@pytest.mark.parametrize("piece_bytes", [1_500, 25_000])
@pytest.mark.parametrize("log", ["samples/stale-drafter/raw.log", "samples/no-rollback/raw.log",
                                 "samples/healthy/raw.log"])
def test_engine_logs_split_equal_serial(log: str, piece_bytes: int) -> None:
    path = ROOT / log
    serial = analyze.parse(path)
    assert len(cut_points(path, path.stat().st_size // piece_bytes)) >= 3
    assert_split(path, piece_bytes)
    assert_same(serial, analyze.parse(path, piece_bytes=piece_bytes))


def test_failures_next_to_cuts() -> None:
    """The cuts of the small pieces fall right after failures, and at the dumps of batches that then fail:
    the merge still equals the serial read."""
    path = ROOT / "samples" / "stale-drafter" / "raw.log"
    serial = analyze.parse(path)
    assert len(serial.errors) > 5
    cuts = [p.first_line + 1 for p in cut_points(path, path.stat().st_size // 1_500)][1:]
    starts = list(serial.errors["line"])
    assert any(0 < c - s <= HINT_GAP for s in starts for c in cuts), "no cut right after a failure"
    b = serial.batches
    failed_dumps = set(b.line[b.batch.isin(serial.errors["batch"].dropna())])
    assert failed_dumps & set(cuts), "no piece that starts with the dump of a batch that then fails"
    assert_same(serial, analyze.parse(path, piece_bytes=1_500))


@pytest.mark.parametrize("piece_bytes", [20_000, 300_000])
def test_real_server_capture_split_equals_serial(server_log: Path, piece_bytes: int) -> None:
    serial = analyze.parse(server_log)
    assert len(serial.batches) > 500 and len(serial.events) > 50
    assert_split(server_log, piece_bytes)
    assert_same(serial, analyze.parse(server_log, piece_bytes=piece_bytes))


@pytest.mark.parametrize("capture", SCENARIOS, ids=[p.name for p in SCENARIOS])
def test_scenario_captures_split_equal_serial(capture: Path, tmp_path: Path) -> None:
    """Every speculative type and device setup of the scenario matrix (real llama-server b11434 captures),
    cut small: DFlash drafters re-reserve a compute buffer while serving, two-device runs print their
    layout over many lines, and a piece holding such lines reads what came before."""
    path = tmp_path / "raw.log"
    with gzip.open(capture) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert_split(path, 30_000)
    assert_same(analyze.parse(path), analyze.parse(path, piece_bytes=30_000))


@pytest.mark.parametrize("other_thread", [False, True])
def test_on_processes(server_log: Path, other_thread: bool) -> None:
    """The pieces read by worker processes (not in this one): forked, or started afresh when this process
    runs other threads (as the dashboard's server does), which a fork could hang on."""
    done = threading.Event()
    thread = threading.Thread(target=done.wait)
    if other_thread:
        thread.start()
    try:
        assert_same(analyze.parse(server_log), analyze.parse(server_log, jobs=2, piece_bytes=500_000))
    finally:
        done.set()
        if other_thread:
            thread.join()


def test_a_gzip_log_is_unpacked_and_read_in_pieces_and_a_small_one_serially(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvtrace.analyze.reader.split as split

    cut: list[Path] = []
    split_walk_ = split.split_walk
    monkeypatch.setattr(split, "split_walk", lambda path, *a: cut.append(path) or split_walk_(path, *a))
    got = analyze.parse(SERVER, piece_bytes=25_000)
    assert_same(analyze.parse(SERVER), got)
    assert got.source == str(SERVER) and cut and cut[0].name == "unpacked.log"
    assert not cut[0].exists()  # the unpacked copy is gone
    # a truncated .gz: what it held, in pieces, with the reader's warning kept
    short = tmp_path / "cut.log.gz"
    short.write_bytes(SERVER.read_bytes()[: SERVER.stat().st_size // 2])
    serial, pieces = analyze.parse(short), analyze.parse(short, piece_bytes=25_000)
    assert_same(serial, pieces)
    assert pieces.warnings == serial.warnings and "ends early" in pieces.warnings[0]
    small = ROOT / "samples" / "healthy" / "raw.log"
    assert_same(analyze.parse(small), analyze.parse(small, jobs=4))


def test_cli_jobs(server_log: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["parse", "--jobs", "2", str(server_log), "-o", str(tmp_path / "t")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "t" / "batches.parquet").exists()
    serial = analyze.parse(server_log)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "t" / "batches.parquet"), serial.batches)
    bad = CliRunner().invoke(cli, ["parse", "--jobs", "0", str(server_log)])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


def test_a_start_up_in_every_piece_is_merged_not_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Six runs of a server in one log (devices, contexts, layout and flags printed again and again, after
    the draft marker from the second on): each piece's meta lines are replayed onto the meta before it, and
    the result is the serial read's. A piece is read again only when its start state differs (here once;
    when start-up lines made a piece be read again, 11 of 105 were)."""
    path = tmp_path / "six-runs.log"
    with open(path, "wb") as dst:
        for capture in (SCENARIOS[0], SCENARIOS[-1]) * 3:
            with gzip.open(capture) as src:
                shutil.copyfileobj(src, dst)
    import kvtrace.analyze.reader.split as split

    reads: list[int] = []
    parse_piece = split.parse_piece
    monkeypatch.setattr(split, "parse_piece", lambda *a, **k: reads.append(1) or parse_piece(*a, **k))
    serial = analyze.parse(path)
    assert len(serial.meta["contexts"]) >= 9 and serial.meta["spec_impls"]
    pieces = len(cut_points(path, path.stat().st_size // 50_000))
    assert pieces >= 10
    assert_same(serial, analyze.parse(path, piece_bytes=50_000))
    assert len(reads) <= pieces + 2
