"""Advice that knows the build (docs/llama-cpp-lines.md#versions-forks-and-their-debug-switches): beellama.cpp v0.4+ has no GGML_DFLASH_DEBUG, so the
steps and the rerun line rely on LLAMA_KV_CACHE_DEBUG; ik_llama.cpp has no batch or KV debug lines at all, so
nothing asks for them; the stale-trim lines are a turboquant-derived fork's, never "newer llama.cpp"'s."""

from __future__ import annotations

from pathlib import Path

from kvtrace import analyze
from kvtrace.analyze.findings.signatures import match_signature
from kvtrace.analyze.reader.patterns import PATTERNS
from kvtrace.analyze.views.report import github_comment, rerun_line

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus"
SEED = CORPUS / "00_beellama-28-multigpu-dflash-seed.log"
# beellama.cpp v0.4's start-up line (docs/llama-cpp-lines.md#versions-forks-and-their-debug-switches), as its server prints it
V04 = "0.00.412.118 W DFlash: omitted --spec-draft-n-max defaults to the drafter block depth (15)"
# ik_llama.cpp's `statistics` line (its dual speculation), as its server prints it (the pattern's example)
IK = "statistics ngram_mod(tail), blocked = 2/64, pos_accept=[87%,78%,68%,67%,58%,57%,49%,41%,...]"


def _with(tmp_path: Path, line: str) -> analyze.ParseResult:
    log = tmp_path / "report.log"
    log.write_text(line + "\n" + SEED.read_text(encoding="utf-8"), encoding="utf-8")
    return analyze.parse(str(log))


def test_before_v04_the_seed_is_told_to_set_the_dflash_switch() -> None:
    result = analyze.parse(str(SEED))
    m = match_signature(result)
    assert m.env.fork == ""
    assert any("GGML_DFLASH_DEBUG=1" in s for s in m.steps)
    assert "--dflash-debug" not in rerun_line(result)


def test_beellama_v04_relies_on_the_kv_cache_lines(tmp_path: Path) -> None:
    result = _with(tmp_path, V04)
    m = match_signature(result)
    assert m.env.fork == "beellama>=0.4"
    steps = "\n".join(m.steps)
    assert "beellama.cpp v0.4 or later: `GGML_DFLASH_DEBUG` does nothing there" in steps
    assert "GGML_DFLASH_DEBUG=1" not in steps and "LLAMA_KV_CACHE_DEBUG=1" in steps
    assert rerun_line(result).startswith("kvtrace capture run --dflash-debug off ")
    comment = github_comment(result)
    assert "GGML_DFLASH_DEBUG=1" not in comment


def test_ik_llama_is_told_what_its_capture_cannot_show(tmp_path: Path) -> None:
    result = _with(tmp_path, IK)
    m = match_signature(result)
    assert m.env.fork == "ik_llama"
    steps = "\n".join(m.steps)
    assert "ik_llama.cpp: it has no `LLAMA_BATCH_DEBUG`, no `LLAMA_KV_CACHE_DEBUG` and no X/Y position check" in steps
    assert "Rerun with `LLAMA_BATCH_DEBUG" not in steps
    assert "ik\\_llama.cpp has no" in github_comment(result) or "ik_llama.cpp has no" in github_comment(result)


def test_stale_trim_lines_are_labelled_a_forks() -> None:
    trims = [p for p in PATTERNS if p.name in ("draft_mirror_trim", "mtp_stale_trim", "draft_trim_failed")]
    assert len(trims) == 3
    for p in trims:
        assert p.builds.startswith("a turboquant-derived fork"), p.name
    assert not [p.name for p in PATTERNS if "newer than b11434" in (p.builds or "")]
