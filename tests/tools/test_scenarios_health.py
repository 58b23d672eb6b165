"""What the health findings name on a real llama-server b11434 (`make server`): a tiny Mamba drafter used as
draft-simple, which b11434 cannot roll back (its draft context is created with n_rs_seq = 0), named with that
cause; a client that turns its sampling up midway, a real collapse named at its onset; and n-gram scenarios whose prompts really draft, and two slots given different prompts, which fire
nothing (acceptance that the text or the prompts explain is no finding)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtrace import analyze
from kvtrace.analyze.cli import cli
from kvtrace.analyze.findings.acceptance import step_table
from kvtrace.analyze.findings.health import health
from kvtrace.analyze.findings.signatures import match_signature
from tests.capture.capture_helpers import NEEDS_SERVER
from tools.scenarios import BY_NAME, run_scenario

pytestmark = NEEDS_SERVER


def test_a_recurrent_drafter_is_named_with_its_cause(llama_server: Path, tmp_path: Path) -> None:
    run = run_scenario(BY_NAME["draft-simple-recurrent-drafter"], tmp_path / "mamba", llama_server, limit=150)
    result = analyze.parse(str(run.session))
    m = match_signature(result)
    assert m.name == "recurrent_drafter_rollback", (m.name, result.verdict.kind, run.reason)
    assert "n_rs_seq = 0" in m.signature.explanation
    lines = " ".join(text for _, text in m.match.evidence)
    assert "failed to remove sequence" in lines and "does not support partial sequence removal" in lines
    assert any("attention-only" in s for s in m.steps)
    out = CliRunner().invoke(cli, ["report", str(run.session)])
    assert out.exit_code == 0 and "`recurrent_drafter_rollback`" in out.output


@pytest.mark.parametrize("name", ["ngram-simple-drafting", "ngram-mod-drafting", "draft-simple-2slots-long"])
def test_healthy_runs_that_draft_little_or_differ_per_slot_name_nothing(llama_server: Path, tmp_path: Path,
                                                                        name: str) -> None:
    run = run_scenario(BY_NAME[name], tmp_path / name, llama_server, limit=150)
    assert run.ok, run.reason
    result = analyze.parse(str(run.session))
    assert (result.verdict.acceptance or {}).get("generated", 0) > 0  # the prompts really drafted
    assert health(result) == []
    out = CliRunner().invoke(cli, ["triage", "--json", str(run.session)])
    assert json.loads(out.output)["health"] == []


def test_a_real_collapse_is_named_where_the_sampling_changed(llama_server: Path, tmp_path: Path) -> None:
    """Four greedy requests, then four at a temperature where the tiny target's tokens are close to random: the
    drafter's acceptance falls for real (no bug), and the onset is where the hot requests begin."""
    run = run_scenario(BY_NAME["draft-simple-sampling-change"], tmp_path / "hot", llama_server, limit=150)
    assert run.ok, run.reason
    result = analyze.parse(str(run.session))
    found = health(result)
    assert [f.finding for f in found] == ["acceptance_collapse"]
    opened = result.events[result.events["kind"] == "new_prompt"].groupby("task")["line"].min().sort_values()
    fifth, fourth = int(opened.iloc[4]), int(opened.iloc[3])
    steps = step_table(result.events)["line"]
    onset = found[0].onset_line
    # within a few verify steps of the first hot request's start (a change point in noisy 0/1 steps)
    assert fourth < onset and int(((steps >= min(onset, fifth)) & (steps < max(onset, fifth))).sum()) <= 8, \
        (found[0], opened.tolist())
    assert match_signature(result).name == "acceptance_collapse"
