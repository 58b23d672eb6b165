"""The failure-concept layer (analyze/concepts.py) on its own examples, and what the reader makes of a line
only it reads: the concept's kind at a lower confidence, with its evidence line, never `no_log`; and never
ahead of a failure the pattern table read."""

from __future__ import annotations

import pytest

import analyze
from analyze import walker
from analyze.concepts import CONCEPT_PREFIX, CONCEPTS, Concept, code_of, crash_frame, recognise

EXAMPLES = [pytest.param(c, line, id=f"{c.name}-{i}") for c in CONCEPTS for i, line in enumerate(c.examples)]
NOT_EXAMPLES = [pytest.param(c, line, id=f"{c.name}-not-{i}") for c in CONCEPTS
                for i, line in enumerate(c.not_examples)]


def test_every_concept_has_examples_both_ways_and_a_name_of_its_own() -> None:
    assert [c.name for c in CONCEPTS if not c.examples or not c.not_examples] == []
    assert len({c.name for c in CONCEPTS}) == len(CONCEPTS)


@pytest.mark.parametrize(("concept", "line"), EXAMPLES)
def test_the_example_is_given_to_its_concept(concept: Concept, line: str) -> None:
    found = recognise(line)
    assert found is not None, "no concept reads it"
    assert found[0].name == concept.name


@pytest.mark.parametrize(("concept", "line"), NOT_EXAMPLES)
def test_words_that_report_no_failure_are_not_read(concept: Concept, line: str) -> None:
    assert recognise(line) is None


@pytest.mark.parametrize("line", [
    "speculative decoding gives about 1.8x on decode",
    "eval time =    1234.56 ms /   128 runs   (    9.64 ms per token,   103.69 tokens per second)",
    "llama_kv_cache: size =  256.00 MiB (  2048 cells,  32 layers,  1/1 seqs)",
    "load_tensors: loading model tensors, this can take a while... (mmap = true)",
    "I think the context window is too small for this, but it works",
    "UnicodeDecodeError: 'utf-8' codec can't decode byte 0x80",
])
def test_ordinary_log_lines_and_prose_are_not_failures(line: str) -> None:
    assert recognise(line) is None


@pytest.mark.parametrize(("line", "ret"), [("DecodeError(-1)", -1), ("Decode Error 1", 1),
                                           ("RuntimeError: llama_decode failed with code -3", -3),
                                           ("Error: failed to decode prompt", None)])
def test_a_return_code_named_after_the_failure_is_read(line: str, ret: int | None) -> None:
    found = recognise(line)
    assert found is not None
    assert code_of(found[1]) == ret


def test_the_table_reads_these_lines_first() -> None:
    """A line the pattern table knows never reaches the layer: the walker takes the table's entry."""
    for line in ("RuntimeError: llama_decode returned -1", "panic: failed to decode batch: could not find a kv cache slot",
                 "CUDA error: an illegal memory access was encountered"):
        assert walker._first(line) is not None  # noqa: SLF001 - the walker's own lookup


@pytest.mark.parametrize(("text", "kind", "variant"), [
    ("Unhandled exception. LLama.Exceptions.LLamaDecodeError: NoKvSlot\n   at LLama.Native.SafeLLamaContextHandle.Decode()\n",
     "kv_slot", "no_kv_slot"),
    ("Exception in thread: Decode Error -1\n", "decode_failed", "decode_failed"),
    ("Decode Error 1\n", "kv_slot", "decode_failed"),  # llama_decode's 1 is `no KV slot`
    ("Error: llama runner process has terminated: signal: illegal instruction (core dumped)\n", "other", "crash_signal"),
    ("vk::DeviceLost\nError: device lost\n", "other", "device_lost"),
    ("ValueError: Failed to load model from file: models/7B/ggml-model-q4_0.gguf\n", "other", "load_failed"),
])
def test_a_wrapper_s_wording_gives_its_family_at_low_confidence(text: str, kind: str, variant: str) -> None:
    r = analyze.parse(text.encode())
    v = r.verdict
    assert v.kind == kind
    assert v.confidence == "low"
    assert r.errors["variant"].iloc[0] == CONCEPT_PREFIX + variant
    assert v.evidence and v.evidence[0]["text"] in text
    assert "lower confidence" in v.summary


def test_prose_alone_is_no_log_and_a_table_failure_wins_over_a_concept() -> None:
    assert analyze.parse(b"Thanks, speculative decoding works now.\nThe decode speed doubled.\n").verdict.kind == "no_log"
    text = (b"LLamaSharp: DecodeError(-1)\n"
            b"srv  update_slots: failed to decode the batch, n_batch = 1, ret = 1\n")
    v = analyze.parse(text).verdict
    assert v.kind == "kv_slot" and v.confidence == "high"


def test_a_draft_model_named_in_the_line_is_the_drafter_s_failure() -> None:
    r = analyze.parse(b"Error: unable to load draft model 'draft.gguf'\n")
    assert r.verdict.kind == "other"
    assert r.verdict.component == "drafter"
    assert r.verdict.component_evidence == 1


def test_a_backtrace_pasted_alone_is_a_crash() -> None:
    """Frames only a crash runs (ggml's handlers, std::terminate) with no failure line before them."""
    text = ("#0  0x00007f in __GI___wait4 (pid=1) at wait4.c:30\n"
            "#1  0x00007f in ggml_print_backtrace () from libggml-base.so\n"
            "#2  0x00007f in std::terminate() () from libstdc++.so.6\n")
    r = analyze.parse(text.encode())
    assert r.verdict.kind == "other"
    assert r.errors["variant"].tolist() == [CONCEPT_PREFIX + "crash_signal"]
    assert crash_frame("ggml_abort") and not crash_frame("llama_decode")


def test_the_same_line_again_is_read_again_with_the_accelerator() -> None:
    """The C accelerator remembers unread lines by their masked text; a line the layer read must still come
    back to the walker the next time it appears (after a healthy stretch closed its failure)."""
    line = "Unhandled exception: LLamaDecodeError: NoKvSlot\n"
    filler = "".join(f"0.00.{i % 60:02d}.000.000 I srv  update_slots: all slots are idle\n" for i in range(40))
    r = analyze.parse((line + filler + line).encode())
    assert len(r.errors) == 2


def test_a_failure_right_after_a_line_with_a_re_wrap_cue_is_still_read() -> None:
    """A line naming a position may be a re-wrapped line's start; the failure after it is not its end."""
    text = (b"[Context Shifting: Erased 106 tokens at position 9339]\n"
            b"Processing Prompt [BATCH] (431 / 431 tokens)exception: access violation reading 0x10\n")
    r = analyze.parse(text)
    assert r.errors["variant"].tolist() == [CONCEPT_PREFIX + "crash_signal"]
    assert r.verdict.kind == "other"


@pytest.mark.parametrize("prose", [
    "with speculative decoding on, draft acceptance is very low, ~0.5.",
    "`draft acceptance` 0.41-0.65 at n_max 3, 0.29-0.43 at n_max 5",
    "the acceptance rate dropped to 45% after the update",
    "llama-server generates less drafted tokens: we only see 154/156 drafted tokens in",  # llama.cpp's count
])
def test_acceptance_in_prose_beside_healthy_lines_is_a_healthy_run(prose: str) -> None:
    healthy = "0.31.295.972 I srv  llama_server: listening on http://127.0.0.1:8081\n"
    r = analyze.parse((prose + "\n" + healthy).encode())
    assert r.verdict.kind == "draft_stats_only"
    assert not r.verdict.acceptance  # the reporter's figures never become the log's counts
    assert analyze.parse((prose + "\n").encode()).verdict.kind == "no_log"  # prose alone has no log
    assert analyze.parse(healthy.encode()).verdict.kind == "other"


def test_a_normal_marked_failure_quoted_as_why_the_server_died_stays_a_failure() -> None:
    line = ("llama_init_from_model: failed to initialize the context: Gemma4Assistant requires ctx_other to be set "
            "(this warning is normal during memory fitting)")
    died = analyze.parse(f"llama-server process has terminated: {line}\n".encode()).verdict
    assert (died.kind, died.component) == ("other", "drafter")
    assert analyze.parse(f"{line}\n".encode()).errors.empty  # alone, llama.cpp's own word: a start-up notice
