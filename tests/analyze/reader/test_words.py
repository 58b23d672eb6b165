"""A failure's words: read once, when the pattern table (or the concept layer) matches its first line, and carried
on its record (`errors.words`); what the findings cluster failures by. Nothing after the reader reads them again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvtrace import analyze
from kvtrace.analyze.reader.normalize import plain_words
from kvtrace.analyze.reader.patterns import PATTERNS

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("text", "variant", "words"), [
    # asserts: the condition as written (it is code), in each form builds print it
    ("/home/u/llama.cpp/ggml/src/ggml.c:13458: GGML_ASSERT(i01 >= 0 && i01 < ne01) failed\n", "ggml_assert",
     "GGML_ASSERT(i01 >= 0 && i01 < ne01)"),
    ("D:/a/llama.cpp/llama.cpp/ggml/src/ggml-backend.cpp:194: GGML_ASSERT(buffer) failed\n", "ggml_assert",
     "GGML_ASSERT(buffer)"),
    ("GGML_ASSERT: /Users/runner/llama.cpp/ggml.c:4000: ctx->mem_buffer != NULL\n", "ggml_assert_old",
     "GGML_ASSERT(ctx->mem_buffer != NULL)"),
    ("Assertion failed: n_tokens <= n_batch, file llama.cpp, line 1234\n", "msvc_assert", "assert(n_tokens <= n_batch)"),
    ("llama-server: llama.cpp:99: int main(): Assertion `ctx != nullptr' failed.\n", "c_assert",
     "assert(ctx != nullptr)"),
    ('/raid/llama/src/llama-context.cpp:2320: GGML_ASSERT(cparams.n_ubatch >= n_tokens && "encoder requires n_ubatch '
     '>= n_tokens") failed\n', "encoder_assert",
     'GGML_ASSERT(cparams.n_ubatch >= n_tokens && "encoder requires n_ubatch >= n_tokens")'),
    # a backend's error from its name on (a runtime's words before it left out)
    ("0.01.100.200 E CUDA error: out of memory\n", "cuda_error", "CUDA error: out of memory"),
    ("Error: an unknown error was encountered while running the model CUDA error: out of memory\n", "cuda_error",
     "CUDA error: out of memory"),
    # a load error: its innermost message, as plain words
    ("llama_model_load: error loading model: error loading model architecture: unknown model architecture: "
     "'pangu-embedded'\n", "model_load_error", "unknown model architecture: 'pangu-embedded'"),
    ("llama_model_load: error loading model: check_tensor_dims: tensor 'blk.0.attn_q_b.weight' has wrong shape; "
     "expected  1536, 24576, got  1536, 16384\n", "model_load_error",
     "check_tensor_dims: tensor 'blk.0.attn_q_b.weight' has wrong shape; expected N, N, got N, N"),
    # any other failure: its line's message as plain words (prefix, numbers left out)
    ("0.01.000.002 E decode: failed to find KV cache slot for ubatch of size 454\n", "no_kv_slot_old",
     "decode: failed to find KV cache slot for ubatch of size N"),
    ("3.28.378.764 E llama_decode: failed to decode, ret = -1\n", "llama_decode_ret",
     "llama_decode: failed to decode, ret = N"),
    # a follow-up line that is a failure of its own where none is open
    ("get_logits_ith: invalid logits id 2, reason: batch.logits[2] != true\n", "invalid_logits",
     "get_logits_ith: invalid logits id N, reason: batch.logits[N] != true"),
    # a position-error block: its header
    ("3.28.378.761 E init: the tokens of sequence 0 in the input batch have inconsistent sequence positions:\n",
     "unclosed", "init: the tokens of sequence N in the input batch have inconsistent sequence positions:"),
    # a runtime's words the concept layer read: the concept is its words
    ("LLamaSharp.Exceptions.LLamaDecodeError: NoKvSlot\n", "concept_no_kv_slot", "concept_no_kv_slot"),
])
def test_the_record_carries_the_failure_s_words(text: str, variant: str, words: str) -> None:
    e = analyze.parse(text.encode()).errors
    assert list(e["variant"]) == [variant]
    assert list(e["words"]) == [words]


@pytest.mark.parametrize(("text", "words"), [
    ("  current device: 0, in function alloc at /build/ggml-cuda.cu:412",
     "current device: N, in function alloc at ggml-cuda.cu"),
    ("ggml_vulkan: Device memory allocation of size 1073741824 failed at 0x7f3a",
     "ggml_vulkan: Device memory allocation of size N failed at 0x…"),
    ("x" * 1_000_000, "x" * 120),
])
def test_plain_words_leave_out_what_differs_between_runs(text: str, words: str) -> None:
    assert plain_words(text) == words


@pytest.mark.timeout(20)
@pytest.mark.parametrize("line", ["GGML_ASSERT(" * 100_000, "Assertion '" + "x" * 1_000_000, "/a" * 500_000,
                                  "CUDA error " + "1." * 500_000])
def test_plain_words_stay_fast_on_a_pasted_megabyte_line(line: str) -> None:
    """A stranger's paste can hold a 1 MB line; its start is what is read."""
    assert len(plain_words(line)) <= 120


def test_a_failure_s_words_are_kept_past_the_failures_that_keep_their_lines() -> None:
    """Failures after the first KEEP_LINES_FOR keep no text, and still their words (the identity needs no line)."""
    text = "".join(f"{i}.00.000.000 E /src/ggml.c:1: GGML_ASSERT(cond_{i % 3}) failed\n" for i in range(1100))
    e = analyze.parse(text.encode()).errors
    assert len(e) == 1100 and e["lines"].iloc[-1] == "[]"
    assert e["words"].iloc[-1] == "GGML_ASSERT(cond_1)"  # 1099 % 3


def _literals(pattern: str) -> set[str]:
    """The plain runs of letters (6 or more) a regex's source spells out."""
    return {w.lower() for w in re.findall(r"[A-Za-z_]{6,}", pattern.replace("\\", " "))}


def test_nothing_after_the_reader_parses_a_failure_s_line_again() -> None:
    """No regex in the findings, the fleet or the views spells a failure entry's anchor: they read the record."""
    anchors = {a.lower() for p in PATTERNS if p.family == "failure"
               for a in re.findall(r"[A-Za-z_]{6,}", p.anchor)}
    anchors -= {"failed", "failure", "context", "memory"}  # common words, not a failure's wording
    found = []
    for layer in ("findings", "fleet", "views", "dashboard", "cli"):
        for path in sorted((ROOT / "analyze" / layer).rglob("*.py")):
            for m in re.finditer(r"re\.compile\(\s*((?:r?\"[^\"\n]*\"\s*)+)", path.read_text(encoding="utf-8")):
                hit = _literals(m.group(1)) & anchors
                if hit:
                    found.append(f"{path.relative_to(ROOT)}: {sorted(hit)}")
    assert found == []


def test_the_findings_hold_no_words_parser_of_their_own() -> None:
    from kvtrace.analyze.findings import rules

    assert not hasattr(rules, "failure_words")
    assert "_ASSERTED" not in vars(rules) and "_LOAD_ERROR" not in vars(rules)
