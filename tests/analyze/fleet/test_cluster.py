"""`--scheduler` on a real Dask cluster (a `dask scheduler` and two `dask worker` processes on loopback):
the rows equal the serial run's, a big log's pieces run as tasks and merge exactly, a killed worker loses
nothing, an unreachable scheduler and an unreadable log are one line each, and the dataset answers
`kvtrace query`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pandas as pd
import pytest

from kvtrace import analyze
from kvtrace.analyze.fleet import cluster as dask_cluster
from kvtrace.analyze.fleet.dataset import TABLES, log_key
from kvtrace.analyze.reader.session import free_port
from kvtrace.analyze.views.triage import triage_row
from tests.analyze.fleet.cluster_procs import ROOT, Cluster, dask_processes
from tests.conftest import CORPUS

SCENARIOS = ROOT / "tests" / "fixtures" / "scenarios"
KVTRACE = [sys.executable, "-m", "kvtrace.analyze"]
ALL_LOGS = sorted(str(p) for p in [*CORPUS.glob("*.log"), *SCENARIOS.glob("*.log.gz")])


def kvtrace(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVTRACE, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def two_workers() -> Cluster:
    with dask_processes(workers=2, threads=2) as c:
        yield c


@pytest.fixture
def client(two_workers: Cluster):  # noqa: ANN201
    from distributed import Client

    with Client(two_workers.address, timeout=10, set_as_default=False) as c:
        yield c


def _assert_same_result(a: analyze.ParseResult, b: analyze.ParseResult) -> None:
    for name, frame in a.tables().items():
        pd.testing.assert_frame_equal(frame, b.tables()[name], obj=name)
    assert a.verdict.to_dict() == b.verdict.to_dict()
    assert a.warnings == b.warnings


@pytest.mark.timeout(900)
def test_triage_table_on_the_cluster_equals_the_serial_run(two_workers: Cluster) -> None:
    serial = kvtrace("triage", "--table", "--csv", str(CORPUS), str(SCENARIOS))
    on_cluster = kvtrace("triage", "--table", "--csv", "--scheduler", two_workers.address, str(CORPUS), str(SCENARIOS))
    assert serial.returncode == 0, serial.stderr
    assert (on_cluster.returncode, on_cluster.stdout, on_cluster.stderr) == (0, serial.stdout, serial.stderr)
    assert len(on_cluster.stdout.splitlines()) == 1 + len(ALL_LOGS)


def test_a_big_logs_pieces_run_as_tasks_and_merge_exactly(client) -> None:  # noqa: ANN001
    from distributed import get_task_stream

    logs = [str(SCENARIOS / "draft-simple-4slots.log.gz"), str(SCENARIOS / "draft-dflash-2slots.log.gz"),
            str(CORPUS / "00_beellama-28-multigpu-dflash-seed.log")]
    with get_task_stream(client) as stream:
        got = dask_cluster.map_logs(client, partial(dask_cluster.read, piece_bytes=16 << 10), logs)
    pieces = [t for t in stream.data if "_work" in str(t["key"])]
    assert len(pieces) >= 2 * len(logs)  # every log was cut, and its pieces ran on the cluster
    assert {t["worker"] for t in pieces} == set(client.scheduler_info()["workers"])  # on both workers
    for src, result in zip(logs, got, strict=True):
        _assert_same_result(result, analyze.parse(src))


def test_parse_dataset_on_the_cluster_equals_the_serial_run(two_workers: Cluster, tmp_path: Path) -> None:
    serial, on_cluster = tmp_path / "serial", tmp_path / "cluster"
    r1 = kvtrace("parse", "--dataset", "-o", str(serial), *ALL_LOGS)
    r2 = kvtrace("parse", "--scheduler", two_workers.address, "-o", str(on_cluster), *ALL_LOGS)
    assert (r1.returncode, r2.returncode) == (0, 0), r1.stderr + r2.stderr
    assert (sorted(r1.stdout.replace(str(serial), "DS").splitlines())
            == sorted(r2.stdout.replace(str(on_cluster), "DS").splitlines()))
    for name in TABLES:
        files = sorted(p.name for p in (serial / name).iterdir())
        assert files == sorted(p.name for p in (on_cluster / name).iterdir())
        assert len(files) == len(ALL_LOGS)
        for f in files:
            pd.testing.assert_frame_equal(pd.read_parquet(serial / name / f), pd.read_parquet(on_cluster / name / f))
    # and each log's files hold what `analyze.parse` gives, with its source
    src = str(CORPUS / "00_beellama-28-multigpu-dflash-seed.log")
    errors = pd.read_parquet(on_cluster / "errors" / f"{log_key(src)}.parquet")
    assert set(errors.source) == {src} and len(errors) == 3
    pd.testing.assert_frame_equal(errors.drop(columns="source"), analyze.parse(src).errors)


@pytest.mark.timeout(900)
def test_a_killed_worker_loses_nothing(tmp_path: Path) -> None:
    from distributed import Client

    logs = []
    for k in range(6):  # enough work that the kill lands mid-run
        for src in ALL_LOGS:
            dst = tmp_path / f"copy{k}" / Path(src).name
            dst.parent.mkdir(exist_ok=True)
            shutil.copy(src, dst)
            logs.append(str(dst))
    serial = [triage_row(s) for s in logs]
    with dask_processes(workers=2, threads=1) as c, Client(c.address, timeout=10, set_as_default=False) as client:
        seen: list[int] = []
        killed_at: list[int] = []

        def done(i: int, _: object) -> None:
            seen.append(i)
            if len(seen) == 3:
                c.workers[0].send_signal(signal.SIGKILL)
                c.workers[0].wait(10)
                killed_at.append(len(seen))

        rows = dask_cluster.map_logs(client, partial(triage_row, read=dask_cluster.read), logs, on_done=done)
        assert c.workers[1].poll() is None  # the rest of the work went to the survivor
    # the scheduler's own worker list lags a SIGKILL under load, so the processes are what is checked
    assert c.workers[0].returncode == -signal.SIGKILL
    assert killed_at and killed_at[0] < len(logs)
    assert sorted(seen) == list(range(len(logs)))  # every log once
    assert rows == serial


def test_an_unreachable_scheduler_is_one_line_and_exit_2() -> None:
    port = free_port()
    for args in (["triage", "--table"], ["parse", "-o", "unused-dataset"]):
        r = kvtrace(*args, "--scheduler", f"127.0.0.1:{port}", str(CORPUS))
        assert r.returncode == 2
        assert r.stderr.startswith(f"kvtrace: cannot reach the Dask scheduler at 127.0.0.1:{port}")
        assert len(r.stderr.splitlines()) == 1, r.stderr
    assert not (ROOT / "unused-dataset").exists()


def test_an_unreadable_log_is_a_row_with_its_error(two_workers: Cluster, tmp_path: Path) -> None:
    good = str(CORPUS / "00_beellama-28-multigpu-dflash-seed.log")
    missing = str(tmp_path / "gone.log")
    url = Path(good).as_uri()  # fsspec reads it on the worker
    out = tmp_path / "ds"
    r = kvtrace("parse", "--scheduler", two_workers.address, "-o", str(out), good, missing, url, "nosuch://x/y.log")
    assert r.returncode == 2
    assert [line.split(":")[0] for line in r.stderr.splitlines()] == ["kvtrace", "kvtrace"]
    v = pd.read_parquet(out / "verdicts").set_index("source")
    assert v.loc[missing, "error"] == f"{missing}: no such file; pass a log file, a session folder or - for stdin"
    assert v.loc["nosuch://x/y.log", "error"].startswith("nosuch://x/y.log: cannot read")
    assert pd.isna(v.loc[good, "error"]) and pd.isna(v.loc[url, "error"])
    assert v.loc[url, "kind"] == v.loc[good, "kind"] == analyze.parse(good).verdict.kind
    assert not (out / "batches" / f"{log_key(missing)}.parquet").exists()
    b = pd.read_parquet(out / "batches")
    pd.testing.assert_frame_equal(b[b.source == url].drop(columns="source").reset_index(drop=True),
                                  b[b.source == good].drop(columns="source").reset_index(drop=True))


def test_a_new_log_adds_files_and_rewrites_none(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    first, second = ALL_LOGS[0], ALL_LOGS[1]
    assert kvtrace("parse", "--dataset", "-o", str(out), first).returncode == 0
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")}
    assert len(before) == len(TABLES)
    assert kvtrace("parse", "--dataset", "-o", str(out), second).returncode == 0
    after = {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")}
    assert {p: after[p] for p in before} == before
    assert len(after) == 2 * len(TABLES)


def test_the_dataset_answers_kvtrace_query(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    assert kvtrace("parse", "--dataset", "-o", str(out), *ALL_LOGS).returncode == 0
    r = kvtrace("query", "SELECT source, count(*) AS n FROM batches GROUP BY source ORDER BY source", str(out), "--json")
    assert r.returncode == 0, r.stderr
    got = {row["source"]: row["n"] for row in map(json.loads, r.stdout.splitlines())}
    want = {s: len(analyze.parse(s).batches) for s in ALL_LOGS}
    assert got == {s: n for s, n in want.items() if n}
    sql = ("SELECT source, kind, last_pos AS x, batch_start AS y FROM verdicts WHERE component = 'drafter' "
           "AND last_pos < batch_start ORDER BY source")
    r = kvtrace("query", sql, str(out), "--csv")
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()
    assert rows[0] == "source,kind,x,y"
    wanted = sorted(s for s in ALL_LOGS if (v := analyze.parse(s).verdict).component == "drafter"
                    and v.last_pos is not None and v.batch_start is not None and v.last_pos < v.batch_start)
    assert [row.split(",")[0] for row in rows[1:]] == wanted and wanted
    r = kvtrace("query", "SELECT spec_type, count(*) AS logs FROM verdicts GROUP BY ALL ORDER BY ALL", str(out))
    assert r.returncode == 0 and "spec_type" in r.stdout.splitlines()[0]


def test_query_reads_a_parsed_session_and_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    src = str(CORPUS / "00_beellama-28-multigpu-dflash-seed.log")
    tables = tmp_path / "seed-tables"
    assert kvtrace("parse", src, "-o", str(tables)).returncode == 0
    r = kvtrace("query", "SELECT source, count(*) AS n FROM errors GROUP BY source", str(tables), "--json")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line) for line in r.stdout.splitlines()] == [{"source": "seed-tables",
                                                                     "n": len(analyze.parse(src).errors)}]
    r = kvtrace("query", "SELECT kind FROM verdicts", str(tables), "--csv")
    assert r.stdout.splitlines() == ["kind", analyze.parse(src).verdict.kind]
    for args, start in ((["SELEC nonsense", str(tables)], "kvtrace: query failed: "),
                        (["SELECT 1", str(tmp_path / "none")], f"kvtrace: {tmp_path / 'none'}: no such folder"),
                        (["SELECT 1", str(tmp_path)], f"kvtrace: {tmp_path}: no tables here")):
        r = kvtrace("query", *args)
        assert r.returncode == 2 and r.stderr.startswith(start) and len(r.stderr.splitlines()) == 1, r.stderr


def test_query_is_read_only(tmp_path: Path) -> None:
    """`kvtrace query` could write files (`COPY ... TO`): a statement that writes is refused in one line, and no
    SELECT reads or writes a file outside the tables it was given."""
    src = str(CORPUS / "00_beellama-28-multigpu-dflash-seed.log")
    tables = tmp_path / "seed-tables"
    assert kvtrace("parse", src, "-o", str(tables)).returncode == 0
    before = sorted(p.name for p in tables.iterdir())
    out = tmp_path / "out.csv"
    for sql, kind in ((f"COPY errors TO '{out}'", "COPY"), (f"COPY errors TO '{tables / 'errors.parquet'}'", "COPY"),
                      (f"ATTACH '{tmp_path / 'x.db'}'", "ATTACH"), ("CREATE TABLE t AS SELECT 1", "CREATE"),
                      ("SET enable_external_access = true", "SET"), ("INSTALL httpfs", "LOAD"),
                      (f"SELECT 1; COPY errors TO '{out}'", "COPY")):
        r = kvtrace("query", sql, str(tables))
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, (sql, r.stderr)
        assert r.stderr.startswith(f"kvtrace: query is read-only: only SELECT statements run (this one is {kind}"), \
            r.stderr
    for sql in (f"SELECT * FROM read_csv('{tmp_path / 'x.csv'}')", "SELECT * FROM read_parquet('/etc/hostname')"):
        (tmp_path / "x.csv").write_text("a\n1\n")
        r = kvtrace("query", sql, str(tables))
        assert r.returncode == 2 and r.stderr.startswith("kvtrace: query failed: Permission Error"), r.stderr
    assert not out.exists() and not (tmp_path / "x.db").exists()
    assert sorted(p.name for p in tables.iterdir()) == before
    r = kvtrace("query", "WITH e AS (SELECT * FROM errors) SELECT count(*) AS n FROM e", str(tables), "--csv")
    assert r.returncode == 0 and r.stdout.splitlines() == ["n", str(len(analyze.parse(src).errors))]


def test_without_the_extra_scheduler_and_query_name_it() -> None:
    hide = "import sys; sys.modules.update(distributed=None, duckdb=None); sys.argv[0] = 'kvtrace'; "
    for args in (["triage", "--table", "--scheduler", "127.0.0.1:1", str(CORPUS)], ["query", "SELECT 1", str(CORPUS)]):
        code = hide + f"sys.argv[1:] = {args!r}; from kvtrace.analyze.cli import main; main()"
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 2, r.stderr
        assert "pip install 'kvtrace[cluster]'" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
