"""The dashboard's healthy headline and acceptance through Streamlit's AppTest (real app.py, real reader): a run
llama.cpp repaired says so, and a synthetic run's acceptance is never shown as the drafter's."""

from __future__ import annotations

from pathlib import Path

from tests.analyze.dashboard.test_app import _app, _texts, _upload
from tests.analyze.reader.test_newer_upstream import with_trims

ROOT = Path(__file__).resolve().parents[3]
SCENARIOS = ROOT / "tests" / "fixtures" / "scenarios"


def _captions(at) -> str:  # noqa: ANN001 - AppTest
    return "\n".join(c.value for c in at.caption)


def test_a_repaired_run_reads_healthy_with_its_trims(tmp_path: Path) -> None:
    path = with_trims(tmp_path)
    at = _upload(_app(), (path.name, path.read_bytes()))
    assert not at.exception
    assert [s.value for s in at.subheader if s.value.startswith("Healthy")] == ["Healthy, drafter memory trimmed 2 times"]
    assert "trimmed it 2 times, first at X = 40 / Y = 30" in _texts(at)
    assert {m.label: m.value for m in at.metric}["Failing side"] == "none"


def test_a_synthetic_run_shows_no_acceptance_rate_of_the_drafters() -> None:
    path = SCENARIOS / "draft-simple-synthetic.log.gz"
    at = _upload(_app(), (path.name, path.read_bytes()))
    assert not at.exception
    assert [s.value for s in at.subheader if s.value.startswith("Healthy")] == ["Healthy"]
    metric = next(m for m in at.metric if m.label == "Draft acceptance")
    assert metric.value == "synthetic" and "by the server" in str(metric.proto.delta), metric.proto
    assert "%" not in metric.value
    assert "Draft acceptance: synthetic acceptance (--spec-synth-len/--spec-synth-rates" in _captions(at)
    assert "synthetic acceptance" in _texts(at)  # the summary under the headline


def test_a_plain_run_keeps_its_rate() -> None:
    path = SCENARIOS / "draft-simple-1slot.log.gz"
    at = _upload(_app(), (path.name, path.read_bytes()))
    metric = next(m for m in at.metric if m.label == "Draft acceptance")
    assert metric.value.endswith("%") and "synthetic" not in _captions(at)
