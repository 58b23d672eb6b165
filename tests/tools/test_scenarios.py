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
           "ngram-simple": "none", "ngram-map-k": "none", "ngram-map-k4v": "none", "ngram-cache": "none",
           "none": "none"}
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
    assert result.meta["spec_type"] == sc.expected_type
    assert result.meta["drafter_kv"] == KEEPING[sc.expected_type]
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
    """An n-gram scenario on the short prompts (those whose prompts repeat themselves, `-drafting`, do draft), or
    one where the server chose no type at all."""
    sc = BY_NAME[name]
    return sc.spec_type in NO_DRAFTS and not name.endswith("-drafting") or sc.expected_type == "none"


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
    # /completion leaves `draft_n` out of a response that drafted nothing (the first of each echo pair)
    assert all(r.draft_n is not None for r in finished if not BY_NAME[name].echo), run.requests
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
    if sc.expected_type == "draft-dflash":
        noise_blocks = int((shaped["context"] == "drafter").sum())
        assert noise_blocks == drafts, (name, noise_blocks, drafts)
    elif sc.expected_type == "draft-simple":
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


# ---- the matrix, whole: every n-gram type drafting, a comma-combined type, the type left to the server, draft
# sizes, per-token timings (issue 38)

NGRAM_DRAFTING = [s.name for s in SCENARIOS if s.expected_type.startswith("ngram") and s.name.endswith("-drafting")]


def _statistics(result: analyze.ParseResult) -> dict[str, dict[str, str]]:
    """Each implementation's last `statistics <impl>: ...` line (the server's running totals per implementation,
    printed as each request ends), as its fields."""
    from kvtrace.analyze.reader.records import detail_of

    ev = result.events
    out: dict[str, dict[str, str]] = {}
    for text in ev.loc[ev["pattern"] == "spec_statistics", "detail"]:
        d = detail_of(text)
        out[str(d["impl"])] = {k: str(v) for k, v in d.items()}
    return out


def test_every_ngram_type_drafts_and_is_accepted() -> None:
    assert sorted(NGRAM_DRAFTING) == sorted(["ngram-simple-drafting", "ngram-mod-drafting", "ngram-map-k-drafting",
                                             "ngram-map-k4v-drafting", "ngram-cache-drafting"])


@pytest.mark.parametrize("name", NGRAM_DRAFTING)
def test_ngram_drafts_and_acceptance_against_the_servers_counters(matrix: Matrix, name: str) -> None:
    """Each n-gram type drafts from prompts built to repeat, and the target accepts some of it: > 0 on the
    server's own /metrics, equal to the log's per-step lines and to the server's statistics of that type."""
    from kvtrace.analyze.findings.counters import server_counters

    run, result, h = matrix.get(name)
    c = server_counters(result, run.session)
    assert c is not None and c.agree is True, c
    assert c.draft_tokens["server"] and c.draft_tokens["server"] > 0, c
    assert c.accepted_tokens["server"] and c.accepted_tokens["server"] > 0, c
    stats = _statistics(result)[BY_NAME[name].spec_type]
    assert int(stats["gen_tokens"]) == c.draft_tokens["server"] and int(stats["acc_tokens"]) == c.accepted_tokens["server"]
    assert h.drafter_in_step is None and h.batches.get("drafter", 0) == 0  # no drafter, whatever drafts


def test_a_comma_combined_type(matrix: Matrix) -> None:
    """`--spec-type ngram-simple,draft-simple` (b11434 takes a list): the n-gram type is asked first and the drafter
    drafts where it finds nothing. Both draft; each one's statistics add up to the server's counters; the steps the
    n-gram type drafted are named, and the drafter is held in step on its own steps only."""
    from kvtrace.analyze.findings.counters import server_counters
    from kvtrace.analyze.findings.cycles import cycle_stats
    from kvtrace.analyze.reader.records import NGRAM_DRAFT

    run, result, h = matrix.get("combined-ngram-simple-draft-simple")
    assert result.meta["spec_impls"] == ["ngram-simple", "draft-simple"]
    assert (result.meta["spec_type"], result.meta["drafter_kv"]) == ("draft-simple", "own")
    c = server_counters(result, run.session)
    assert c is not None and c.agree is True, c
    stats = _statistics(result)
    assert set(stats) == {"ngram-simple", "draft-simple"}
    assert all(int(s["gen_drafts"]) > 0 for s in stats.values()), stats
    for field, counter in (("gen_tokens", c.draft_tokens), ("acc_tokens", c.accepted_tokens), ("gen_drafts", c.drafts)):
        assert sum(int(s[field]) for s in stats.values()) == counter["server"], (field, stats, c)
    ngram_steps = int((result.events["kind"] == NGRAM_DRAFT).sum())
    assert ngram_steps == int(stats["ngram-simple"]["gen_drafts"])
    assert h.drafter_in_step is True and 0 < h.n_cycles <= int(stats["draft-simple"]["gen_drafts"]), h
    # the run's mean accepted length is every type's, as the per-step lines count it, not the last type printed
    assert cycle_stats(result).mean_accepted_len == round(1 + c.accepted_tokens["server"] / c.drafts["server"], 3)


def test_the_type_left_to_the_server(matrix: Matrix) -> None:
    """No --spec-type: b11434 detects DFlash from a `dflash` drafter and drafts; from a plain drafter it detects
    nothing, chooses no type (`no implementations specified`), and nothing drafts, which the verdict says."""
    from kvtrace.analyze.findings.counters import server_counters

    run, result, _ = matrix.get("auto-dflash-drafter")
    text = (run.session / "raw.log").read_text("utf-8", "replace")
    assert "auto-detected speculative type 'draft-dflash' from the draft model metadata" in text
    assert "--spec-type" not in result.meta["flags"] and result.meta["spec_type"] == "draft-dflash"
    c = server_counters(result, run.session)
    assert c is not None and c.agree is True and c.drafts["server"] and c.drafts["server"] > 5, c

    run, result, h = matrix.get("auto-plain-drafter")
    text = (run.session / "raw.log").read_text("utf-8", "replace")
    assert "auto-detected speculative type" not in text and "no implementations specified" in text
    assert result.meta["spec_none"] is True and (result.meta["spec_type"], result.meta["drafter_kv"]) == ("none", "none")
    assert "no implementations specified" in result.verdict.summary
    c = server_counters(result, run.session)
    assert c is not None and c.draft_tokens["server"] == c.drafts["server"] == 0
    assert all(r.draft_n is None for r in run.requests) and h.batches.get("drafter", 0) == 0


@pytest.mark.parametrize("n_max", [1, 8, 16])
def test_the_draft_size(matrix: Matrix, n_max: int) -> None:
    """--spec-draft-n-max 1, 8 and 16: no draft longer, the longest as long (draft-simple stops a draft early
    where its drafter is unsure, so lengths vary), and the counters agree."""
    from kvtrace.analyze.findings.counters import server_counters
    from kvtrace.analyze.reader.records import verify_steps

    run, result, _ = matrix.get(f"draft-simple-n-max-{n_max}")
    assert result.meta["flags"]["--spec-draft-n-max"] == str(n_max)
    generated = verify_steps(result.events)["generated"].astype(int)
    assert generated.max() == n_max and generated.min() >= 1, generated.value_counts()
    c = server_counters(result, run.session)
    assert c is not None and c.agree is True, c


SINGLE_TYPE_DRAFTING = [n for n in NAMES if not _drafts_nothing(n) and "," not in BY_NAME[n].spec_type
                        and BY_NAME[n].concurrency == 1 and not BY_NAME[n].name.endswith("-synthetic")]


@pytest.mark.parametrize("name", SINGLE_TYPE_DRAFTING)
def test_the_servers_per_position_rates_are_shares_of_every_step(matrix: Matrix, name: str) -> None:
    """What the server's `acc rate/pos` counts, against the log's per-step lines: at position k, the steps that
    accepted k tokens or more over every step, however long each draft was. Where drafts vary in length (n-max 8
    and 16) that is not the rate at which drafted tokens at k were accepted (docs/speculative-types.md)."""
    from kvtrace.analyze.reader.records import verify_steps

    _, result, _ = matrix.get(name)
    stats = _statistics(result)[BY_NAME[name].expected_type]
    server = [float(v) for v in stats.get("acc_per_pos", "").split(",") if v.strip()]  # `()`: none accepted
    steps = verify_steps(result.events)
    accepted = steps["accepted"].fillna(0).astype(int).to_numpy()
    assert len(steps) == int(stats["calls_a"])
    shares = [float((accepted >= k).sum()) / len(steps) for k in range(1, len(server) + 1)]
    assert shares == pytest.approx(server, abs=0.0006), (shares, server)
    if name == "draft-simple-n-max-16":  # drafts of 1 to 16 tokens: the per-drafted-token rate is another number
        generated = steps["generated"].astype(int).to_numpy()
        reached = [float((accepted >= k).sum()) / max(1, int((generated >= k).sum())) for k in range(1, len(server) + 1)]
        assert reached != pytest.approx(server, abs=0.0006)


def test_streams_with_timings_per_token(matrix: Matrix) -> None:
    """Every chunk carries the request's counts so far: the last one's are the request's, and what the log, the
    counters and the verdict say is the same total, never the chunks' sum."""
    from kvtrace.analyze.findings.counters import server_counters

    run, result, _ = matrix.get("draft-simple-timings-per-token")
    assert all(r.timed_chunks > 1 and r.timed_chunks >= r.chunks - 1 for r in run.requests), run.requests
    c = server_counters(result, run.session)
    assert c is not None and c.agree is True, c
    drafted = sum(r.draft_n or 0 for r in run.requests)
    assert drafted == c.draft_tokens["server"]
    acc = result.verdict.acceptance
    assert (acc["generated"], acc["accepted"]) == (drafted, sum(r.draft_n_accepted or 0 for r in run.requests))


# ---- llama.cpp's JSON log: one real run per type the embedded engine runs too, read as its text twin

JSONL = ["draft-simple", "draft-dflash", "draft-eagle3"]


@pytest.mark.parametrize("spec_type", JSONL)
def test_a_jsonl_run_reads_as_its_text_run(matrix: Matrix, spec_type: str) -> None:
    """The same scenario with --log-jsonl (one request at a time, greedy: the same tokens, batches and drafts)
    gives the text run's tables, attribution, acceptance, counters and verdict, with every row's `t` filled."""
    from kvtrace.analyze.findings.counters import server_counters

    run_t, text, _ = matrix.get(f"{spec_type}-1slot")
    run_j, jsonl, h = matrix.get(f"{spec_type}-jsonl")
    assert (text.meta["log_format"], jsonl.meta["log_format"]) == ("text", "jsonl")
    assert jsonl.meta["log_jsonl"]["objects"] > 1000
    head = (run_j.session / "raw.log").read_text("utf-8", "replace").lstrip()[:200]
    assert head.startswith('{"type":"log","time":'), head  # the server's own objects, not text
    for table in ("batches", "kv", "events", "errors"):
        a, b = getattr(text, table), getattr(jsonl, table)
        if table == "events":  # `all slots are idle` comes each time a /health or /metrics poll wakes the server
            a, b = (e[e["pattern"] != "server_idle"] for e in (a, b))
        assert len(a) == len(b), table
        if "t" in b.columns and len(b):
            assert b["t"].notna().all() and (b["t"] > 0).all(), table
        if table == "events":  # as many of each kind; the text run's stdout and stderr may interleave otherwise
            assert sorted(a["kind"].astype(str)) == sorted(b["kind"].astype(str))
            sa, sb = (e[e["kind"] == "accepted"] for e in (a, b))  # the verify steps, in order
            assert sa["accepted"].tolist() == sb["accepted"].tolist() and sa["generated"].tolist() == sb["generated"].tolist()
    for table in ("batches", "kv"):
        a, b = getattr(text, table), getattr(jsonl, table)
        assert a["context"].astype(str).tolist() == b["context"].astype(str).tolist(), table
        assert a["seq_id"].tolist() == b["seq_id"].tolist() and a["pos_max"].tolist() == b["pos_max"].tolist()
    cols = ["n_tokens", "n_outputs", "pos_min"]
    assert text.batches[cols].astype(str).values.tolist() == jsonl.batches[cols].astype(str).values.tolist()
    assert text.verdict.acceptance == jsonl.verdict.acceptance
    assert (text.verdict.kind, text.verdict.component) == (jsonl.verdict.kind, jsonl.verdict.component)
    a, b = server_counters(text, run_t.session), server_counters(jsonl, run_j.session)
    assert a is not None and b is not None and b.agree is True
    assert (a.draft_tokens, a.accepted_tokens, a.drafts) == (b.draft_tokens, b.accepted_tokens, b.drafts)
    assert compare(text, jsonl).verdict == "unchanged"
    assert h.healthy and h.structure["wrong"] == 0


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
