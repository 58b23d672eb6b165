"""The real runs that are not healthy by design, against a real llama-server b11434 (`make server`): the setups
tried in search of an upstream desync, a prompt longer than the context, DFlash at the context's end. Each is
captured once under `kvtrace capture run` (about 45 s for all six) and its verdict asserted: what `make
scenarios` shows by hand, held here on every `make test`.

What b11434 does, measured: DFlash's drafter decodes a noise block of draft-size + 1 positions after the last
token; at the slot's context end that block has no room (`failed to find a memory slot`, `draft: llama_process
returned 1`), the draft is dropped and the request goes on, so the verdict is kv_slot on the drafter's side and
the drafter stays in step. A prompt longer than the context is refused before any batch (HTTP 400, `exceeds
the available context size`): kv_slot on the target's side. The desync search finds no desync: cache reuse,
one unified cache over three slots, /slots save-erase-restore and streams closed mid-draft all read healthy
(the DFlash cancel run drafts to its slot's context end, so it shows the noise-block kv_slot too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtrace import analyze
from kvtrace.analyze.findings.counters import server_counters
from tests.capture.capture_helpers import NEEDS_SERVER
from tools.scenario_health import Health, check_structure, health
from tools.scenarios import BY_NAME, DESYNC_SEARCH, PROMPT_TOO_LONG, ScenarioRun, run_scenario

pytestmark = NEEDS_SERVER

# name: (verdict kind, failing side); the failing side is the reader's component, "none" for a healthy read
VERDICTS: dict[str, tuple[str, str]] = {
    "draft-dflash-context-shift": ("kv_slot", "drafter"),
    "draft-dflash-kv-unified": ("draft_stats_only", "none"),
    "draft-dflash-cache-reuse": ("draft_stats_only", "none"),
    "draft-dflash-cancel": ("kv_slot", "drafter"),
    "draft-dflash-slots": ("draft_stats_only", "none"),
    "draft-simple-prompt-too-long": ("kv_slot", "target"),
}
NAMES = [s.name for s in (*DESYNC_SEARCH, PROMPT_TOO_LONG)]


class Runs:
    """Each failing scenario captured (and parsed) the first time a test asks for it, once per session."""

    def __init__(self, server: Path, root: Path) -> None:
        self.server, self.root = server, root
        self.done: dict[str, tuple[ScenarioRun, analyze.ParseResult, Health]] = {}

    def get(self, name: str) -> tuple[ScenarioRun, analyze.ParseResult, Health]:
        if name not in self.done:
            run = run_scenario(BY_NAME[name], self.root / name, self.server, limit=150)
            assert run.ok, f"{name}: {run.reason}"
            result = analyze.parse(run.session)
            h = health(result)
            h.structure = check_structure(result, run.session / "raw.log")
            self.done[name] = (run, result, h)
        return self.done[name]


@pytest.fixture(scope="session")
def runs(llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(llama_server, tmp_path_factory.mktemp("failing-scenarios"))


def test_every_failing_setup_has_its_verdict_written_down() -> None:
    assert sorted(VERDICTS) == sorted(NAMES)
    assert not any(BY_NAME[n].healthy for n in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_the_verdict_of_each_failing_run(runs: Runs, name: str) -> None:
    run, result, h = runs.get(name)
    kind, side = VERDICTS[name]
    assert (result.verdict.kind, h.failing_side) == (kind, side), (name, result.verdict.summary, h.problems())
    assert h.first_divergence is None and h.n_apart == 0, (name, h)  # no desync: a KV that moves on one side only
    assert h.drafter_in_step is True, (name, h)
    assert h.structure["wrong"] == 0, (name, h.structure)
    errors = result.errors
    if kind == "kv_slot":
        assert len(errors) and set(errors["kind"]) == {"kv_slot"}, errors
    else:
        assert len(errors) == 0, errors


@pytest.mark.parametrize("name", [n for n in NAMES if VERDICTS[n] == ("kv_slot", "drafter")])
def test_dflash_at_the_context_end_fails_its_noise_block(runs: Runs, name: str) -> None:
    """The batch that found no room is the drafter's noise block, every row an output, reaching past what the
    slot's cache had stored; the requests still end (all answered)."""
    run, result, _ = runs.get(name)
    b = result.batches
    for line in result.errors["line"]:
        before = b[b["line"] < line].iloc[-1]
        assert before["context"] == "drafter" and before["n_outputs"] == before["n_tokens"] > 1, before
    assert all(r.ok for r in run.requests)


def test_a_prompt_longer_than_the_context_is_refused_before_any_batch(runs: Runs) -> None:
    run, result, _ = runs.get(PROMPT_TOO_LONG.name)
    refused = [r for r in run.requests if not r.ok]
    assert len(refused) == 1 and "400" in refused[0].error, run.requests
    assert [r.index for r in refused] == [0]  # the long prompt; the short one after it is answered
    first_error = int(result.errors["line"].iloc[0])
    target = result.batches[result.batches["context"] == "target"]
    assert first_error < int(target["line"].iloc[-1])  # the server went on serving


@pytest.mark.parametrize("name", NAMES)
def test_the_logs_counts_equal_the_servers_and_the_batches_add_up(runs: Runs, name: str) -> None:
    """The log's drafted and accepted totals equal /metrics on the failing runs too, and the reader's target
    batches hold the relation the counters imply: one verification per draft (fewer shaped ones only where
    slots share a batch with another's prompt). DFlash's drafter decodes one noise block per draft, plus the
    blocks that found no room (never verified) and at most one per stream closed before its verification."""
    run, result, _ = runs.get(name)
    sc = BY_NAME[name]
    c = server_counters(result, run.session)
    assert c is not None and c.agree is True, (name, c)
    drafts = c.drafts["server"]
    assert drafts, c
    b = result.batches
    several = b["pos_max"] - b["pos_min"] >= 1
    shaped = b[(b["n_outputs"] == b["n_tokens"]) & several]
    on_target = int((shaped["context"] == "target").sum())
    mixed = int(((b["n_outputs"] < b["n_tokens"]) & several & (b["context"] == "target")).sum())
    assert not (shaped["context"] == "unknown").any()
    if sc.concurrency == 1:
        assert on_target == drafts, (name, on_target, drafts)
    else:
        assert drafts - mixed <= on_target <= drafts, (name, on_target, mixed, drafts)
    if sc.spec_type == "draft-dflash":
        noise = int((shaped["context"] == "drafter").sum())
        no_room = int((result.errors["component"] == "drafter").sum())
        closed = sum(r.cancelled for r in run.requests)
        assert drafts + no_room <= noise <= drafts + no_room + closed, (name, noise, drafts, no_room, closed)
    else:
        assert not (shaped["context"] == "drafter").any()
