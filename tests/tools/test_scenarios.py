"""The scenario matrix against a real llama-server b11434 (`make server`): each scenario captured once per test
session under `kvtrace capture run`, driven by the official openai client, then held to what healthy means
for its speculative type, with attribution checked against the log's own structure."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from kvtrace import analyze
from kvtrace.analyze.findings.compare import compare
from tests.capture.capture_helpers import NEEDS_SERVER
from tools.scenario_health import Health, check_structure, health
from tools.scenarios import BY_NAME, SCENARIOS, Scenario, ScenarioRun, run_scenario

pytestmark = NEEDS_SERVER

KEEPING = {"draft-simple": "own", "draft-dflash": "mirror", "draft-eagle3": "mirror", "ngram-mod": "none",
           "ngram-simple": "none"}
NAMES = [s.name for s in SCENARIOS]



class Matrix:
    """Each scenario captured (and parsed) the first time a test asks for it, once per session."""

    def __init__(self, server: Path, root: Path) -> None:
        self.server, self.root = server, root
        self.done: dict[str, tuple[ScenarioRun, analyze.ParseResult, Health]] = {}

    def get(self, name: str) -> tuple[ScenarioRun, analyze.ParseResult, Health]:
        if name not in self.done:
            sc = next(s for s in SCENARIOS if s.name == name)
            run = run_scenario(sc, self.root / name, self.server, limit=150)
            assert run.ok, f"{name}: {run.reason}"
            result = analyze.parse(run.session)
            h = health(result)
            h.structure = check_structure(result, run.session / "raw.log")
            self.done[name] = (run, result, h)
        return self.done[name]


@pytest.fixture(scope="session")
def matrix(llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> Matrix:
    return Matrix(llama_server, tmp_path_factory.mktemp("scenarios"))


@pytest.mark.parametrize("name", NAMES)
def test_scenario_is_captured_with_its_speculative_type(matrix: Matrix, name: str) -> None:
    run, result, _ = matrix.get(name)
    sc = next(s for s in SCENARIOS if s.name == name)
    assert run.requests and sum(r.ok for r in run.requests) >= (1 if sc.long_prompts else len(run.requests))
    assert result.meta["batch_debug"] and result.meta["kv_cache_debug"]
    assert result.meta["spec_type"] == sc.spec_type
    assert result.meta["drafter_kv"] == KEEPING[sc.spec_type]
    assert len(result.batches) > 20


@pytest.mark.parametrize("name", NAMES)
def test_healthy_run_shows_no_divergence(matrix: Matrix, name: str) -> None:
    _, result, h = matrix.get(name)
    assert h.healthy, (name, h.problems())
    assert h.failing_side == "none" and h.first_divergence is None and h.n_apart == 0
    if h.drafter_kv == "none":
        assert h.drafter_in_step is None and h.batches.get("drafter", 0) == 0
    else:
        assert h.drafter_in_step is True and h.n_cycles > 5, h
    c = compare(result, result)
    assert c.verdict == "unchanged"
    assert c.a.drafter_in_step is (None if h.drafter_kv == "none" else True)


@pytest.mark.parametrize("name", NAMES)
def test_attribution_matches_the_log_structure(matrix: Matrix, name: str) -> None:
    _, result, h = matrix.get(name)
    s = h.structure
    assert s["wrong"] == 0, (name, s)
    if s["known"]:
        assert s["right"] / s["known"] >= 0.99, (name, s)
    if name.startswith("draft-dflash"):
        assert s["known"] > 10  # noise blocks and embedding injections, by construction the drafter's
    # find_slot rows take the side of the batch they place: both caches have one size in b11434
    kv = result.kv
    assert (kv["context"] != "unknown").mean() >= 0.99, kv["context"].value_counts()
    b = result.batches
    # unknown is allowed (a guess is never shown as a fact): the warm-up decodes at start-up, before any request
    assert (b["context"] != "unknown").mean() >= 0.95, b["context"].value_counts()


def test_server_that_exits_at_start_up_gives_a_session_and_one_line(llama_server: Path, tmp_path: Path) -> None:
    bad = Scenario("bad-flag", "draft-simple", ("--no-such-flag-kvtrace",), requests=1)
    start = time.monotonic()
    run = run_scenario(bad, tmp_path / "bad", llama_server, limit=60)
    assert time.monotonic() - start < 60
    assert not run.ok and "\n" not in run.reason
    assert "exited at start-up" in run.reason and "no-such-flag-kvtrace" in run.reason, run.reason
    assert (run.session / "raw.log").is_file() and (run.session / "manifest.json").is_file()


def test_a_drafter_the_build_cannot_load(llama_server: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))  # the magic, then nothing a loader can use
    bad = Scenario("bad-drafter", "draft-dflash", ("-c", "256"), requests=1, model_draft=str(broken))
    run = run_scenario(bad, tmp_path / "bad", llama_server, limit=60)
    assert not run.ok and "\n" not in run.reason and run.reason, run.reason
    assert (run.session / "raw.log").stat().st_size > 0


DEFAULTS = [s.name for s in SCENARIOS if s.defaults]
TUNED = {"draft-dflash-defaults": "draft-dflash-1slot", "draft-simple-defaults": "draft-simple-1slot",
         "ngram-mod-defaults": "ngram-mod-2slots"}


@pytest.mark.parametrize("name", DEFAULTS)
def test_the_servers_defaults_read_healthy(matrix: Matrix, name: str) -> None:
    """The command users type (memory fitting on, -np auto): healthy, like the tuned run, and opened on the
    slot the client landed on."""
    from kvtrace.analyze.findings.positions import batches_per_sequence, opening_sequence

    _, result, h = matrix.get(name)
    assert result.verdict.kind == "draft_stats_only" and len(result.errors) == 0, result.verdict.summary
    notices = result.events[result.events["kind"] == "startup_notice"]
    if name.startswith("draft-dflash"):
        # memory fitting cannot create the DFlash drafter without its target, and llama.cpp says that is normal
        # (the line is read by its most specific entry, the drafter's `ctx_other_required`)
        assert len(notices) >= 1 and notices["pattern"].eq("ctx_other_required").any(), notices
    _, tuned, _ = matrix.get(TUNED[name])
    assert compare(tuned, result).verdict == "unchanged"
    counts = batches_per_sequence(result)
    busy = opening_sequence(result)
    assert busy is not None and counts[busy] == max(counts.values()) and counts[busy] > 10, counts


# Where the log carries no per-step acceptance: the n-gram types draft nothing from these short prompts (no
# n-gram of the prompt repeats in time), so the server counts 0, the responses carry no draft_n and the log
# prints no `accepted N/M` line; the three witnesses are held to that instead.
NO_DRAFTS = {"ngram-mod", "ngram-simple"}


def _drafts_nothing(name: str) -> bool:
    """An n-gram scenario on the short prompts; those whose prompts repeat themselves (`-drafting`) do draft."""
    return BY_NAME[name].spec_type in NO_DRAFTS and not name.endswith("-drafting")


@pytest.mark.parametrize("name", NAMES)
def test_the_logs_draft_counts_equal_the_servers_counters_and_the_responses(matrix: Matrix, name: str) -> None:
    """Three independent counts of one thing: the log's per-step `accepted N/M draft tokens` lines (LLAMA_TRACE,
    set by the scenarios), llama-server's /metrics (added by `capture run`) and each response's timings."""
    from kvtrace.analyze.findings.counters import PER_STEP, server_counters

    run, result, _ = matrix.get(name)
    c = server_counters(result, run.session)
    assert c is not None, f"{name}: no metrics.parquet"
    answered = [r for r in run.requests if r.ok]
    drafted = sum(r.draft_n or 0 for r in answered)
    accepted = sum(r.draft_n_accepted or 0 for r in answered)
    if _drafts_nothing(name):
        assert c.draft_tokens == {"log": None, "server": 0} and c.drafts["server"] == 0, c
        assert drafted == accepted == 0 and c.log_source is None
        return
    assert c.log_source == PER_STEP and c.window == "whole run", c
    assert c.agree is True, (name, c)
    assert c.drafts["log"] and c.drafts["log"] > 5
    finished = [r for r in answered if not r.cancelled]
    assert all(r.draft_n is not None for r in finished), run.requests
    cancelled = [r for r in answered if r.cancelled]
    if cancelled:
        # a closed stream gets no final timings and the server prints no per-request line for it (`stop: cancel
        # task`): its drafts are the log's steps of the requests that printed none
        from kvtrace.analyze.reader.verdict import per_request_counts

        rows, from_steps = per_request_counts(result.events)
        assert 1 <= from_steps <= len(cancelled), (from_steps, run.requests)
        steps = rows[rows["kind"] == "accepted"]
        drafted += int(steps["generated"].sum())
        accepted += int(steps["accepted"].sum())
    assert (drafted, accepted) == (c.draft_tokens["server"], c.accepted_tokens["server"]), (name, c, run.requests)
    # the verdict's acceptance (triage --json's `acceptance`, the summary) is the same count
    acc = result.verdict.acceptance
    assert (acc["generated"], acc["accepted"]) == (c.draft_tokens["server"], c.accepted_tokens["server"]), (acc, c)
    assert f"{acc['accepted']} of {acc['generated']} drafted tokens" in result.verdict.summary, result.verdict.summary


@pytest.mark.parametrize("name", [n for n in NAMES if not _drafts_nothing(n)])
def test_one_target_verify_batch_per_draft(matrix: Matrix, name: str) -> None:
    """What the counters say the batches add up to: each draft the server counts is verified once on the target,
    as that sequence's rows of a batch whose every row is an output (the draft plus the sampled token, so more
    than one position). The reader must put exactly those on the target: with one request at a time, one per
    draft. With several in flight, a verification that shares its batch with another slot's prompt (whose rows
    are not all outputs) has no such shape, so the shaped ones can only be fewer, by at most the sequences with
    several positions in such batches. DFlash's drafter decodes one
    noise block of the same shape per draft, on the drafter's side, whatever the slots."""
    from kvtrace.analyze.findings.counters import server_counters

    run, result, _ = matrix.get(name)
    sc = BY_NAME[name]
    c = server_counters(result, run.session)
    assert c is not None and c.drafts["server"]
    drafts = c.drafts["server"]
    b = result.batches
    several = b["pos_max"] - b["pos_min"] >= 1
    shaped = b[(b["n_outputs"] == b["n_tokens"]) & several]
    on_target = int((shaped["context"] == "target").sum())
    # where a verification without the shape can hide: a sequence's several positions in a target batch whose
    # rows are not all outputs (prompt chunks among them)
    mixed = int(((b["n_outputs"] < b["n_tokens"]) & several & (b["context"] == "target")).sum())
    assert not (shaped["context"] == "unknown").any(), shaped["context"].value_counts()
    if sc.concurrency == 1:
        assert on_target == drafts, (name, on_target, drafts)
    else:
        assert drafts - mixed <= on_target <= drafts, (name, on_target, mixed, drafts)
    if sc.spec_type == "draft-dflash":
        noise_blocks = int((shaped["context"] == "drafter").sum())
        assert noise_blocks == drafts, (name, noise_blocks, drafts)
    elif sc.spec_type == "draft-simple":
        assert not (shaped["context"] == "drafter").any()  # its drafter wants one output per step


def test_a_synthetic_acceptance_run_is_marked_synthetic(matrix: Matrix) -> None:
    """b11434's --spec-synth-len 2, run for real: the server makes up what is accepted, and the verdict says so
    (triage --json's acceptance.synthetic) while the run stays healthy."""
    from kvtrace.analyze.views.report import markdown_report

    run, result, h = matrix.get("draft-simple-synthetic")
    assert "--spec-synth-len" in result.meta["flags"]  # from the manifest's command
    assert (result.events["pattern"] == "synthetic_enabled").sum() == 1  # and from the server's own warning
    acc = result.verdict.acceptance
    assert acc["synthetic"] is True and acc["generated"] > 0
    assert h.healthy and result.verdict.kind == "draft_stats_only"
    assert "synthetic acceptance" in markdown_report(result)
    _, plain, _ = matrix.get("draft-simple-1slot")
    assert plain.verdict.acceptance["synthetic"] is False


# several slots on an upstream drafter type: each slot's drafter mirrors its own target
MULTI_SLOT_MIRROR = [s.name for s in SCENARIOS if s.spec_type in ("draft-eagle3", "draft-dflash") and s.concurrency > 1
                     and not s.rpc_devices and not s.defaults]


@pytest.mark.parametrize("name", MULTI_SLOT_MIRROR)
def test_every_slots_drafter_stays_in_the_band(matrix: Matrix, name: str) -> None:
    """"Drafter - target" per slot, as the chart draws it: never outside the tolerance band on a healthy run, not
    even for one observation. b11434 tags every slot's EAGLE3 embedding batch as sequence 0, which put slot 0's
    drafter ahead by the other slots' rows about once per verify step, until the reader took the batch's sequences
    from the target batch it carries."""
    from kvtrace.analyze.findings.positions import apart, choose_axis, default_tolerance, sequences

    _, result, _ = matrix.get(name)
    axis, tol = choose_axis(result), default_tolerance(result)
    seqs = sequences(result)
    assert len(seqs) >= BY_NAME[name].concurrency, seqs
    for seq in seqs:
        d = apart(result, seq, axis)
        outside = d[d["delta"].abs() > tol]
        assert len(d) > 20 and outside.empty, (name, seq, tol, outside.head().to_dict("records"))


def test_cancelled_requests_without_llama_trace_are_counted_from_their_steps(llama_server: Path,
                                                                            tmp_path: Path) -> None:
    """The cancel scenario as most users run it, without LLAMA_TRACE: the log's counts are the per-request lines,
    and a closed stream prints none (`stop: cancel task`) though /metrics counts its drafts. Its -v steps count
    it, so `triage --json` says the counters agree, names why, and its acceptance and summary are the counters'."""
    import json
    from dataclasses import replace

    from kvtrace.analyze.findings.counters import PER_REQUEST
    from tests.capture.capture_helpers import run_kvtrace

    sc = replace(BY_NAME["draft-simple-cancel"], name="draft-simple-cancel-untraced", trace=False)
    run = run_scenario(sc, tmp_path / "s", llama_server, limit=150)
    assert run.ok and sum(r.cancelled for r in run.requests) == 2, run.reason
    raw = (run.session / "raw.log").read_text(encoding="utf-8", errors="replace")
    assert "stop: cancel task" in raw
    # untraced: only -v's step wording (`..., new n_tokens = P`), never LLAMA_TRACE's bare `accepted  A/ N draft tokens`
    assert ", new n_tokens = " in raw and re.search(r"accepted +\d+/ *\d+ draft tokens\n", raw) is None
    proc = run_kvtrace("triage", "--json", str(run.session), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    c = out["server_counters"]
    assert c["log_source"] == PER_REQUEST and c["agree"] is True, c
    assert any("cancelled request" in n for n in c["notes"]), c["notes"]
    acc = out["acceptance"]
    assert (acc["generated"], acc["accepted"]) == (c["draft_tokens"]["server"], c["accepted_tokens"]["server"])
    assert f"{acc['accepted']} of {acc['generated']} drafted tokens" in out["summary"], out["summary"]
    finished = sum(r.draft_n or 0 for r in run.requests if not r.cancelled)
    assert 0 < finished < acc["generated"]  # the finished responses alone are the smaller number it used to give


# llama.cpp's own prefix: minutes.seconds.milliseconds.microseconds since its logger started
_STAMP = re.compile(rb"^(\d+)\.(\d\d)\.(\d{3})\.(\d{3}) ")


@pytest.mark.parametrize("name", ["draft-simple-2slots-long", "draft-eagle3-3slots"])
def test_request_seconds_come_from_the_logs_own_clock(matrix: Matrix, name: str) -> None:
    """"Slowest requests" and each slot's mean seconds: a request's first line to its last on the log's own
    timestamps, read here from the raw text. The capture's clock is when the lines arrived, in bursts: on these
    fast tiny runs a whole request arrives in one, and every request read 0 s."""
    from kvtrace.analyze.findings.acceptance import acceptance

    run, result, _ = matrix.get(name)
    acc = acceptance(result, run.session)
    assert acc.clock == "capture"  # the views' clock is the capture's: the case that read 0 s
    lines = (run.session / "raw.log").read_bytes().split(b"\n")

    def stamp(line_no: int) -> float:
        m = _STAMP.match(lines[line_no - 1])
        assert m is not None, lines[line_no - 1][:80]
        return int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1e3 + int(m[4]) / 1e6

    ev = result.events
    keyed = ev[ev["slot"].notna() & ev["task"].notna() & (ev["task"] >= 0)]
    req = acc.requests
    assert len(req) >= len(run.requests), (len(req), len(run.requests))
    for row in req.itertuples():
        mine = keyed[(keyed["slot"] == row.slot) & (keyed["task"] == row.task)]["line"]
        want = stamp(int(mine.max())) - stamp(int(mine.min()))
        assert want > 0 and abs(row.seconds - want) < 1e-6, (row, want)
    slowest = acc.slowest()
    assert slowest["seconds"].iloc[0] == req["seconds"].max() > 0
    means = req.groupby("slot")["seconds"].mean()
    assert (acc.slots.set_index("slot")["seconds"] - means).abs().max() < 1e-9 and (means > 0).all()
