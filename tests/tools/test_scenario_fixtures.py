"""Small real llama-server b11434 captures of the scenario matrix (tests/fixtures/scenarios, trimmed at a
batch boundary and gzipped), so the checks of what healthy means per speculative type run without a server.
The engine's faults and the seed report keep their divergences."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from kvtrace import analyze
from kvtrace.analyze.findings.compare import compare
from kvtrace.analyze.findings.overview import overview
from kvtrace.analyze.views.report import markdown_report
from tools.scenario_health import check_structure, health
from tools.scenarios import BY_NAME

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "scenarios"
INDEX = json.loads((FIXTURES / "index.json").read_text())

# What each fixture is, written down here from the scenario matrix (tools/scenarios.py) and the server's own
# start-up lines, so the index the other tests trust is itself checked: spec type, how that type keeps the
# drafter's KV, slots, context size, one unified cache or not, RPC devices. Every one of them is a healthy run.
TABLE: dict[str, tuple[str, str, int, int, bool, int]] = {
    # name                               spec type       drafter KV  slots  n_ctx  unified  RPC devices
    "draft-dflash-1slot.log.gz":         ("draft-dflash", "mirror", 1, 512, False, 0),
    "draft-dflash-2dev-devd.log.gz":     ("draft-dflash", "mirror", 1, 512, False, 2),
    "draft-dflash-2dev-kvu.log.gz":      ("draft-dflash", "mirror", 2, 1024, True, 2),
    "draft-dflash-2dev-layer.log.gz":    ("draft-dflash", "mirror", 1, 512, False, 2),
    "draft-dflash-2slots.log.gz":        ("draft-dflash", "mirror", 2, 1024, False, 0),
    "draft-eagle3-1slot.log.gz":         ("draft-eagle3", "mirror", 1, 512, False, 0),
    "draft-eagle3-3slots.log.gz":        ("draft-eagle3", "mirror", 3, 1536, False, 0),
    "draft-simple-1slot.log.gz":         ("draft-simple", "own", 1, 512, False, 0),
    "draft-simple-2dev-layer.log.gz":    ("draft-simple", "own", 1, 512, False, 2),
    "draft-simple-4slots.log.gz":        ("draft-simple", "own", 4, 1024, False, 0),
    "draft-simple-cache-reuse.log.gz":   ("draft-simple", "own", 2, 1024, False, 0),
    "draft-simple-context-shift.log.gz": ("draft-simple", "own", 1, 256, False, 0),
    "draft-simple-kv-unified.log.gz":    ("draft-simple", "own", 3, 1024, True, 0),
    "draft-simple-synthetic.log.gz":     ("draft-simple", "own", 1, 512, False, 0),
    "ngram-mod-2slots.log.gz":           ("ngram-mod", "none", 2, 1024, False, 0),
    # the server's defaults: -np auto is four slots in one unified cache, memory fitting on
    "draft-dflash-defaults.log.gz":      ("draft-dflash", "mirror", 4, 2048, True, 0),
    "draft-simple-defaults.log.gz":      ("draft-simple", "own", 4, 2048, True, 0),
    "ngram-mod-defaults.log.gz":         ("ngram-mod", "none", 4, 2048, True, 0),
    "ngram-simple-1slot.log.gz":         ("ngram-simple", "none", 1, 512, False, 0),
    # no --spec-type: the type left to the server (DFlash detected from its drafter; none from a plain one)
    "auto-dflash-drafter.log.gz":        ("auto", "mirror", 1, 512, False, 0),
    "auto-plain-drafter.log.gz":         ("auto", "none", 1, 512, False, 0),
    # two types, comma-combined: the n-gram one is asked first, the drafter where it finds nothing
    "combined-ngram-simple-draft-simple.log.gz": ("ngram-simple,draft-simple", "own", 1, 2048, False, 0),
}  # fmt: skip


def test_every_speculative_type_has_a_fixture() -> None:
    kinds = {entry["spec_type"] for entry in INDEX.values()}
    assert {"draft-simple", "draft-dflash", "draft-eagle3", "ngram-mod", "ngram-simple", "auto"} <= kinds
    assert sorted(p.name for p in FIXTURES.glob("*.log.gz")) == sorted(INDEX)
    for path in FIXTURES.glob("*.log.gz"):
        assert path.stat().st_size < 400_000, path.name


def test_the_index_is_what_the_table_and_the_matrix_say() -> None:
    assert sorted(INDEX) == sorted(TABLE)
    for name, (spec_type, drafter_kv, slots, n_ctx, unified, _) in TABLE.items():
        entry = INDEX[name]
        assert (entry["spec_type"], entry["drafter_kv"]) == (spec_type, drafter_kv), name
        args = entry["server_args"]
        scenario = BY_NAME[name.removesuffix(".log.gz")]
        assert args[args.index("-c") + 1] == str(n_ctx), name
        if scenario.defaults:  # -np and the unified cache left to the server (its choice is checked below)
            assert "-np" not in args and "--kv-unified" not in args, name
        else:
            assert args[args.index("-np") + 1] == str(slots), name
            assert ("--kv-unified" in args) is unified, name
        # the scenario that made it: the same type, flags and description
        assert (scenario.spec_type, list(scenario.args), scenario.about) == (spec_type, args, entry["about"])
        assert scenario.healthy and scenario.rpc_devices == TABLE[name][5], name


@pytest.mark.parametrize("name", sorted(TABLE))
def test_the_table_is_what_each_server_said_at_start_up(name: str) -> None:
    """Read with plain patterns, not the reader: the server's own words for its type, slots, cache and devices."""
    spec_type, _, slots, n_ctx, unified, rpc = TABLE[name]
    text = gzip.decompress((FIXTURES / name).read_bytes()).decode("utf-8", "replace")
    chosen = BY_NAME[name.removesuffix(".log.gz")].expected_type  # what the server runs: for `auto`, what it detects
    if spec_type == "auto":
        detected = re.findall(r"auto-detected speculative type '([\w-]+)' from the draft model metadata", text)
        assert detected == ([] if chosen == "none" else [chosen]), detected
        assert INDEX[name]["detected"] == chosen
    if chosen == "none":
        assert "adding speculative implementation" not in text and "no implementations specified" in text
    elif "," in spec_type:  # each type of the list added, in the server's order of preference
        assert re.findall(r"adding speculative implementation '([\w-]+)'", text) == spec_type.split(","), name
        assert INDEX[name]["detected"] == chosen
    else:
        assert re.findall(r"adding speculative implementation '([\w-]+)'", text)[:1] == [chosen]
    got = re.search(r"load_model: initializing, n_slots = (\d+), n_ctx_slot = \d+, kv_unified = '(\w+)'", text)
    assert got is not None and (int(got[1]), got[2] == "true") == (slots, unified)
    assert re.findall(r"llama_context: n_ctx += (\d+)", text)[:1] == [str(n_ctx)]
    assert len(set(re.findall(r"common_param: +- (RPC\d+) +:", text))) == rpc
    # a healthy run: no refused batch, no failed decode, no cache without room
    assert not re.search(r"inconsistent sequence positions|failed to decode|failed to find a memory slot", text)


@pytest.mark.parametrize("name", sorted(INDEX))
def test_fixture_is_healthy_for_its_speculative_type(name: str) -> None:
    entry = INDEX[name]
    result = analyze.parse(FIXTURES / name)
    assert result.warnings == []  # a complete small gzip is not "cut short"
    assert result.meta["spec_type"] == entry.get("detected", entry["spec_type"])
    assert result.meta["drafter_kv"] == entry["drafter_kv"]
    h = health(result)
    assert h.healthy, (name, h.problems())
    assert overview(result).first_divergence is None
    report = markdown_report(result)
    assert "failing side: **none**" in report and "first divergence" not in report.lower()
    side = compare(result, result).a
    assert side.drafter_in_step is (None if entry["drafter_kv"] == "none" else True)
    if entry["drafter_kv"] != "none":
        assert side.n_cycles > 3


@pytest.mark.parametrize("name", sorted(INDEX))
def test_fixture_attribution_against_its_structure(name: str) -> None:
    result = analyze.parse(FIXTURES / name)
    s = check_structure(result, FIXTURES / name)
    assert s["wrong"] == 0, s
    if s["known"]:
        assert s["right"] / s["known"] >= 0.99, s
    if INDEX[name]["spec_type"] == "draft-dflash":
        assert s["known"] > 5
    assert (result.kv["context"] != "unknown").mean() >= 0.99


def test_a_synthetic_acceptance_run_is_marked_synthetic() -> None:
    """The real b11434 run with --spec-synth-len 2: its acceptance is the server's choice, and says so everywhere."""
    from click.testing import CliRunner

    from kvtrace.analyze.cli import cli
    from kvtrace.analyze.views.triage import triage_row

    path = FIXTURES / "draft-simple-synthetic.log.gz"
    text = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
    assert "synthetic speculative acceptance is enabled for benchmarking" in text  # the server's own words
    out = CliRunner().invoke(cli, ["triage", "--json", str(path)]).stdout
    acc = json.loads(out)["acceptance"]
    assert acc["synthetic"] is True and acc["generated"] > 0
    report = markdown_report(analyze.parse(path))
    row = next(line for line in report.splitlines() if line.startswith("| draft acceptance |"))
    assert "synthetic acceptance" in row and "say nothing about the drafter's quality" in row, row
    assert "| mean accepted length (synthetic) |" in report
    assert triage_row(str(path)).acceptance == "synthetic"
    both = compare(analyze.parse(FIXTURES / "draft-simple-1slot.log.gz"), analyze.parse(path))
    line = next(c for c in both.changes if c.startswith("acceptance: "))
    assert " synthetic (" in line.split(" -> ")[1] and "synthetic" not in line.split(" -> ")[0], line
    # a run without the flag is not
    plain = json.loads(CliRunner().invoke(cli, ["triage", "--json", str(FIXTURES / "draft-simple-1slot.log.gz")]).stdout)
    assert plain["acceptance"]["synthetic"] is False
    assert "synthetic" not in markdown_report(analyze.parse(FIXTURES / "draft-simple-1slot.log.gz"))


def test_faults_keep_their_divergence(seed_report: Path) -> None:
    seed = analyze.parse(seed_report)
    assert overview(seed).first_divergence is not None
    stale = analyze.parse(ROOT / "samples" / "stale-drafter")
    assert overview(stale).first_divergence is not None
    assert compare(stale, stale).a.drafter_in_step is False
    rollback = analyze.parse(ROOT / "samples" / "no-rollback")
    assert overview(rollback).first_divergence is not None


@pytest.mark.parametrize("name", ["draft-simple-1slot.log.gz", "draft-dflash-1slot.log.gz", "draft-eagle3-1slot.log.gz"])
def test_spec_type_without_the_start_up_lines(name: str) -> None:
    """A paste cut after start-up still names its type: every draft prints `called impl ...`."""
    import gzip

    lines = gzip.decompress((FIXTURES / name).read_bytes()).splitlines(keepends=True)
    cut = b"".join(line for line in lines if b"adding speculative implementation" not in line)
    result = analyze.parse(cut, name=name)
    assert result.meta["spec_type"] == INDEX[name]["spec_type"]


def test_a_comma_combined_type_judges_the_drafter_on_its_own_steps() -> None:
    """`--spec-type ngram-simple,draft-simple`, a real b11434 run: the steps the n-gram type drafted (its `called impl
    ngram-simple` lines) leave the drafter idle, so they are no drafter cycles; judged on every step, this healthy
    run read out of step."""
    from kvtrace.analyze.findings.cycles import cycle_stats
    from kvtrace.analyze.reader.records import NGRAM_DRAFT

    name = "combined-ngram-simple-draft-simple.log.gz"
    text = gzip.decompress((FIXTURES / name).read_bytes()).decode("utf-8", "replace")
    result = analyze.parse(FIXTURES / name)
    ngram = result.events[result.events["kind"] == NGRAM_DRAFT]
    assert len(ngram) == text.count("called impl ngram-simple,") > 5
    assert text.count("called impl draft-simple,") > 5
    c = cycle_stats(result)
    assert c.drafter_in_step is True and c.n_cycles > 5, c


def test_a_comma_combined_types_acceptance_is_every_types() -> None:
    """The server prints its statistics per type; the run's mean accepted length and per-position rates are every
    type's together, as its per-step lines (both types' steps) count them, not the last type printed."""
    from kvtrace.analyze.findings.cycles import cycle_stats
    from kvtrace.analyze.reader.records import verify_steps

    result = analyze.parse(FIXTURES / "combined-ngram-simple-draft-simple.log.gz")
    steps = verify_steps(result.events)["accepted"].fillna(0).astype(int)
    c = cycle_stats(result)
    assert c.mean_accepted_len == round(1 + steps.sum() / len(steps), 3)
    shares = [round(float((steps >= k).sum()) / len(steps), 3) for k in range(1, steps.max() + 1)]
    assert c.accepted_per_position == pytest.approx(shares, abs=0.0011), (c.accepted_per_position, shares)


def test_three_eagle3_slots_each_keep_their_drafter_in_the_band() -> None:
    """The real 3-slot EAGLE3 capture: b11434 tags every slot's embedding batch (the target's hidden states, one
    `[embd]` row per row of the target batch just decoded) as sequence 0. Each is read as the sequences of the
    target batch it carries, so no slot's drafter leaves the tolerance band, and slot 0's none more often."""
    from kvtrace.analyze.findings.positions import apart, choose_axis, default_tolerance, sequences

    path = FIXTURES / "draft-eagle3-3slots.log.gz"
    text = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
    # the server's own tagging, read apart from the reader: embedding rows only ever name sequence 0
    assert set(re.findall(r": \[embd\], pos = +\d+, n_seq_id = +1, seq_id = \[(\d+)\]", text)) == {"0"}
    result = analyze.parse(path)
    axis, tol = choose_axis(result), default_tolerance(result)
    assert sequences(result) == [0, 1, 2]
    for seq in (0, 1, 2):
        d = apart(result, seq, axis)
        assert len(d) > 100 and (d["delta"].abs() <= tol).all(), (seq, d[d["delta"].abs() > tol].head())
    b = result.batches
    embedding = b[(b["context"] == "drafter") & b["embd"].astype(bool) & (b["n_outputs"] == b["n_tokens"])]
    assert set(embedding["seq_id"].astype(int)) == {0, 1, 2}
