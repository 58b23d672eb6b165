"""Every label of the real bug reports is reproduced by `kvtrace triage --json` (the labels are assertions)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import CORPUS, corpus_labels

LABELS = corpus_labels()


def _label(value: str) -> int | str | None:
    if value == "none":
        return None
    return int(value) if value.lstrip("-").isdigit() else value


@pytest.fixture(scope="module")
def triage_json() -> dict[str, dict]:
    """One `kvtrace triage --json` run over the whole corpus, as a user would run it."""
    files = [str(CORPUS / name) for name in LABELS]
    out = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "triage", "--json", *files],
                         capture_output=True, text=True, check=True)
    verdicts = [json.loads(line) for line in out.stdout.splitlines()]
    return {v["source"].rsplit("/", 1)[-1]: v for v in verdicts}


@pytest.mark.parametrize("name", sorted(LABELS))
def test_label_reproduced(name: str, triage_json: dict[str, dict]) -> None:
    expected = LABELS[name]
    got = triage_json[name]
    assert got["kind"] == expected["error_kind"]
    assert got["component"] == expected["component"]
    assert got["seq_id"] == _label(expected["seq_id"])
    assert got["last_pos"] == _label(expected["last_pos_X"])
    if expected["batch_start_Y"] != "unsure":
        assert got["batch_start"] == _label(expected["batch_start_Y"])
    assert got["n_position_errors"] == int(expected["n_errors"])
    assert got["summary"] and "\n" not in got["summary"]
    for ev in got["evidence"]:
        assert set(ev) == {"line", "text"}


def test_every_report_has_a_label() -> None:
    assert sorted(p.name for p in CORPUS.glob("*.log")) == sorted(LABELS)


def test_seed_report_evidence_points_at_the_first_complete_block(triage_json: dict[str, dict]) -> None:
    v = triage_json["00_beellama-28-multigpu-dflash-seed.log"]
    text = (CORPUS / "00_beellama-28-multigpu-dflash-seed.log").read_text().splitlines()
    by_line = {e["line"]: e["text"] for e in v["evidence"]}
    assert any("X = 259" in t for t in by_line.values())
    assert any("dflash: drafter decode failed with -1" in t for t in by_line.values())
    for line, t in by_line.items():
        assert text[line - 1].strip() == t
    assert "stale" in v["summary"] and "259" in v["summary"]


@pytest.mark.parametrize("name", sorted(LABELS))
def test_component_evidence_is_the_line_that_decided_the_side(name: str, triage_json: dict[str, dict]) -> None:
    """`component_evidence` is a line of the log, quoted among the evidence; no side without one."""
    got = triage_json[name]
    line = got["component_evidence"]
    if got["component"] == "unknown":
        assert line is None
        return
    text = (CORPUS / name).read_text(encoding="utf-8").splitlines()
    assert isinstance(line, int) and 1 <= line <= len(text)
    quoted = {e["line"]: e["text"] for e in got["evidence"]}
    assert line in quoted
    assert text[line - 1].strip().endswith(quoted[line].strip()[-40:])


def test_side_rules_on_the_new_families(triage_json: dict[str, dict]) -> None:
    """The rules the unseen reports needed, each decided by a named line."""
    def line_of(name: str) -> str:
        v = triage_json[name]
        return (CORPUS / name).read_text(encoding="utf-8").splitlines()[v["component_evidence"] - 1]

    # no speculative decoding anywhere: the failing line itself makes it the target's
    assert "inconsistent sequence positions" in line_of("40_llamacpp-16876-lmstudio-qwenvl-image-batch-mrope-no-spec.log")
    # a draft call right before the failure puts it on the drafter
    assert "common_speculative_gen_draft" in line_of("41_llamacpp-10547-draft-model-kv-ret1-after-gen-draft.log")
    # the speculative implementation's init lines right before an abort: the draft context failed to initialise
    assert "ctx_dft=yes" in line_of("52_llamacpp-pr23398-stepfun-mtp-init-assert-buffer.log")
    # speculative, but nothing says which context aborted: never guessed
    assert triage_json["64_ik-llama-1159-spec-assert-glued-ptrace.log"]["component"] == "unknown"


def test_triage_text_names_the_line_that_decided_the_side() -> None:
    name = "41_llamacpp-10547-draft-model-kv-ret1-after-gen-draft.log"
    out = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "triage", str(CORPUS / name)],
                         capture_output=True, text=True, check=True).stdout
    assert "verdict:  kv_slot (drafter, decided by line 3)" in out
    assert "      3  common_speculative_gen_draft:" in out
