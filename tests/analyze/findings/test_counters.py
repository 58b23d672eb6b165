"""The log's draft counts held against the server's /metrics (analyze/findings/counters.py), on small session folders
written the way a capture writes them: raw.log, chunks.parquet, manifest.json and metrics.parquet."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from click.testing import CliRunner

from kvtrace import analyze
from kvtrace.analyze.cli import cli
from kvtrace.analyze.findings.counters import NO_STEPS, PER_REQUEST, PER_STEP, ServerCounters, server_counters
from kvtrace.analyze.reader.session import CHUNKS, KEY_METRICS, METRICS, Session
from kvtrace.analyze.views.report import markdown_report
from kvtrace.capture.metrics import Sample, write_samples

DRAFTS = "llamacpp:spec_decode_num_drafts_total"
TOKENS = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"


def step(i: int, n: int, m: int = 3) -> str:
    return f"0.00.{i:03d}.000 I slot   operator(): id  0 | task 0 | accepted {n:2d}/{m:2d} draft tokens\n"


def per_request(acc: int, gen: int) -> str:
    return (f"0.01.000.000 I slot print_timing: id  0 | task 0 | draft acceptance = {acc / gen:.5f} "
            f"({acc:5d} accepted / {gen:5d} generated), mean len =  1.50\n")


def session(tmp_path: Path, lines: list[str], scrapes: list[tuple[float, int, int, int]], *,
            from_start: bool = True, note: str | None = None, arrivals: list[float] | None = None) -> Path:
    """A session: its log, one chunk per line (arriving at `arrivals`, else all at t=0) and the scrapes
    (t, drafted, accepted, drafts)."""
    folder = tmp_path / "s"
    folder.mkdir()
    data = [line.encode() for line in lines]
    (folder / "raw.log").write_bytes(b"".join(data))
    offsets = [sum(len(d) for d in data[:i]) for i in range(len(data))]
    times = arrivals if arrivals is not None else [0.0] * len(data)
    pd.DataFrame({"t": times, "offset": offsets, "nbytes": [len(d) for d in data]}).to_parquet(folder / CHUNKS)
    write_samples([Sample(t, name, "{}", float(v)) for t, tok, acc, n in scrapes
                   for name, v in ((TOKENS, tok), (ACCEPTED, acc), (DRAFTS, n))], folder / METRICS)
    Session(folder).write_manifest({KEY_METRICS: {"url": "http://127.0.0.1:8080/metrics", "scrapes": len(scrapes),
                                                  "note": note, "from_start": from_start}})
    return folder


def counters(folder: Path) -> ServerCounters:
    c = server_counters(analyze.parse(folder))
    assert c is not None
    return c


def test_per_step_lines_agree_with_the_server(tmp_path: Path) -> None:
    folder = session(tmp_path, [step(1, 2), step(2, 0), step(3, 3), step(4, 1, 1)], [(1.0, 0, 0, 0), (2.0, 10, 6, 4)])
    c = counters(folder)
    assert (c.draft_tokens, c.accepted_tokens, c.drafts) == (
        {"log": 10, "server": 10}, {"log": 6, "server": 6}, {"log": 4, "server": 4})
    assert c.agree is True and c.window == "whole run" and c.log_source == PER_STEP and c.notes == []
    assert c.disagreements() == []


def test_a_log_missing_lines_disagrees_and_the_report_says_so(tmp_path: Path) -> None:
    folder = session(tmp_path, [step(1, 2), step(2, 0)], [(2.0, 10, 6, 4)])
    c = counters(folder)
    assert c.agree is False
    assert c.disagreements() == ["draft tokens: log 6, server 10", "accepted tokens: log 2, server 6",
                                 "drafts: log 2, server 4"]
    report = markdown_report(analyze.parse(folder))
    assert ("**Server counters disagree:** the server's /metrics and the log count different drafts (draft tokens: "
            "log 6, server 10; accepted tokens: log 2, server 6; drafts: log 2, server 4).") in report
    assert "| server counters (/metrics) | 10 drafted, 6 accepted, 4 drafts (whole run); the log disagrees |" in report


def test_an_agreeing_session_has_no_finding(tmp_path: Path) -> None:
    folder = session(tmp_path, [step(1, 2)], [(2.0, 3, 2, 1)])
    report = markdown_report(analyze.parse(folder))
    assert "disagree" not in report
    assert "| server counters (/metrics) | 3 drafted, 2 accepted, 1 drafts (whole run); the log agrees |" in report


def test_per_request_lines_count_tokens_not_steps(tmp_path: Path) -> None:
    folder = session(tmp_path, [per_request(5, 12), per_request(1, 9)], [(2.0, 21, 6, 8)])
    c = counters(folder)
    assert c.log_source == PER_REQUEST and c.notes == [NO_STEPS]
    assert c.draft_tokens == {"log": 21, "server": 21} and c.drafts == {"log": None, "server": 8}
    assert c.agree is True  # over what both count


def test_the_v_wording_alone_is_not_compared(tmp_path: Path) -> None:
    line = "0.00.001.000 D slot   operator(): id  0 | task 0 | accepted 2/3 draft tokens, new n_tokens = 27\n"
    c = counters(session(tmp_path, [line], [(2.0, 6, 4, 2)]))
    assert c.log_source is None and c.agree is None and c.draft_tokens == {"log": None, "server": 6}
    assert c.notes[0].startswith(NO_STEPS)


def test_attached_late_compares_the_window_the_scrapes_cover(tmp_path: Path) -> None:
    # the first two steps came before the first scrape (the server had counted them: 6 drafted, 2 accepted)
    lines = [step(1, 2), step(2, 0), step(3, 3), step(4, 1)]
    folder = session(tmp_path, lines, [(10.0, 6, 2, 2), (20.0, 12, 6, 4)], from_start=False,
                     arrivals=[5.0, 9.0, 12.0, 15.0])
    c = counters(folder)
    assert c.window == "from the first scrape" and c.agree is True
    assert c.draft_tokens == {"log": 6, "server": 6} and c.accepted_tokens == {"log": 4, "server": 4}
    assert c.drafts == {"log": 2, "server": 2}


def test_a_server_that_stopped_answering_is_compared_up_to_its_last_scrape(tmp_path: Path) -> None:
    lines = [step(1, 2), step(2, 0), step(3, 3)]
    folder = session(tmp_path, lines, [(10.0, 6, 2, 2)], note="the program ended: ...", arrivals=[5.0, 9.0, 30.0])
    c = counters(folder)
    assert c.window == "up to the last scrape" and c.agree is True and c.drafts == {"log": 2, "server": 2}
    assert c.notes[-1] == "the scraping ended early: the program ended: ..."


def test_no_metrics_no_counters(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text(step(1, 2))
    assert server_counters(analyze.parse(log)) is None


def test_triage_json_carries_server_counters(tmp_path: Path) -> None:
    folder = session(tmp_path, [step(1, 2)], [(2.0, 3, 2, 1)])
    other = tmp_path / "plain.log"
    other.write_text(step(1, 2))
    out = CliRunner().invoke(cli, ["triage", "--json", str(folder), str(other)])
    assert out.exit_code == 0, out.output
    first, second = (json.loads(line) for line in out.output.splitlines())
    assert first["server_counters"] == {
        "draft_tokens": {"log": 3, "server": 3}, "accepted_tokens": {"log": 2, "server": 2},
        "drafts": {"log": 1, "server": 1}, "agree": True, "window": "whole run", "log_source": PER_STEP, "notes": []}
    assert second["server_counters"] is None


def test_a_note_in_the_report_is_escaped(tmp_path: Path) -> None:
    line = "0.00.001.000 D slot   operator(): id  0 | task 0 | accepted 2/3 draft tokens, new n_tokens = 27\n"
    folder = session(tmp_path, [line], [(2.0, 6, 4, 2)], note="the server stopped answering http://h/<b>x</b>_y_")
    report = markdown_report(analyze.parse(folder))
    row = next(r for r in report.splitlines() if r.startswith("| server counters"))
    assert "not compared" in row and "the scraping ended early: the server stopped answering" in row
    assert "<b>" not in row and r"\<b\>x\</b\>\_y\_" in row
