"""The Markdown triage report: verdict and numbers as prose, anything from the log inside unbreakable fences."""

from __future__ import annotations

import re
from pathlib import Path

from kvtrace import analyze
from kvtrace.analyze.views.report import advice, escape, fence, markdown_report

ROOT = Path(__file__).resolve().parents[3]
SEED = ROOT / "tests" / "fixtures" / "corpus" / "00_beellama-28-multigpu-dflash-seed.log"


def _fenced_blocks(md: str) -> list[tuple[str, list[str]]]:
    """(fence, body lines) for each fenced block, read the CommonMark way: closed by a fence at least as long."""
    blocks, lines, i = [], md.split("\n"), 0
    while i < len(lines):
        m = re.match(r"^(`{3,})", lines[i])
        if not m:
            i += 1
            continue
        opening, body, i = m.group(1), [], i + 1
        while i < len(lines) and not re.fullmatch(rf"`{{{len(opening)},}}\s*", lines[i]):
            body.append(lines[i])
            i += 1
        blocks.append((opening, body))
        i += 1
    return blocks


def _outside_fences(md: str) -> str:
    out, inside = [], None
    for line in md.split("\n"):
        m = re.match(r"^(`{3,})", line)
        if inside is None and m:
            inside = m.group(1)
        elif inside is not None and re.fullmatch(rf"`{{{len(inside)},}}\s*", line):
            inside = None
        elif inside is None:
            out.append(line)
    return "\n".join(out)


def test_seed_report_has_verdict_evidence_and_environment() -> None:
    md = markdown_report(analyze.parse(SEED), name=SEED.name)
    assert "X = 259" in md and "Y = 1361" in md and "gap 1101" in md
    assert "failing side: **drafter**" in md
    blocks = _fenced_blocks(md)
    evidence = next(body for _, body in blocks if any("inconsistent sequence positions" in b for b in body))
    # Evidence carries the log's own line numbers.
    assert any(re.match(r"^\s*149 \| .*Y = 1361", b) for b in evidence)
    assert any("dflash: drafter decode failed with -1" in b for b in evidence)
    env = "\n".join(next(body for _, body in blocks if any(b.startswith("backends:") for b in body)))
    assert "CUDA" in env and "07ac3cec6" in env
    # Nothing from the log outside the fences.
    assert "decode failed" not in _outside_fences(md)


def test_backticks_and_html_in_the_log_cannot_escape_the_fence() -> None:
    seed = SEED.read_text(encoding="utf-8")
    evil = "dflash: drafter decode failed with -1 ```` <img src=x onerror=alert(1)> **x**"
    md = markdown_report(analyze.parse(seed.replace("dflash: drafter decode failed with -1", evil).encode()))
    outside = _outside_fences(md)
    assert "<img" not in outside and "onerror" not in outside and "````" not in outside
    evidence = next((f, body) for f, body in _fenced_blocks(md) if any("onerror" in b for b in body))
    assert len(evidence[0]) >= 5, "the fence is longer than the longest backtick run inside"


def test_fence_and_escape_helpers() -> None:
    assert fence(["plain"]).startswith("```text\n")
    assert fence(["a ````` b"]).startswith("``````text\n")
    assert escape("a_b *c* <d> [e](f) $g$") == r"a\_b \*c\* \<d\> \[e\](f) \$g\$"


def test_source_path_never_leaks_into_the_title(tmp_path: Path) -> None:
    log = tmp_path / "private-folder" / "server.log"
    log.parent.mkdir()
    log.write_bytes(SEED.read_bytes())
    md = markdown_report(analyze.parse(log))
    assert "private-folder" not in md
    assert md.startswith("### kvtrace triage: server.log")


def test_every_verdict_kind_has_plain_advice() -> None:
    for kind in ("inconsistent_positions", "decode_failed", "kv_slot", "draft_stats_only", "other", "no_log"):
        text = advice(kind, "drafter")
        assert text and "{" not in text
