"""Lines of builds newer than b11434 and b11434's own (docs/llama-cpp-lines.md#newer-builds-and-forks), read end
to end: llama.cpp trimming a stale drafter itself (stale_trims, a healthy verdict that says so), synthetic
acceptance, the DFlash clamps and rejected rows, adaptive MTP depth per slot over time, and the four wordings of
the acceptance line.

The logs are built line by line to the formats that page gives (`spec %12.*s: ` prefixes, llama.cpp's
timestamps); each line is also an example of its entry in analyze/reader/patterns.py, which
tests/analyze/reader/test_patterns.py holds to it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtrace import analyze
from kvtrace.analyze.cli import cli
from kvtrace.analyze.findings.cycles import cycle_stats, depth_series
from kvtrace.analyze.views.report import headline, markdown_report

ROOT = Path(__file__).resolve().parents[3]
HEALTHY = ROOT / "tests" / "fixtures" / "scenarios" / "draft-simple-1slot.log.gz"

START = [
    "0.00.074.655 I spec common_specu: adding speculative implementation 'draft-simple'",
    "0.01.099.220 I slot   operator(): id  0 | task 0 | new prompt, n_ctx_slot = 512, n_keep = 0, task.n_tokens = 24",
    "0.01.116.440 I slot   operator(): id  0 | task 0 | accepted  1/ 3 draft tokens",
]
MIRROR_TRIM = ("0.02.113.410 W spec continues_dr: seq 0: stale draft memory (ends at 259, target rows start at 200), "
               "trimming")
MTP_TRIM = ("0.02.113.411 W spec flush_deferr: stale draft KV for seq 1 at deferred flush: pos_max 41 >= flush start 38, "
            "trimming")
STATS = ("0.03.172.204 I slot print_timing: id  0 | task 0 | draft acceptance = 0.50000 (    3 accepted /     6 generated),"
         " mean len =  2.00")
POSITION_ERROR = [
    "3.28.378.761 E init: the tokens of sequence 0 in the input batch have inconsistent sequence positions:",
    " - the last position stored in the memory module of the context (i.e. the KV cache) for sequence 0 is X = 259",
    " - the tokens for sequence 0 in the input batch have a starting position of Y = 1361",
    " it is required that the sequence positions remain consecutive: Y = X + 1",
    "3.28.378.763 E decode: failed to initialize batch",
    "3.28.378.764 E llama_decode: failed to decode, ret = -1",
]


def with_trims(tmp_path: Path, n: int = 2) -> Path:
    """A real healthy b11434 capture with `n` of the draft mirror's trim warnings put after its first verify steps,
    as a newer build prints them (each with the timestamp of the line before it): a run that llama.cpp repaired."""
    lines = gzip.decompress(HEALTHY.read_bytes()).split(b"\n")  # bytes: a tiny model's pieces are not all UTF-8
    steps = [i for i, line in enumerate(lines) if b"draft tokens" in line and b"accepted" in line][:n]
    for k, i in reversed(list(enumerate(steps))):  # from the end, so the earlier indices still hold
        stamp = lines[i].split(b" ", 1)[0]
        lines.insert(i + 1, stamp + f" W spec continues_dr: seq 0: stale draft memory (ends at {40 + k}, target rows "
                                    f"start at {30 + k}), trimming".encode())
    path = tmp_path / "trimmed.log"
    path.write_bytes(b"\n".join(lines))
    return path


def _log(tmp_path: Path, lines: list[str], name: str = "server.log") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _triage_json(path: Path) -> dict:
    r = CliRunner().invoke(cli, ["triage", "--json", str(path)])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


# ---- llama.cpp trims a stale drafter itself (#stale-draft-trims) ---------------------------------------------

def test_trims_are_listed_and_the_run_reads_healthy_and_repaired(tmp_path: Path) -> None:
    path = _log(tmp_path, [*START, MIRROR_TRIM, "0.02.200.000 I slot   operator(): id  0 | task 0 | accepted  2/ 3 draft "
                           "tokens", MTP_TRIM, STATS])
    v = _triage_json(path)
    assert v["stale_trims"] == [{"line": 4, "seq_id": 0, "last_pos": 259, "batch_start": 200},
                                {"line": 6, "seq_id": 1, "last_pos": 41, "batch_start": 38}]
    assert v["kind"] == "draft_stats_only" and v["n_errors"] == 0
    assert "The drafter's memory was stale and llama.cpp trimmed it 2 times, first at X = 259 / Y = 200" in v["summary"]
    result = analyze.parse(path)
    assert headline(result) == "Healthy, drafter memory trimmed 2 times"
    report = markdown_report(result)
    assert "**Healthy, drafter memory trimmed 2 times**" in report and "failing side: **none**" in report
    assert "| drafter memory found stale and trimmed by llama.cpp | 2 |" in report
    text = CliRunner().invoke(cli, ["triage", str(path)]).stdout
    assert "trims:    the drafter's stale memory trimmed 2 times by llama.cpp (first at line 4)" in text


def test_a_real_capture_with_trims_reads_healthy_and_repaired(tmp_path: Path) -> None:
    result = analyze.parse(with_trims(tmp_path))
    assert [(t["seq_id"], t["last_pos"], t["batch_start"]) for t in result.verdict.stale_trims] == [(0, 40, 30),
                                                                                                    (0, 41, 31)]
    assert result.verdict.kind == "draft_stats_only" and not len(result.errors)
    assert headline(result) == "Healthy, drafter memory trimmed 2 times"


def test_one_trim_without_draft_statistics_still_reads_healthy(tmp_path: Path) -> None:
    result = analyze.parse(_log(tmp_path, [START[0], MIRROR_TRIM]))
    v = result.verdict
    assert v.kind == "draft_stats_only" and not len(result.errors)
    assert "trimmed it once, at X = 259 / Y = 200 (sequence 0, line 2" in v.summary
    assert headline(result) == "Healthy, drafter memory trimmed 1 time"


def test_a_healthy_run_without_trims_keeps_the_plain_headline() -> None:
    result = analyze.parse(HEALTHY)
    assert result.verdict.stale_trims == []
    assert headline(result) == "Healthy"
    assert "**Healthy**" in markdown_report(result)


def test_trims_beside_a_failure_are_listed_and_the_failure_decides(tmp_path: Path) -> None:
    v = _triage_json(_log(tmp_path, [*START, MIRROR_TRIM, *POSITION_ERROR]))
    assert v["kind"] == "inconsistent_positions" and (v["last_pos"], v["batch_start"]) == (259, 1361)
    assert [t["line"] for t in v["stale_trims"]] == [4]
    result = analyze.parse(_log(tmp_path, [*START, MIRROR_TRIM, *POSITION_ERROR], "failed.log"))
    assert headline(result) == "Verdict: inconsistent positions"
    assert "**Healthy" not in markdown_report(result)


def test_a_trim_that_fails_is_a_drafter_failure(tmp_path: Path) -> None:
    result = analyze.parse(_log(tmp_path, [*START, "0.02.000.000 E spec flush_deferr: failed to trim draft memory for "
                                           "sequence 0"]))
    assert len(result.errors) == 1 and result.errors.iloc[0]["component"] == "drafter"
    assert result.verdict.kind == "other" and result.verdict.stale_trims == []


def test_the_mirror_giving_a_sequence_up_is_an_event_not_a_failure(tmp_path: Path) -> None:
    lines = [*START,
             "0.02.113.410 W spec continues_dr: seq 0: the draft memory cannot be trimmed, the sequence is not mirrored",
             "0.02.113.411 D spec continues_dr: seq 0: draft memory ends at 150, target rows start at 200, not mirrored",
             "0.02.113.412 W spec report_rejec: seq 0: the draft cannot take token 151900 (outside the draft vocab), the "
             "sequence is not mirrored while its draft memory lags the target",
             "0.02.113.413 D spec report_rejec: seq 0: token 151900 rejected by the draft again", STATS]
    result = analyze.parse(_log(tmp_path, lines))
    ev = result.events[result.events["kind"] == "not_mirrored"]
    assert list(ev["pattern"]) == ["draft_not_trimmable", "draft_not_mirrored", "draft_outside_vocab",
                                   "draft_rejected_again"]
    assert set(ev["seq_id"]) == {0} and set(ev["context"].astype(str)) == {"drafter"}
    assert result.verdict.kind == "draft_stats_only" and not len(result.errors)
    assert "| times the draft mirror gave a sequence up (not mirrored) | 4 |" in markdown_report(result)


# ---- synthetic acceptance (b11434, #synthetic-acceptance) -----------------------------------------------------

SYNTHETIC = [
    "0.00.078.200 W spec common_specu: synthetic speculative acceptance is enabled for benchmarking; generated output "
    "is not valid",
    "0.00.078.206 I spec common_specu: synthetic acceptance: n_max = 3, mean length = 2.000000, rates = [0.543689, "
    "0.295598, 0.160713]",
]


@pytest.mark.parametrize("marker", ["lines", "flag"])
def test_synthetic_acceptance_is_never_the_drafters(tmp_path: Path, marker: str) -> None:
    """Either witness is enough: the server's own lines, or the flag on a pasted command line."""
    said = SYNTHETIC if marker == "lines" else ["llama-server -m target.gguf -md draft.gguf --spec-type draft-simple "
                                                "--spec-synth-len 2"]
    path = _log(tmp_path, [START[0], *said, *START[1:], STATS])
    v = _triage_json(path)
    assert v["acceptance"] == {"accepted": 3, "generated": 6, "rate": 0.5, "per_step_lines": 1, "synthetic": True}
    assert v["kind"] == "draft_stats_only"
    assert "synthetic acceptance" in v["summary"] and "say nothing about its quality" in v["summary"]
    text = CliRunner().invoke(cli, ["triage", str(path)]).stdout
    assert "drafts:   3/6 accepted (50.0%) (synthetic: chosen by the server, not the drafter)" in text
    report = markdown_report(analyze.parse(path))
    assert "synthetic acceptance, chosen by the server: 3 of 6 drafted tokens accepted" in report  # the signature
    assert "This run's acceptance is synthetic acceptance" in report  # beside what acceptance would mean


def test_without_synthetic_acceptance_the_numbers_are_the_drafters(tmp_path: Path) -> None:
    v = _triage_json(_log(tmp_path, [*START, STATS]))
    assert v["acceptance"]["synthetic"] is False and "synthetic" not in v["summary"]


def test_synthetic_arguments_refused_at_start_up_are_a_failure(tmp_path: Path) -> None:
    result = analyze.parse(_log(tmp_path, ["error: synthetic acceptance length and rates are mutually exclusive"]))
    assert result.verdict.kind == "other" and list(result.errors["variant"]) == ["synthetic_bad_args"]


# ---- DFlash clamps and rejected rows, chained MTP (#dflash-clamps-adaptive-depth-and-chained-mtp) ------------

def test_dflash_clamps_and_rejected_rows_are_read_and_counted(tmp_path: Path) -> None:
    lines = [*START,
             "0.01.000.000 W 4 sequences of n_max=16 do not fit the draft batch 32 -- clamping n_max to 7",
             "0.01.000.001 W sanitized 12 non-finite/f16-overflow target feature values",
             "0.01.000.002 E injection batch rejected feature row 3 of 16",
             "0.01.000.003 E seq 1: the draft batch rejected a noise-block row, no draft this round",
             "0.01.000.004 W chained MTP is not supported for this model; using sequential MTP", STATS]
    result = analyze.parse(_log(tmp_path, lines))
    ev = result.events.set_index("pattern")
    clamp = json.loads(ev.loc["draft_batch_clamp", "detail"])
    assert (clamp["n_seqs"], clamp["n_max"], clamp["n_batch"], clamp["n_to"]) == ("4", "16", "32", "7")
    row = json.loads(ev.loc["injection_row_rejected", "detail"])
    assert (row["row"], row["n_rows"]) == ("3", "16")
    assert ev.loc["noise_row_rejected", "seq_id"] == 1 and ev.loc["noise_row_rejected", "kind"] == "draft_rejected"
    assert ev.loc["draft_features_sanitized", "kind"] == ev.loc["chain_unsupported", "kind"] == "draft_warning"
    # the server skipped a round and went on: nothing failed
    assert result.verdict.kind == "draft_stats_only" and not len(result.errors)
    report = markdown_report(result)
    assert "| draft size clamped to fit the draft batch | 1 |" in report
    assert "| drafter rows rejected (no draft that round) | 2 |" in report


def test_a_chained_mtp_decode_that_fails_is_the_drafters(tmp_path: Path) -> None:
    result = analyze.parse(_log(tmp_path, [*START, "0.02.000.000 E llama_process(chain) returned -1"]))
    v = result.verdict
    assert (v.kind, v.component) == ("decode_failed", "drafter")


def test_adaptive_depth_per_slot_over_time(tmp_path: Path) -> None:
    lines = ["0.00.300.000 I spec common_specu: adaptive draft depth enabled (draft-mtp-adaptive)",
             "0.48.122.337 D spec       accept: adaptive draft depth seq 0: 3 -> 4 (n_draft=3, n_accepted=3)",
             "0.48.222.337 D spec       accept: adaptive draft depth seq 1: 3 -> 2 (n_draft=3, n_accepted=0)",
             "0.48.322.337 D spec       accept: adaptive draft depth seq 0: 4 -> 5 (n_draft=4, n_accepted=4)",
             # the older wording of the same line
             "0.48.422.337 I spec       accept: adaptive n : 5 -> 4 (seq 0, n_draft=5, n_accepted=2)"]
    result = analyze.parse(_log(tmp_path, lines))
    assert (result.meta["spec_type"], result.meta["drafter_kv"]) == ("draft-mtp-adaptive", "mirror")
    d = depth_series(result.events)
    assert d.drop(columns="t").to_dict("list") == {
        "line": [2, 3, 4, 5], "seq_id": [0, 1, 0, 0], "depth_from": [3, 3, 4, 5], "depth": [4, 2, 5, 4],
        "n_draft": [3, 3, 4, 5], "n_accepted": [3, 0, 4, 2]}
    assert d["t"].round(6).tolist() == [48.122337, 48.222337, 48.322337, 48.422337]  # over time: the line's clock
    # the drafts the depth lines count are the run's acceptance where nothing else says it
    assert (result.verdict.acceptance["accepted"], result.verdict.acceptance["generated"]) == (9, 15)
    assert "| adaptive draft depth (per slot) | seq 0: 3 -> 4, 3 changes; seq 1: 3 -> 2, 1 change |" in \
        markdown_report(result)
    assert depth_series(analyze.parse(HEALTHY).events).empty


# ---- the four wordings of the acceptance line (#acceptance-in-four-wordings) ---------------------------------

WORDINGS = {
    "2025 rate": "draft acceptance rate = 0.10417 (    5 accepted /    48 generated)",
    "2025": "0.01.172.204 I slot print_timing: id  0 | task 0 | draft acceptance = 0.10417 (    5 accepted /    48 "
            "generated)",
    "mid-2026": "0.01.172.204 I slot print_timing: id  0 | task 0 | draft acceptance = 0.10417 (    5 accepted /    48 "
                "generated), mean acceptance length =  1.29, acceptance rate per position = (0.294, 0.000, 0.000)",
    "b11434": "0.01.172.204 I slot print_timing: id  0 | task 0 | draft acceptance = 0.10417 (    5 accepted /    48 "
              "generated), mean len =  1.29\n0.01.172.204 I slot print_timing: id  0 | task 0 |      acc per pos = "
              "(0.294, 0.000, 0.000)",
}


@pytest.mark.parametrize("wording", sorted(WORDINGS))
def test_every_acceptance_wording_gives_the_same_numbers(tmp_path: Path, wording: str) -> None:
    result = analyze.parse(_log(tmp_path, [START[0], WORDINGS[wording]]))
    acc = result.verdict.acceptance
    assert (acc["accepted"], acc["generated"], acc["rate"]) == (5, 48, 0.10417)
    c = cycle_stats(result)
    if wording in ("mid-2026", "b11434"):
        assert c.mean_accepted_len == 1.29 and c.accepted_per_position == [0.294, 0.0, 0.0]
    else:
        assert c.accepted_per_position == []


def test_a_fleets_sql_can_leave_synthetic_runs_out_and_count_trims(tmp_path: Path) -> None:
    """The Parquet dataset's verdicts say which runs' acceptance the server made up and how often llama.cpp
    trimmed a stale drafter, so a query of drafter quality over many logs can leave the synthetic ones out."""
    logs = [_log(tmp_path, [START[0], *SYNTHETIC, *START[1:], STATS], "synthetic.log"),
            _log(tmp_path, [*START, MIRROR_TRIM, MTP_TRIM, STATS], "trimmed.log"),
            _log(tmp_path, [*START, STATS], "plain.log")]
    out = tmp_path / "fleet.kvt"
    r = CliRunner().invoke(cli, ["parse", "--dataset", "-o", str(out), *map(str, logs)])
    assert r.exit_code == 0, r.output
    sql = "SELECT regexp_extract(source, '[a-z]+[.]log$') AS log, synthetic, n_stale_trims FROM verdicts ORDER BY log"
    r = CliRunner().invoke(cli, ["query", sql, str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert [json.loads(line) for line in r.stdout.splitlines()] == [
        {"log": "plain.log", "synthetic": False, "n_stale_trims": 0},
        {"log": "synthetic.log", "synthetic": True, "n_stale_trims": 0},
        {"log": "trimmed.log", "synthetic": False, "n_stale_trims": 2}]
    sql = "SELECT sum(accepted) AS accepted, sum(generated) AS generated FROM verdicts WHERE NOT synthetic"
    r = CliRunner().invoke(cli, ["query", sql, str(out), "--json"])
    assert json.loads(r.stdout) == {"accepted": 6, "generated": 12}
    # and what triage clusters on, to group a fleet's aborts by their check
    crash = _log(tmp_path, ["/src/llama.cpp/ggml/src/ggml.c:1234: GGML_ASSERT(buffer) failed"], "crash.log")
    assert CliRunner().invoke(cli, ["parse", "--dataset", "-o", str(out), str(crash)]).exit_code == 0
    r = CliRunner().invoke(cli, ["query", "SELECT signature, failure FROM verdicts WHERE failure IS NOT NULL",
                                 str(out), "--json"])
    assert json.loads(r.stdout) == {"signature": "abort_outside_speculation", "failure": "GGML_ASSERT(buffer)"}
