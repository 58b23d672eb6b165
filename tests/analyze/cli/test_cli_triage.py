"""kvtrace report / compare / export / triage --table, through click's runner (exact output where it is
practical), on corpus reports and engine captures."""

from __future__ import annotations

import csv
import html
import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtrace import analyze
from kvtrace.analyze.cli import cli
from kvtrace.analyze.reader.session import new_session
from kvtrace.capture.engine import EngineConfig, run_engine
from tests.analyze.views.test_report import _fenced_blocks, _outside_fences
from tests.conftest import CORPUS

SEED = CORPUS / "00_beellama-28-multigpu-dflash-seed.log"


def run(*args: str, input: bytes | None = None) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), input=input)
    return r.exit_code, r.stdout, r.stderr


# ---- triage --table -----------------------------------------------------------------------------------

def _rows(md: str) -> list[list[str]]:
    lines = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| cluster")]
    return [[c.strip().replace("\\", "") for c in line.strip("|").split("|")] for line in lines]


def test_triage_table_exact_output() -> None:
    names = ["00_beellama-28-multigpu-dflash-seed.log", "13_llamacpp-4185-docker-compose-kv-free-space.log",
             "16_club3090-1106-deepseek-draft-acceptance-OK.log", "01_beellama-27-dflash-drafter-consecutive.log"]
    code, out, _ = run("triage", "--table", *(str(CORPUS / n) for n in names))
    assert code == 0
    assert out == (
        "4 reports, 3 clusters\n\n"
        "| cluster | report | signature | side | key | kind | proof | seq_id | x | y | position_errors | failures "
        "| spec_type | build | gpus | acceptance | failure |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        "| 1 | 00\\_beellama-28-multigpu-dflash-seed.log | stale\\_drafter\\_kv | drafter | consecutive | "
        "inconsistent\\_positions | log | 0 | 259 | 1361 | 3 | 3 | draft-dflash | 9459-07ac3cec6 | 2 |  |  |\n"
        "| 1 | 01\\_beellama-27-dflash-drafter-consecutive.log | stale\\_drafter\\_kv | drafter | consecutive | "
        "inconsistent\\_positions | log | 0 | 587 | 641 | 3 | 3 | draft-dflash |  |  |  |  |\n"
        "| 2 | 13\\_llamacpp-4185-docker-compose-kv-free-space.log | kv\\_cache\\_full | target | no\\_free\\_space | "
        "kv\\_slot | log |  |  |  | 0 | 1 |  |  |  |  |  |\n"
        "| 3 | 16\\_club3090-1106-deepseek-draft-acceptance-OK.log | healthy\\_speculative | unknown |  | "
        "draft\\_stats\\_only | log |  |  |  | 0 | 0 |  |  |  | 74.0% |  |\n"
    )


def test_triage_table_says_what_each_verdict_stands_on(tmp_path: Path) -> None:
    """The `proof` column (issue 36): `runtime` for a wrapper's own log words (ollama's runner line), `prose` for
    the issue's one sentence, and empty where there is neither a failure nor a log line."""
    (tmp_path / "prose.md").write_text("The model crashes after a few requests.\n", encoding="utf-8")
    (tmp_path / "runtime.log").write_text(
        "Error: llama runner process has terminated: signal: aborted (core dumped)\n", encoding="utf-8")
    (tmp_path / "nothing.txt").write_text("Thanks, I will try the new build tomorrow.\n", encoding="utf-8")
    code, out, _ = run("triage", "--table", *(str(tmp_path / n) for n in ("prose.md", "runtime.log", "nothing.txt")))
    assert code == 0
    assert out == (
        "3 reports, 3 clusters\n\n"
        "| cluster | report | signature | side | key | kind | proof | seq_id | x | y | position_errors | failures "
        "| spec_type | build | gpus | acceptance | failure |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        "| 1 | prose.md | told\\_in\\_prose | unknown | other | other | prose |  |  |  | 0 | 1 |  |  |  |  |  |\n"
        "| 2 | runtime.log | abort\\_outside\\_speculation | target | concept\\_crash\\_signal | other | runtime |  |  |  "
        "| 0 | 1 |  |  |  |  | concept\\_crash\\_signal |\n"
        "| 3 | nothing.txt | unclassified | unknown | no\\_log | no\\_log |  |  |  |  | 0 | 0 |  |  |  |  |  |\n"
    )
    code, csv_out, _ = run("triage", "--csv", str(tmp_path / "runtime.log"))
    assert code == 0 and next(csv.DictReader(io.StringIO(csv_out)))["proof"] == "runtime"


def test_triage_table_over_the_corpus_folder_clusters_each_bug() -> None:
    code, out, _ = run("triage", "--table", str(CORPUS))
    assert code == 0
    rows = _rows(out)
    assert len(rows) == len(list(CORPUS.glob("*.log")))
    order = [r[1][:2] for r in rows]
    cluster = {r[1][:2]: r[0] for r in rows}
    signature = {r[1][:2]: r[2] for r in rows}

    def together(ids: list[str], sig: str) -> None:
        assert {signature[i] for i in ids} == {sig}
        assert len({cluster[i] for i in ids}) == 1
        at = sorted(order.index(i) for i in ids)
        assert at == list(range(at[0], at[0] + len(ids))), f"{ids} are not adjacent: {order}"

    together(["00", "01"], "stale_drafter_kv")
    together(["13", "33"], "kv_cache_full")
    together(["16", "18", "30", "31"], "healthy_speculative")
    together(["03", "21"], "mrope_position_order")
    assert signature[order[0]] == "stale_drafter_kv"  # the most specific signature leads
    # cluster numbers run 1, 2, ... down the table
    nums = [int(r[0]) for r in rows]
    assert nums == sorted(nums) and nums[0] == 1


def test_triage_csv_and_jobs_give_the_same_rows() -> None:
    code1, serial, _ = run("triage", "--csv", str(CORPUS))
    code2, parallel, _ = run("triage", "--table", "--csv", "--jobs", "2", str(CORPUS))
    assert code1 == code2 == 0 and serial == parallel
    rows = list(csv.DictReader(io.StringIO(serial)))
    by_name = {r["report"][:2]: r for r in rows}
    assert by_name["00"]["signature"] == "stale_drafter_kv" and by_name["00"]["x"] == "259"
    assert by_name["16"]["acceptance"] == "0.73953"


def test_triage_table_unreadable_input_exits_2_and_keeps_the_rest(tmp_path: Path) -> None:
    code, out, err = run("triage", "--table", str(SEED), str(tmp_path / "missing.log"))
    assert code == 2
    assert "missing.log" in err and "Traceback" not in err
    assert out.startswith("1 report, 1 cluster\n")


def test_triage_json_output_is_unchanged_by_the_table_options() -> None:
    code, out, _ = run("triage", "--json", str(SEED))
    assert code == 0
    v = json.loads(out)
    assert v["kind"] == "inconsistent_positions" and "signature" not in v


def test_triage_bad_jobs_is_a_usage_error() -> None:
    code, _, err = run("triage", "--table", "--jobs", "0", str(SEED))
    assert code == 2 and "--jobs" in err


# ---- report -------------------------------------------------------------------------------------------

def test_report_markdown_sections() -> None:
    code, md, _ = run("report", str(SEED))
    assert code == 0
    assert md.startswith("### kvtrace triage: 00\\_beellama-28-multigpu-dflash-seed.log\n")
    assert "**Signature:** `stale_drafter_kv` (Stale drafter KV cache)" in md
    assert "| line | target stored max | drafter stored max | drafter - target | batch start Y | note |" in md
    assert "| 147 | n/a | 259 |  | 1361 | refused batch, first divergence |" in md
    assert "**Next steps:**" in md and "- Known fix: beellama.cpp v0.3.0" in md
    env = next(body for _, body in _fenced_blocks(md) if "build: 9459-07ac3cec6" in body)
    assert "GPUs: 2" in env and "spec type: draft-dflash" in env
    assert "decode failed" not in _outside_fences(md)


def test_report_html_escapes_everything_from_the_log(tmp_path: Path) -> None:
    evil = "dflash: drafter decode failed with -1 </code></pre><script>alert(1)</script> **x** ```"
    log = tmp_path / "evil.log"
    log.write_text(SEED.read_text(encoding="utf-8").replace("dflash: drafter decode failed with -1", evil))
    out = tmp_path / "r.html"
    code, stdout, _ = run("report", str(log), "--format", "html", "-o", str(out))
    assert code == 0 and stdout == ""
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>") and "<script>" not in page and "</code></pre><script>" not in page
    assert html.escape(evil) in page
    # the same report in Markdown keeps it inside a longer fence
    _, md, _ = run("report", str(log))
    assert "<script>" not in _outside_fences(md)


@pytest.mark.engine
def test_report_on_a_session_is_named_by_its_folder(captures: dict[str, Path]) -> None:
    code, md, _ = run("report", str(captures["stale-drafter"]))
    assert code == 0 and md.startswith(f"### kvtrace triage: {captures['stale-drafter'].name}\n")
    assert "**Signature:** `stale_drafter_kv`" in md and "| drafter in step (cycles) |" in md


def test_report_from_stdin_and_bad_input() -> None:
    code, md, _ = run("report", "-", input=SEED.read_bytes())
    assert code == 0 and md.startswith("### kvtrace triage: stdin\n")
    code, out, err = run("report", "no-such-file.log")
    assert code == 2 and out == "" and err.count("\n") == 1 and "no-such-file.log" in err


# ---- compare and export on engine captures --------------------------------------------------------------

@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for fault in ("none", "stale-drafter"):
        path = tmp_path_factory.mktemp(fault)
        run_engine(EngineConfig(fault=fault, requests=3, cycles=24), new_session("engine", out=path))
        out[fault] = path
    return out


@pytest.mark.engine
def test_compare_stale_drafter_then_fixed(captures: dict[str, Path]) -> None:
    a, b = str(captures["stale-drafter"]), str(captures["none"])
    code, out, _ = run("compare", a, b, "--json")
    assert code == 0
    c = json.loads(out)
    assert c["verdict"] == "fixed"
    assert c["a"]["n_position_errors"] > 0 and c["b"]["n_position_errors"] == 0
    assert c["a"]["drafter_in_step"] is False and c["b"]["drafter_in_step"] is True
    assert c["b"]["target_max"] == c["b"]["drafter_max"]  # back in step after the last cycle
    assert c["a"]["signature"] == "stale_drafter_kv" and c["b"]["signature"] == "healthy_speculative"
    code, text, _ = run("compare", a, b)
    assert code == 0
    assert text.splitlines()[:4] == [f"A: {a}  (stale_drafter_kv)", f"B: {b}  (healthy_speculative)",
                                     "verdict: fixed: A fails, B does not",
                                     "the drafter is back in step with the target in B"]
    assert re.search(r"drafter: out of step \(\d+\.\d% of \d+ cycles\) -> in step \(100\.0% of \d+ cycles\)", text)


@pytest.mark.engine
@pytest.mark.parametrize(("a", "b", "verdict", "code"), [
    ("none", "stale-drafter", "regressed", 1),
    ("stale-drafter", "stale-drafter", "still_failing", 1),
    ("none", "none", "unchanged", 0),
])
def test_compare_verdicts_and_exit_codes(captures: dict[str, Path], a: str, b: str, verdict: str, code: int) -> None:
    got, out, _ = run("compare", "--json", str(captures[a]), str(captures[b]))
    assert got == code and json.loads(out)["verdict"] == verdict


def test_compare_help_documents_exit_codes_and_bad_input_is_2() -> None:
    _, out, _ = run("compare", "--help")
    assert "still_failing  both fail                     exit 1" in out
    code, _, err = run("compare", str(SEED), "missing.log")
    assert code == 2 and "missing.log" in err


def _check_trace(path: Path) -> dict:
    data = json.loads(path.read_text(encoding="utf-8"))
    events = data["traceEvents"]
    assert {e["ph"] for e in events} >= {"C", "i"}
    tracks: dict[tuple, list[float]] = {}
    for e in events:
        if e["ph"] == "M":
            continue
        assert isinstance(e["ts"], float) and e["pid"] == 1
        key = (e["ph"], e["name"]) if e["ph"] == "C" else (e["ph"], e["tid"])
        tracks.setdefault(key, []).append(e["ts"])
    for key, ts in tracks.items():
        assert ts == sorted(ts), f"time goes back on {key}"
    return data


@pytest.mark.engine
def test_export_perfetto_engine_capture(captures: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    code, _, err = run("export", str(captures["stale-drafter"]), "--perfetto", str(out))
    assert code == 0 and err.startswith(f"{out}: ")
    data = _check_trace(out)
    events = data["traceEvents"]
    names = {e["name"] for e in events if e["ph"] == "C"}
    assert names == {"target pos", "drafter pos"}
    failures = [e for e in events if e["ph"] == "i" and e["cat"] == "failure"]
    assert len(failures) == len(analyze.parse(captures["stale-drafter"]).errors)  # one per refused batch
    assert all(e["tid"] == 2 and e["args"]["X"] is not None for e in failures)
    assert any(e["cat"] == "reset" for e in events if e["ph"] == "i")
    assert data["otherData"]["clock"] == "log_time"


def test_export_perfetto_without_timestamps_uses_line_numbers(tmp_path: Path) -> None:
    out = tmp_path / "seed.json"
    code, _, _ = run("export", str(SEED), "--perfetto", str(out))
    assert code == 0
    data = _check_trace(out)
    assert data["otherData"]["clock"] == "line"
    drafter = [e for e in data["traceEvents"] if e["ph"] == "C" and e["name"] == "drafter pos"]
    assert [(e["ts"], e["args"]["seq 0"]) for e in drafter] == [(147.0, 259.0), (154.0, 259.0)]
    instants = [e for e in data["traceEvents"] if e["ph"] == "i"]
    assert [e["ts"] for e in instants] == [142.0, 147.0, 154.0]
