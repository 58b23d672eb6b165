"""Acceptance over time, per draft position, per request and per slot (analyze/findings/acceptance.py), on small logs and
session folders written the way a capture writes them, and on a real llama-server capture; its report section."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kvtrace import analyze
from kvtrace.analyze.findings.acceptance import PER_POS, acceptance
from kvtrace.analyze.reader.session import CHUNKS, KEY_METRICS, METRICS, Session
from kvtrace.analyze.views.acceptance import over_time_figure, per_position_figure, per_request_figure
from kvtrace.analyze.views.report import markdown_report
from kvtrace.capture.metrics import Sample, write_samples
from tests.analyze.findings.test_counters import ACCEPTED, DRAFTS, TOKENS

ROOT = Path(__file__).resolve().parents[3]
FOURSLOTS = ROOT / "tests" / "fixtures" / "scenarios" / "draft-simple-4slots.log.gz"


def step(second: int, slot: int, task: int, n: int, m: int = 3) -> str:
    return f"0.{second:02d}.000.000 I slot   operator(): id  {slot} | task {task} | accepted {n:2d}/{m:2d} draft tokens\n"


def per_request(second: int, slot: int, task: int, acc: int, gen: int) -> str:
    return (f"0.{second:02d}.500.000 I slot print_timing: id  {slot} | task {task} | draft acceptance = "
            f"{acc / gen:.5f} ({acc:5d} accepted / {gen:5d} generated), mean len =  1.50\n")


# two slots: slot 0 runs task 0 (1 s to 3 s, 5 of 9 accepted), slot 1 task 1 (2 s to 10 s, 1 of 6)
LINES = [step(1, 0, 0, 2), step(2, 1, 1, 0), step(2, 0, 0, 3), step(3, 0, 0, 0), per_request(3, 0, 0, 5, 9),
         step(9, 1, 1, 1), per_request(10, 1, 1, 1, 6)]


def test_per_position_is_the_share_of_drafts_accepted_to_there(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(LINES))
    acc = acceptance(analyze.parse(log))
    # accepted 2, 0, 3, 0, 1 of five drafts of 3: positions 1, 2, 3 reached by 3, 2, 1 drafts
    assert acc.per_position == [3 / 5, 2 / 5, 1 / 5]
    assert acc.steps == 5 and acc.clock == "log" and acc.server_over_time is None


def test_per_request_and_per_slot_with_the_worst_and_the_slowest(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(LINES))
    acc = acceptance(analyze.parse(log))
    r = acc.requests
    assert list(zip(r["slot"], r["task"], r["drafted"], r["accepted"], strict=True)) == [(0, 0, 9, 5), (1, 1, 6, 1)]
    assert r["seconds"].round(3).tolist() == [2.5, 8.5]  # first line to the per-request line
    assert acc.worst()["task"].tolist() == [1, 0] and acc.slowest()["task"].tolist() == [1, 0]
    s = acc.slots
    assert s["slot"].tolist() == [0, 1] and s["requests"].tolist() == [1, 1]
    assert s["rate"].round(4).tolist() == [round(5 / 9, 4), round(1 / 6, 4)]


def test_a_request_without_its_per_request_line_sums_its_steps(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(LINES[:4]))
    r = acceptance(analyze.parse(log)).requests
    assert list(zip(r["task"], r["drafted"], r["accepted"], strict=True)) == [(0, 9, 5), (1, 3, 0)]


def test_over_time_buckets_the_steps(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(LINES))
    over = acceptance(analyze.parse(log)).log_over_time
    assert over["drafted"].sum() == 15 and over["accepted"].sum() == 6
    first, last = over.iloc[0], over.iloc[-1]
    assert (first["accepted"], first["drafted"]) == (2, 3)  # the step at 1 s alone in the first bucket
    assert (last["accepted"], last["drafted"]) == (1, 3) and last["t"] > 8.9


def _session(tmp_path: Path) -> Path:
    """A capture's session of LINES: each line arrives 1 s after the capture began (t=100), scraped at 101,
    105 and 111 s."""
    folder = tmp_path / "s"
    folder.mkdir()
    data = [line.encode() for line in LINES]
    (folder / "raw.log").write_bytes(b"".join(data))
    offsets = [sum(len(d) for d in data[:i]) for i in range(len(data))]
    arrivals = [101.0 + int(line[2:4]) for line in LINES]  # the log's second, on the capture's clock
    pd.DataFrame({"t": arrivals, "offset": offsets, "nbytes": [len(d) for d in data]}).to_parquet(folder / CHUNKS)
    scrapes = [(100.0, 0, 0, 0), (105.0, 9, 5, 3), (111.0, 15, 6, 5)]
    samples = [Sample(t, name, "{}", float(v)) for t, tok, acc, n in scrapes
               for name, v in ((TOKENS, tok), (ACCEPTED, acc), (DRAFTS, n))]
    samples += [Sample(111.0, PER_POS, f'{{"position": "{k}"}}', float(v)) for k, v in enumerate((3, 2, 1))]
    write_samples(samples, folder / METRICS)
    Session(folder).write_manifest({KEY_METRICS: {"url": "http://127.0.0.1:8080/metrics", "scrapes": 3,
                                                  "note": None, "from_start": True}})
    return folder


def test_the_counters_over_time_and_per_position_on_the_captures_clock(tmp_path: Path) -> None:
    acc = acceptance(analyze.parse(_session(tmp_path)))
    assert acc.clock == "capture"
    server = acc.server_over_time
    assert server is not None
    # what the counters added between scrapes, at the scrape, seconds from the first scrape
    assert server["t"].tolist() == [5.0, 11.0]
    assert server["drafted"].tolist() == [9.0, 6.0] and server["accepted"].tolist() == [5.0, 1.0]
    assert acc.server_per_position == [3 / 5, 2 / 5, 1 / 5] == acc.per_position
    # the log's steps on the same clock: the first step arrived 2 s after the first scrape
    assert acc.log_over_time["t"].iloc[0] == pytest.approx(2.0, abs=0.2)
    assert acc.requests["t_start"].tolist() == [2.0, 3.0]


def test_the_figures_draw_the_log_and_the_counters(tmp_path: Path) -> None:
    acc = acceptance(analyze.parse(_session(tmp_path)))
    over, pos, req = over_time_figure(acc), per_position_figure(acc), per_request_figure(acc)
    assert over is not None and pos is not None and req is not None
    assert [t.name for t in over.data] == ["log (verify steps)", "server counters (/metrics)"]
    assert list(over.data[1].y) == [5 / 9, 1 / 6]
    assert [t.name for t in pos.data] == ["log (verify steps)", "server counters (/metrics)"]
    assert [t.name for t in req.data] == ["slot 0", "slot 1"]
    assert sum(sum(t.y) for t in req.data) == 2  # two requests


def test_a_log_without_acceptance_lines_has_no_section(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("0.00.001.000 I srv  main: server is listening on http://127.0.0.1:8080\n")
    acc = acceptance(analyze.parse(log))
    assert acc.empty and over_time_figure(acc) is None and per_request_figure(acc) is None
    assert "**Acceptance**" not in markdown_report(analyze.parse(log))


def test_the_report_shows_acceptance_over_time_per_position_per_slot_and_request(tmp_path: Path) -> None:
    report = markdown_report(analyze.parse(_session(tmp_path)))
    section = report[report.index("**Acceptance**"):]
    assert "| over time, log (5 equal stretches of the capture's clock) | 56% → 0% → - → - → 33% |" in section
    assert "| over time, server counters (5 equal stretches) | 56% → - → - → - → 17% |" in section
    assert "| per draft position, log | 60%, 40%, 20% |" in section
    assert "| per draft position, server counters | 60%, 40%, 20% |" in section
    assert "| 0 | 1 | 9 | 5 | 56% |" in section and "| 1 | 1 | 6 | 1 | 17% |" in section
    worst = section[section.index("Lowest acceptance (of 2 requests):"):section.index("Slowest")]
    # seconds on the log's own clock (the per-request line is half a second after the step that arrived with it)
    assert worst.index("| 1 | 1 | 2 | 8.500 | 6 | 1 | 17% |") < worst.index("| 0 | 0 | 1 | 2.500 | 9 | 5 | 56% |")


def test_a_real_capture_per_slot_matches_its_per_request_lines() -> None:
    """draft-simple, four slots (llama-server b11434): every request's counts are the server's own per-request
    line, its steps sum to the same, and per position they are that line's `acc per pos`."""
    result = analyze.parse(FOURSLOTS)
    acc = acceptance(result)
    ev = result.events
    own = ev[ev["pattern"] == "draft_acceptance"]
    assert len(acc.requests) == len(own) == 8 and sorted(acc.slots["slot"]) == [0, 1, 2, 3]
    assert int(acc.requests["drafted"].sum()) == int(own["generated"].sum())
    assert int(acc.requests["accepted"].sum()) == int(own["accepted"].sum())
    assert acc.slots["requests"].tolist() == [2, 2, 2, 2]
    steps = ev[(ev["kind"] == "accepted") & ev["pos"].isna()]
    first = acc.requests.iloc[0]
    mine = steps[(steps["slot"] == first["slot"]) & (steps["task"] == first["task"])]
    assert int(mine["generated"].sum()) == first["drafted"] and int(mine["accepted"].sum()) == first["accepted"]
    printed = ev[(ev["pattern"] == "acc_per_pos") & (ev["slot"] == first["slot"]) & (ev["task"] == first["task"])]
    from kvtrace.analyze.findings.acceptance import _per_position

    shares = [float(v) for v in printed["detail"].iloc[0].split('"acc_per_pos": "')[1].split('"')[0].split(",")]
    assert [round(v, 3) for v in _per_position(mine)] == shares
