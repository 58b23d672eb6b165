"""The blind batches (tests/fixtures/blind/): real reports collected and labelled apart from the rules, each
scored before any change for it (benchmarks/README.md). Kept as a guard: the reader stays above the issue's
bars on them, and reports of one bug in them share a cluster (one signature on one side)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kvtrace import analyze
from kvtrace.analyze.findings.signatures import match_signature

ROOT = Path(__file__).resolve().parents[3]
BLIND = ROOT / "tests" / "fixtures" / "blind"
sys.path.insert(0, str(ROOT / "benchmarks"))

from corpus_accuracy import read, score  # noqa: E402

BATCHES = sorted(p for p in BLIND.iterdir() if (p / "labels.json").is_file())
# Reports of one bug, read from their threads and notes
SAME_BUG = (
    ("batch-2/06_llama-cpp-python-1855-invalid-logits-id-minus1-zsh-segfault.txt",
     "batch-2/07_gpustack-2387-llama-box-gemma3-image-invalid-logits-bracket-ts.txt"),
    # one scheduler assert reached from llama.cpp and from ollama (after batch 14 was scored: clustering only)
    ("batch-14/03_ggml-org-llama.cpp-24132-gemma4-sched-split-inputs-assert.txt",
     "batch-14/27_ollama-ollama-16506-ggml-assert-split-inputs.txt"),
)
# One cause (a batch smaller than the tokens it was given) tripping two different checks: one signature and side,
# but triage's clusters follow the failing check's words, so each check is a cluster of its own
SAME_CAUSE_OTHER_CHECKS = ("batch-1/03_wasmedge-wasinn-70-2023-old-assert-format-zsh-abort.txt",
                           "batch-1/04_llamacpp-3058-2023-ggml-alloc-assert-abort-trap.txt")
# Reports of different bugs under one signature: different asserts, a CUDA error other than out of memory
OTHER_BUGS = (
    ("batch-14/24_ollama-ollama-9515-ggml-assert-unary-init.txt",
     "batch-14/28_ollama-ollama-7590-ggml-assert-mllama-sigsegv.txt"),
    ("batch-14/15_ggml-org-llama.cpp-13909-deepseek-r1-cuda-illegal-memory-access.txt",
     "batch-14/21_ollama-ollama-3237-cuda-oom-ggml-assert.txt"),
)


# A batch scored blind and not yet tuned for (benchmarks/README.md) is held at its blind figures (field, kind
# right, named), not at the bars the batches with an after round clear.
UNTUNED: dict[str, tuple[float, int, int]] = {"batch-12": (0.901, 11, 8)}
# The batches hold 15 reports or more. Batch 12 is short: the unused, unreserved public threads with a log ran
# out at 12, so it is a supplementary measurement, held at its blind figures like any untuned batch.
SHORT: dict[str, int] = {"batch-12": 12}
# A batch whose after round left labels missed on purpose (benchmarks/README.md says which and why) is held at
# its after figures: batch 11's six crashes with no speculative line are labelled component `unknown` where the
# reader's documented rule (and earlier batches' labellers) say `target`, and its `t/s @ 73.9%` table is one
# report's notation.
BELOW_BARS: dict[str, tuple[float, int, int]] = {"batch-11": (0.920, 14, 9)}


@pytest.mark.parametrize("batch", [b for b in BATCHES if b.name in UNTUNED], ids=lambda p: p.name)
def test_the_untuned_batch_keeps_its_blind_score(batch: Path) -> None:
    s = score(batch, json.loads((batch / "labels.json").read_text(encoding="utf-8")), header=True)
    field, kinds, named = UNTUNED[batch.name]
    assert s["reports"] >= SHORT.get(batch.name, 15)
    assert round(s["field_accuracy"], 3) >= field and s["kind_right"] >= kinds and s["named"] >= named, s["misses"]


@pytest.mark.parametrize("batch", [b for b in BATCHES if b.name in BELOW_BARS], ids=lambda p: p.name)
def test_a_batch_below_the_bars_keeps_its_after_score(batch: Path) -> None:
    s = score(batch, json.loads((batch / "labels.json").read_text(encoding="utf-8")), header=True)
    field, kinds, named = BELOW_BARS[batch.name]
    assert s["reports"] >= 15
    assert round(s["field_accuracy"], 3) >= field and s["kind_right"] >= kinds and s["named"] >= named, s["misses"]


# Batch 14, the last, was scored blind and never tuned for: it clears the bars as collected, so it is held to them
# with the batches that cleared them after their rounds.
@pytest.mark.parametrize("batch", [b for b in BATCHES if b.name not in UNTUNED and b.name not in BELOW_BARS],
                         ids=lambda p: p.name)
def test_the_reader_clears_the_bars_on_every_blind_batch(batch: Path) -> None:
    s = score(batch, json.loads((batch / "labels.json").read_text(encoding="utf-8")), header=True)
    assert s["reports"] >= 15
    assert s["field_accuracy"] >= 0.95, s["misses"]
    assert s["kind_right"] >= 0.9 * s["kinds"], s["misses"]
    assert s["named_share"] >= 0.8, s["misses"]


def _cluster_of(name: str) -> tuple[str, str, str]:
    """What triage --table clusters a report by: its signature, its side and its failure's own words."""
    result = analyze.parse(read(BLIND / name, True), name=name)
    m = match_signature(result)
    assert m.signature.failure
    return m.name, result.verdict.component, m.match.identity


@pytest.mark.parametrize("reports", SAME_BUG, ids=lambda r: r[0].split("/")[1][:20])
def test_reports_of_one_bug_share_a_cluster(reports: tuple[str, ...]) -> None:
    clusters = {_cluster_of(name) for name in reports}
    assert len(clusters) == 1, clusters


@pytest.mark.parametrize("reports", OTHER_BUGS, ids=lambda r: r[0].split("/")[1][:20])
def test_reports_of_other_bugs_under_one_signature_are_apart(reports: tuple[str, ...]) -> None:
    clusters = [_cluster_of(name) for name in reports]
    assert len({c[0] for c in clusters}) == 1 and len(set(clusters)) == len(reports), clusters


def test_one_cause_through_two_checks_shares_signature_and_side_not_cluster() -> None:
    (sig_a, side_a, words_a), (sig_b, side_b, words_b) = map(_cluster_of, SAME_CAUSE_OTHER_CHECKS)
    assert (sig_a, side_a) == (sig_b, side_b) == ("abort_outside_speculation", "target")
    assert (words_a, words_b) == ("GGML_ASSERT(n_tokens <= n_batch)", 'GGML_ASSERT(!"not enough space in the buffer")')
