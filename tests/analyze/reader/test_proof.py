"""What a verdict stands on (analyze/reader/proof.py): quoted source code is no log line, a failure the concept
layer reads is a runtime's log words or a sentence of the report, and `proof` says which, in every verdict."""

from __future__ import annotations

import pytest

from kvtrace import analyze
from kvtrace.analyze.reader import proof


@pytest.mark.parametrize("line", proof.FENCE_EXAMPLES)
def test_a_c_or_cpp_fence_opens_quoted_source(line: str) -> None:
    assert proof.source_fence(line) is not None


@pytest.mark.parametrize("line", proof.FENCE_COUNTER_EXAMPLES)
def test_other_fences_and_lines_open_no_source(line: str) -> None:
    assert proof.source_fence(line) is None


def test_a_fence_closes_with_its_own_character_and_at_least_its_length() -> None:
    fence = proof.source_fence("````cpp")
    assert fence == ("`", 4)
    assert proof.closes_fence("````", fence) and proof.closes_fence("> `````", fence)
    assert not proof.closes_fence("```", fence) and not proof.closes_fence("~~~~", fence)
    assert not proof.closes_fence("````c", fence)


@pytest.mark.parametrize("line", proof.STATEMENT_EXAMPLES)
def test_a_statement_ending_in_a_semicolon_is_source(line: str) -> None:
    assert proof.source_statement(line)


@pytest.mark.parametrize("line", proof.STATEMENT_COUNTER_EXAMPLES)
def test_log_lines_are_no_statements(line: str) -> None:
    assert not proof.source_statement(line)


@pytest.mark.parametrize(("examples", "want"), [(proof.PROSE_EXAMPLES, "prose"), (proof.RUNTIME_EXAMPLES, "runtime"),
                                                (proof.LOG_EXAMPLES, "log")])
def test_each_line_shape_has_its_proof(examples: tuple[str, ...], want: str) -> None:
    assert {line: proof.line_proof(line) for line in examples} == dict.fromkeys(examples, want)


def test_a_megabyte_line_is_classified_at_once() -> None:
    import time

    for line in ("// " * 350_000 + ";", "a." * 500_000 + "(", "Error crashes with " * 60_000):
        start = time.perf_counter()
        proof.line_proof(line)
        proof.source_statement(line)
        assert time.perf_counter() - start < 1.0


def test_an_assert_quoted_as_cpp_source_is_no_log() -> None:
    """The issue's first case: a ```cpp quote of the assert's statement gave `abort_outside_speculation` on the
    target side; it is source code, and nothing else in the report is a log."""
    text = ("The server aborts when the prompt is long. I think this check is wrong:\n\n```cpp\n"
            "GGML_ASSERT(n_tokens_all <= cparams.n_batch);\n```\n\nAny ideas?\n")
    v = analyze.parse(text.encode()).verdict
    assert (v.kind, v.proof, v.n_errors, v.component) == ("no_log", None, 0, "unknown")


def test_a_quoted_statement_outside_a_fence_is_no_log_but_the_assert_line_is() -> None:
    quoted = "It aborts in this check:\n\n> GGML_ASSERT(n_tokens_all <= cparams.n_batch);\n"
    assert analyze.parse(quoted.encode()).verdict.kind == "no_log"
    logged = quoted + "\nllama.cpp/src/llama-context.cpp:1010: GGML_ASSERT(n_tokens_all <= cparams.n_batch) failed\n"
    v = analyze.parse(logged.encode()).verdict
    assert (v.kind, v.proof, v.confidence) == ("other", "log", "high")
    assert [e["line"] for e in v.evidence] == [5]


def test_lines_after_a_source_fence_are_read_again() -> None:
    text = ("```cpp\nGGML_ASSERT(x);\n```\n"
            "srv  update_slots: failed to decode the batch, n_batch = 1, ret = -1\n")
    v = analyze.parse(text.encode()).verdict
    assert (v.kind, v.proof) == ("decode_failed", "log")


def test_a_runtime_s_own_line_beats_a_sentence() -> None:
    """A sentence that tells of the crash, then the runtime's own line: the runtime's line decides, with its kind."""
    text = ("The model crashes after a few requests.\n\nLater in the log:\n\n"
            + "\n" * 40 + "Error: llama runner process has terminated: signal: aborted (core dumped)\n")
    v = analyze.parse(text.encode()).verdict
    assert (v.kind, v.proof) == ("other", "runtime")
    assert "terminated" in v.evidence[0]["text"]


def test_a_sentence_inside_a_fenced_block_is_a_program_s_output() -> None:
    """A runtime that words its error as sentences (LM Studio), pasted in a fence: its output, not the report's."""
    line = ("The number of tokens to keep from the initial prompt is greater than the context length. Try to load the "
            "model with a larger context length, or provide a shorter input")
    assert analyze.parse(f"{line}\n".encode()).verdict.proof == "prose"
    v = analyze.parse(f"I get this error:\n\n```\n{line}\n```\n".encode()).verdict
    assert (v.kind, v.proof) == ("kv_slot", "runtime")


@pytest.mark.parametrize(("text", "want"), [
    (b"", None),
    (b"Thanks, it works now.\n", None),
    (b"llama_decode: failed to decode, ret = -1\n", "log"),
    (b"srv  params_from_: Chat format: Hermes 2 Pro\n", "log"),
    (b"The run said: draft acceptance rate = 0.75 with MTP\n", "prose"),
    (b"draft acceptance rate = 0.50000 (   10 accepted /    20 generated)\n", "log"),
])
def test_every_verdict_kind_has_its_proof(text: bytes, want: str | None) -> None:
    assert analyze.parse(text).verdict.proof == want
