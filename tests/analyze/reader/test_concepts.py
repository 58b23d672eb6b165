"""The failure-concept layer (analyze/reader/concepts.py) on its own examples, and what the reader makes of a line
only it reads: the concept's kind at a lower confidence, with its evidence line, never `no_log`; and never
ahead of a failure the pattern table read."""

from __future__ import annotations

import pytest

from kvtrace import analyze
from kvtrace.analyze.reader import walker
from kvtrace.analyze.reader.concepts import CONCEPT_PREFIX, CONCEPTS, Concept, code_of, crash_frame, recognise

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
    ("That returned ret == 1.\n", "kv_slot", "decode_failed"),  # the return code by its variable alone
    ("error: invalid argument: --draft-model\nProcess exited with code 1\n", "other", "crash_signal"),
    ("Batch offset=0x0 len=0x0 on queue 0 (aperture: 373.2Mb, 0.0Mb VRAM only)\n"
     "   BO: addr=0xffffeffeffffe000-0xffffeffeffffffff size=      8KB handle=00008 capture=1\n", "other", "device_lost"),
    # a .NET wrapper's exception about the context it holds, its frames without their indent (a paste lost it)
    ("System.ObjectDisposedException: Cannot access a disposed object.\n"
     "Object name: 'Cannot use this SafeLLamaContextHandle - it has been disposed'.\n"
     "at LLama.Native.SafeLLamaContextHandle.ThrowIfDisposed()\n", "other", "namespaced_exception"),
])
def test_a_wrapper_s_wording_gives_its_family_at_low_confidence(text: str, kind: str, variant: str) -> None:
    r = analyze.parse(text.encode())
    v = r.verdict
    assert v.kind == kind
    assert v.confidence == "low"
    assert v.proof == "runtime"  # a runtime's own log words, not a sentence of the report
    assert r.errors["variant"].iloc[0] == CONCEPT_PREFIX + variant
    assert v.evidence and v.evidence[0]["text"] in text
    assert "lower confidence" in v.summary


@pytest.mark.parametrize("text", [
    "From time to time llama-server crashes during prompt-eval.\n",
    "Works but randomly crashes during inference with error\n```\nllama-server: /\n",
    "The model crashes after a few requests.\n",
    "Server crashes with the drafter, log attached: [server.log](https://github.com/user-attachments/files/1/server.log)\n",
])
def test_a_failure_told_in_a_sentence_is_prose_with_no_side(text: str) -> None:
    """The layer reads the failure a sentence tells, but no log line shows it: `proof` says so, no side is named
    (not even the drafter a sentence mentions) and the summary says what to attach."""
    v = analyze.parse(text.encode()).verdict
    assert (v.kind, v.proof, v.component, v.component_evidence) == ("other", "prose", "unknown", None)
    assert "only in its own words" in v.summary and "lower confidence" not in v.summary


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


@pytest.mark.parametrize("prefix", ["Dec 31 01:55:57 FORGE ollama[555324]: ", "mar 15 11:39:07 acquario3 ollama[87551]: ",
                                    "ollama  | "])
def test_a_go_crash_dump_behind_a_journald_or_docker_prefix_is_a_crash(prefix: str) -> None:
    """The frames and registers of a Go crash dump (no panic line), each behind the prefix journald (in the
    machine's locale) or docker-compose put in front of it: the target's crash, not `no_log`."""
    dump = ["net.(*netFD).Read(0xc000619900, {0xc00035f000?, 0xc00029fad0?, 0x64c8249923c5?})",
            "        net/fd_posix.go:55 +0x25 fp=0xc00029faa8 sp=0xc00029fa60 pc=0x64c824a077a5",
            "created by github.com/ollama/ollama/llama/runner.Execute in goroutine 1",
            "rax    0x0", "rip    0x77f67e49eb1c"]
    r = analyze.parse("".join(prefix + line + "\n" for line in dump).encode())
    assert r.verdict.kind == "other" and r.verdict.component == "target"
    assert set(r.errors["variant"]) == {CONCEPT_PREFIX + "crash_signal"}
    assert recognise(prefix + "each request runs in its own goroutine") is None


def test_gdb_frames_that_end_in_its_detach_are_a_crash_of_the_target() -> None:
    """ggml_print_backtrace runs gdb only when the process is going down: frames through llama_decode and gdb's
    `[Inferior 1 (process N) detached]` are a crash, though no frame is a crash handler's."""
    text = ("#9  0x0000713f9c2be6df in llama_decode () from /opt/llama.cpp/build/bin/libllama.so.0\n"
            "#10 0x0000713f9c7fe13f in common_init_from_params(common_params&) () from libllama-common.so.0\n"
            "#11 0x0000585388c79258 in server_context_impl::load_model(common_params&) ()\n"
            "#12 0x0000585388bd342a in main ()\n"
            "[Inferior 1 (process 364811) detached]\n")
    r = analyze.parse(text.encode())
    assert r.verdict.kind == "other" and r.verdict.component == "target"
    assert r.errors["variant"].tolist() == [CONCEPT_PREFIX + "crash_signal"]


@pytest.mark.parametrize("text", [
    "[DEBUGGING]: test ret == 0 512 and 1\n[DEBUGGING]: test ret == 0 1 and 1346\n",  # decodes that worked
    "The server logged: Process exited with code 0\n",
])
def test_a_zero_return_or_exit_code_is_no_failure(text: str) -> None:
    assert analyze.parse(text.encode()).verdict.kind == "no_log"


def test_the_same_line_again_is_read_again_with_the_accelerator() -> None:
    """The C accelerator remembers unread lines by their masked text; a line the layer read must still come
    back to the walker the next time it appears (after a healthy stretch closed its failure)."""
    line = "Unhandled exception: LLamaDecodeError: NoKvSlot\n"
    filler = "".join(f"0.00.{i % 60:02d}.000.000 I srv  update_slots: all slots are idle\n" for i in range(40))
    r = analyze.parse((line + filler + line).encode())
    assert len(r.errors) == 2


def test_an_acceptance_in_prose_is_read_again_with_the_accelerator() -> None:
    """A prose acceptance is an event and no failure: the accelerator must still hand its line back to the
    walker the next time the same words come (in the same log or the next one)."""
    text = b"llama-server -m big.gguf -md small.gguf\nwe got a draft acceptance of 0.42 here\n"
    for _ in range(2):
        r = analyze.parse(text)
        assert r.events.kind.tolist() == ["prose_acceptance"]
        assert r.verdict.kind == "draft_stats_only"


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


@pytest.mark.parametrize("command", [
    "llama-server.exe -m Qwen3-4B-Q4_K_M.gguf -md Qwen3-0.6B-Q8_0.gguf --spec-type draft-simple --port 8085",
    "./build/bin/llama-server --model target.gguf --spec-type draft-mtp --spec-draft-n-max 3",
])
def test_acceptance_in_prose_beside_the_speculative_command_that_was_run_is_a_healthy_run(command: str) -> None:
    prose = "At n_max 64 this yields draft acceptance **0.070** (96 accepted / 1378 generated)"
    r = analyze.parse((command + "\n" + prose + "\n").encode())
    assert r.verdict.kind == "draft_stats_only"
    assert not r.verdict.acceptance  # still the reporter's figures
    assert analyze.parse((command + "\n").encode()).verdict.kind == "no_log"  # a command line alone is no log
    plain = "llama-server -m Qwen3-4B-Q4_K_M.gguf --port 8085"
    assert analyze.parse((plain + "\n" + prose + "\n").encode()).verdict.kind == "no_log"  # no speculative run


@pytest.mark.parametrize("prose", [
    "- Gemma 4 31B external MTP runtime check: MTP active, 112/141 accepted draft tokens, 108.27 tok/s",
    "Qwen3.6-27B IQ4_XS, draft-mtp n-max 4, FA on: ~45 t/s generation, 38-71% acceptance depending on context.",
    "- **MTP acceptance:** 78.7% in functional test, 210 / 267 accepted draft tokens",
    # the two counts told apart, the drafted first (tests/fixtures/blind/batch-10, report 29)
    "- `Qwen3.6-27B-MTP-Q8_0.gguf`: MTP output matched non-MTP greedy output; 18 draft tokens, 9 accepted.",
    "with the draft model: ~80 draft tokens from which 12 are accepted",
    # counted in drafts, llama.cpp's `#acc drafts` unit, with an n-gram type as the drafter (batch-11, report 24)
    "`ngram-map-k` 222.24 wall tok/s, 1.64x baseline, 112/112 accepted drafts",
    "ngram-mod: 40/52 accepted drafts at n_max 8",
])
def test_acceptance_in_prose_that_names_its_drafter_is_a_healthy_run(prose: str) -> None:
    """A measurement told in a report's words with the drafter it measured (MTP, a draft model) is a speculative
    run's statistics though no log line or command came with it; the figures stay the reporter's."""
    r = analyze.parse((prose + "\n").encode())
    assert r.verdict.kind == "draft_stats_only"
    assert not r.verdict.acceptance


def test_a_draft_token_count_with_no_accepted_count_is_no_statistics() -> None:
    """`none are accepted` is no figure (tests/fixtures/blind/batch-5, report 25, labelled no_log)."""
    prose = "with the draft model you get ~80 draft tokens from which none are accepted."
    assert analyze.parse((prose + "\n").encode()).verdict.kind == "no_log"


def test_acceptance_in_prose_that_names_only_speculative_decoding_is_no_log() -> None:
    """Speculative decoding named in general is no measured setup (a discussion of a 100 % acceptance bug)."""
    prose = "when using the ./speculative to run speculative inference, the acceptance rate will always be 100%."
    assert analyze.parse((prose + "\n").encode()).verdict.kind == "no_log"


def test_a_normal_marked_failure_quoted_as_why_the_server_died_stays_a_failure() -> None:
    line = ("llama_init_from_model: failed to initialize the context: Gemma4Assistant requires ctx_other to be set "
            "(this warning is normal during memory fitting)")
    died = analyze.parse(f"llama-server process has terminated: {line}\n".encode()).verdict
    assert (died.kind, died.component) == ("other", "drafter")
    assert analyze.parse(f"{line}\n".encode()).errors.empty  # alone, llama.cpp's own word: a start-up notice


def test_acceptance_in_prose_beside_a_quoted_command_on_one_line_is_a_healthy_run() -> None:
    """A results-table row holding the command that was run and its result: the flags are read and the
    acceptance told after them is still the report's prose acceptance."""
    row = ("| bench | PASS | `run --cases ngram-map-k --ctx-size 4096 --draft-max 8` ; `ngram-map-k` 222.24 tok/s, "
           "112/112 accepted drafts |")
    r = analyze.parse((row + "\n").encode())
    assert r.events.kind.tolist() == ["prose_acceptance"]
    assert r.verdict.kind == "draft_stats_only"
    assert not r.verdict.acceptance


def test_an_accepted_drafts_count_with_no_drafter_named_is_no_statistics() -> None:
    assert analyze.parse(b"the bench printed 12/40 accepted drafts\n").verdict.kind == "no_log"
