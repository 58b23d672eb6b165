"""Speculative runs with no drafter that decodes (docs/speculative-types.md#how-each-type-keeps-the-drafters-kv):
n-gram types, which have no drafter context, and a run where the server chose no type at all. Neither may be
read as "a drafter is in use"; the second is named as such, in the server's own words. Real b11434 logs: the
scenario captures, and a real llama-server given a draft model and no `--spec-type`."""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path

import pytest

from kvtrace import analyze
from kvtrace.analyze.findings.cycles import cycle_stats
from kvtrace.analyze.reader.attribution import NO_DRAFTER_HOW
from kvtrace.analyze.reader.records import verify_steps
from kvtrace.analyze.reader.session import free_port
from kvtrace.capture.models import ensure_models
from tests.capture.capture_helpers import NEEDS_SERVER, run_kvtrace

ROOT = Path(__file__).resolve().parents[3]
SCENARIOS = ROOT / "tests" / "fixtures" / "scenarios"
DRAFTER_IN_USE = "a drafter is in use"


@pytest.mark.parametrize("name", ["ngram-simple-1slot", "ngram-mod-2slots", "ngram-mod-defaults"])
def test_ngram_runs_claim_no_drafter(name: str) -> None:
    r = analyze.parse(str(SCENARIOS / f"{name}.log.gz"))
    assert r.meta["speculative"] and r.meta["drafter_kv"] == "none" and not r.meta["spec_none"]
    assert DRAFTER_IN_USE not in r.meta["context_attribution"]
    assert r.meta["context_attribution"] == NO_DRAFTER_HOW["ngram"]
    assert len(r.kv) and (r.kv.context == "target").all() and (r.batches.context == "target").all()
    assert "No speculative type" not in r.verdict.summary


def test_a_drafter_run_still_says_so() -> None:
    r = analyze.parse(str(SCENARIOS / "draft-simple-1slot.log.gz"))
    assert DRAFTER_IN_USE in r.meta["context_attribution"] and not r.meta["spec_none"]
    assert {"target", "drafter"} <= set(r.batches.context.astype(str))


@NEEDS_SERVER[0]
@NEEDS_SERVER[1]
def test_no_speculative_type_chosen_is_named(llama_server: Path, tmp_path: Path) -> None:
    """A draft model the server cannot place in a type (a plain drafter, no `--spec-type`): it is loaded, and
    nothing drafts. The reading says why, in the server's words, and gives no batch to a drafter."""
    pair = ensure_models()
    out = tmp_path / "s"
    proc = run_kvtrace(
        "capture", "run", "--ping", "2", "--max-tokens", "16", "--quiet", "--out", str(out), "--",
        str(llama_server), "-m", str(pair.target), "-md", str(pair.drafter), "--host", "127.0.0.1",
        "--port", str(free_port()), "-c", "512", "-np", "1",
        cwd=tmp_path, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    raw = (out / "raw.log").read_bytes()
    assert b"no implementations specified for speculative decoding" in raw
    assert b"loading draft model" in raw  # the drafter was loaded all the same
    r = analyze.parse(str(out))
    assert r.meta["spec_none"] and r.meta["spec_type"] == "none" and r.meta["drafter_kv"] == "none"
    assert r.meta["context_attribution"] == NO_DRAFTER_HOW["none"]
    assert len(r.batches) > 0 and (r.batches.context == "target").all()
    assert "No speculative type was chosen" in r.verdict.summary
    assert "no implementations specified for speculative decoding" in r.verdict.summary
    gz = tmp_path / "raw.log.gz"
    gz.write_bytes(gzip.compress(raw))
    assert analyze.parse(str(gz)).verdict.summary == r.verdict.summary  # the same from a saved copy


@NEEDS_SERVER[0]
@NEEDS_SERVER[1]
def test_llama_trace_steps_are_counted_once(llama_server: Path, tmp_path: Path) -> None:
    """Under LLAMA_TRACE=1 the server prints each draft step twice: `accepted  A/ N draft tokens` at INFO and, with
    `-v`, `accepted A/N draft tokens, new n_tokens = P` at DEBUG. Each step counts once: the steps' drafts add up
    to the requests' own `draft acceptance` lines."""
    pair = ensure_models()
    out = tmp_path / "s"
    proc = run_kvtrace(
        "capture", "run", "--ping", "2", "--max-tokens", "32", "--quiet", "--out", str(out), "--",
        str(llama_server), "-m", str(pair.target), "-md", str(pair.drafter), "--spec-type", "draft-simple",
        "--host", "127.0.0.1", "--port", str(free_port()), "-c", "512", "-np", "1",
        cwd=tmp_path, timeout=300, env={**os.environ, "LLAMA_TRACE": "1"},
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    raw = (out / "raw.log").read_text(encoding="utf-8", errors="replace")
    info = re.findall(r" I slot .*\| accepted +(\d+)/ *(\d+) draft tokens", raw)
    debug = re.findall(r" D slot .*\| accepted (\d+)/(\d+) draft tokens, new n_tokens", raw)
    assert len(info) >= len(debug) > 5  # both forms, one of each per step
    requests = [tuple(map(int, m)) for m in re.findall(r"\(\s*(\d+) accepted /\s*(\d+) generated\)", raw)]
    r = analyze.parse(str(out))
    assert len(r.events[r.events.kind == "accepted"]) == len(info) + len(debug)  # every line is kept
    steps = verify_steps(r.events)
    assert len(steps) == len(info)  # one per step, not per line
    assert int(steps.generated.sum()) == sum(g for _, g in requests) > 0
    assert int(steps.accepted.sum()) == sum(a for a, _ in requests)
    assert r.verdict.acceptance["per_step_lines"] == len(info)
    assert cycle_stats(r).n_verify_steps == len(info)
