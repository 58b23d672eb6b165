"""Small real llama-server b11434 captures of the scenario matrix (tests/fixtures/scenarios, trimmed at a
batch boundary and gzipped), so the checks of what healthy means per speculative type run without a server.
The engine's faults and the seed report keep their divergences."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import analyze
from analyze.compare import compare
from analyze.health import check_structure, health
from analyze.overview import overview
from analyze.views.report import markdown_report

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "scenarios"
INDEX = json.loads((FIXTURES / "index.json").read_text())


def test_every_speculative_type_has_a_fixture() -> None:
    kinds = {entry["spec_type"] for entry in INDEX.values()}
    assert {"draft-simple", "draft-dflash", "draft-eagle3", "ngram-mod", "ngram-simple"} <= kinds
    assert sorted(p.name for p in FIXTURES.glob("*.log.gz")) == sorted(INDEX)
    for path in FIXTURES.glob("*.log.gz"):
        assert path.stat().st_size < 400_000, path.name


@pytest.mark.parametrize("name", sorted(INDEX))
def test_fixture_is_healthy_for_its_speculative_type(name: str) -> None:
    entry = INDEX[name]
    result = analyze.parse(FIXTURES / name)
    assert result.warnings == []  # a complete small gzip is not "cut short"
    assert result.meta["spec_type"] == entry["spec_type"]
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
