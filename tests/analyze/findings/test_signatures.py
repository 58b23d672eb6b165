"""Failure signatures on real lines: the corpus reports, engine captures with each fault, the sample
sessions, and lines built to docs/llama-cpp-lines.md where no real log has the wording."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtrace import analyze
from kvtrace.analyze.findings.signatures import BY_NAME, DEBUG_ENV, SIGNATURES, match_signature
from kvtrace.analyze.reader.session import new_session
from kvtrace.capture.engine import EngineConfig, run_engine
from tests.analyze.reader.formats import drafter_failure, new_scheme, position_error, stale_drafter_log
from tests.conftest import CORPUS, corpus_labels

ROOT = Path(__file__).resolve().parents[3]
LABELS = corpus_labels()

# The bug each report shows, read from its thread (and the notes in labels.json).
EXPECTED = {
    "00_beellama-28-multigpu-dflash-seed.log": "stale_drafter_kv",
    "01_beellama-27-dflash-drafter-consecutive.log": "stale_drafter_kv",
    "03_turboquant-pr306-mtp-ctx-dft-mrope.log": "mrope_position_order",
    "08_llamacpp-17316-http500-seq2-parallel.log": "parallel_slot_mismatch",
    "10_llamacpp-19953-vulkan-ngram-seq3-datetime-pid-prefix.log": "target_position_mismatch",
    "13_llamacpp-4185-docker-compose-kv-free-space.log": "kv_cache_full",
    "16_club3090-1106-deepseek-draft-acceptance-OK.log": "healthy_speculative",
    "18_llamacpp-pr2926-speculative-poc-cli-stats-OK.log": "healthy_speculative",
    "21_buun-57-mtp-parallel-mrope-x-le-y.log": "mrope_position_order",
    "23_buun-21-dflash-assert-encode-nubatch.log": "speculative_assert",
    "30_llamacpp-22218-ngram-mod-zero-drafts-OK.log": "healthy_speculative",
    "31_llama-swap-726-per-step-accepted-draft-tokens-OK.log": "healthy_speculative",
    "33_llamafile-244-epoch-prefix-kv-free-space.log": "kv_cache_full",
    "40_llamacpp-16876-lmstudio-qwenvl-image-batch-mrope-no-spec.log": "multimodal_positions",
    "41_llamacpp-10547-draft-model-kv-ret1-after-gen-draft.log": "draft_kv_full",
    "42_llamacpp-27839-mtp-context-requested-from-dflash-draft.log": "draft_context_failed",
    "43_am17an-pr6-mtp-context-compute-buffer-oom.log": "draft_context_failed",
    "44_unsloth-6159-spec-mtp-context-measure-failed.log": "draft_context_failed",
    "45_llamacpp-22337-mtp-head-and-draft-load-invalid-subscript.log": "draft_context_failed",
    "46_llamafile-238-kv-free-space-bare-lines.log": "kv_cache_full",
    "47_gpustack-1442-llama-box-4digit-minutes-kv-free-space.log": "kv_cache_full",
    "48_ollama-10811-compose-cannot-decode-use-encode.log": "encoder_model_decoded",
    "49_memos-103-ollama-runner-embed-cannot-decode.log": "encoder_model_decoded",
    "50_lmstudio-524-gemma3-decode-ret-minus3-prose.log": "decode_compute_failed",
    "51_llamacpp-12726-llamasharp-prepare-ubatch-ret-minus3.log": "decode_compute_failed",
    "52_llamacpp-pr23398-stepfun-mtp-init-assert-buffer.log": "draft_context_failed",
    "53_llamacpp-pr22673-recurrent-rollback-assert-no-spec.log": "abort_outside_speculation",
    "54_llamacpp-9170-mamba-assert-old-server-info-kv.log": "abort_outside_speculation",
    "55_llamacpp-11638-qwen2vl-glued-chars-eval-tokens-ret1.log": "kv_cache_full",
    "56_llamacpp-pr27210-adaptive-mtp-depth-OK.log": "healthy_speculative",
    "57_llamacpp-pr18211-per-round-accepted-draft-OK.log": "healthy_speculative",
    "58_jamepeng-lcpp-python-75-find-slot-non-consecutive-warnings.log": "unclassified",
    "59_turboquant-179-find-slot-non-consecutive-image-warnings.log": "unclassified",
    "60_ollama-10127-go-runner-panic-kv-slot.log": "kv_cache_full",
    "61_llamacpp-14097-gemma3-parallel-memory-slot.log": "kv_cache_full",
    "62_llamacpp-pr27752-glm5next-prepare-attention-ubatches.log": "kv_cache_full",
    "63_llamasharp-1251-encode-fallback-then-ggml-assert.log": "abort_outside_speculation",
    "64_ik-llama-1159-spec-assert-glued-ptrace.log": "speculative_assert",
    "65_textgen-6759-python-traceback-decode-ret1.log": "kv_cache_full",
    "66_llamacpp-pr25604-eagle3-layer-input-null-assert.log": "hidden_state_mismatch",
    "67_llamacpp-pr18039-eagle3-layer-input-null-quoted.log": "hidden_state_mismatch",
    "68_koboldcpp-1535-kv-slot-then-seq-not-from-last-position.log": "target_position_mismatch",
    "69_llamacpp-14204-embedding-server-invalid-input-batch-json.log": "unclassified",
}
# What each label's error kind allows (the signature refines the verdict, never contradicts it).
ALLOWED = {
    "inconsistent_positions": {"stale_drafter_kv", "mrope_position_order", "drafter_not_rolled_back",
                               "parallel_slot_mismatch", "multimodal_positions", "target_position_mismatch",
                               "unclassified"},
    "decode_failed": {"positions_not_continuous", "parallel_slot_mismatch", "multimodal_positions",
                      "target_position_mismatch",
                      "encoder_model_decoded", "decode_compute_failed", "unclassified"},
    "kv_slot": {"kv_cache_full", "draft_kv_full"},
    "draft_stats_only": {"healthy_speculative"},
    "other": {"speculative_assert", "draft_context_failed", "hidden_state_mismatch", "abort_outside_speculation",
              "unclassified"},
}
# Reports of one bug (read from their threads) must share a cluster: one signature on one side.
SAME_BUG = (
    ("42_llamacpp-27839-mtp-context-requested-from-dflash-draft.log", "43_am17an-pr6-mtp-context-compute-buffer-oom.log",
     "44_unsloth-6159-spec-mtp-context-measure-failed.log"),
    ("48_ollama-10811-compose-cannot-decode-use-encode.log", "49_memos-103-ollama-runner-embed-cannot-decode.log"),
    ("50_lmstudio-524-gemma3-decode-ret-minus3-prose.log", "51_llamacpp-12726-llamasharp-prepare-ubatch-ret-minus3.log"),
    ("00_beellama-28-multigpu-dflash-seed.log", "01_beellama-27-dflash-drafter-consecutive.log"),
    ("13_llamacpp-4185-docker-compose-kv-free-space.log", "33_llamafile-244-epoch-prefix-kv-free-space.log",
     "46_llamafile-238-kv-free-space-bare-lines.log", "61_llamacpp-14097-gemma3-parallel-memory-slot.log"),
)


def test_every_corpus_report_has_an_expected_signature() -> None:
    assert sorted(EXPECTED) == sorted(LABELS)
    assert set(EXPECTED.values()) <= set(BY_NAME)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_report_signature(name: str) -> None:
    m = match_signature(analyze.parse(CORPUS / name))
    assert m.name == EXPECTED[name]
    assert m.name in ALLOWED[LABELS[name]["error_kind"]]
    assert m.signature.failure == _failing(name)
    text = (CORPUS / name).read_text(encoding="utf-8").splitlines()
    for line, quoted in m.match.evidence:  # evidence quotes the log at its own line numbers
        assert text[line - 1].strip().endswith(quoted.strip()[-60:])
    assert m.steps and all("{" not in s for s in m.steps)


def _failing(name: str) -> bool:
    entry = json.loads((CORPUS / "labels.json").read_text(encoding="utf-8"))[name]
    return bool(entry["expected"]["error_kind"] != "draft_stats_only" and entry.get("failing", True))


def test_most_failing_reports_get_a_named_signature() -> None:
    """The issue's bar: >= 80 % of the failing reports in the fixtures are named (not `unclassified`)."""
    failing = [n for n in LABELS if _failing(n)]
    named = [n for n in failing if match_signature(analyze.parse(CORPUS / n)).name != "unclassified"]
    assert len(failing) >= 30
    assert len(named) / len(failing) >= 0.8, sorted(set(failing) - set(named))


@pytest.mark.parametrize("group", SAME_BUG, ids=lambda g: g[0][:12])
def test_reports_of_one_bug_share_a_cluster(group: tuple[str, ...]) -> None:
    clusters = set()
    for name in group:
        result = analyze.parse(CORPUS / name)
        m = match_signature(result)
        assert m.name != "unclassified"
        clusters.add((m.name, result.verdict.component))
    assert len(clusters) == 1, clusters


def test_seed_report_numbers_and_steps_fit_its_setup() -> None:
    m = match_signature(analyze.parse(CORPUS / "00_beellama-28-multigpu-dflash-seed.log"))
    assert m.match.facts == {"x": 259, "y_min": 1360, "y_max": 1362, "n": 3}
    assert {149, 156} <= {line for line, _ in m.match.evidence}
    env = m.env
    assert (env.n_gpus, env.spec_type, env.kv_unified, env.parallel, env.dflash) == (2, "dflash", True, 1, True)
    assert env.build == "9459-07ac3cec6"
    steps = "\n".join(m.steps)
    assert "beellama.cpp v0.3.0 clears stale drafter KV" in steps
    assert "2 devices (CUDA0, CUDA1)" in steps and "--kv-unified" in steps and DEBUG_ENV in steps
    assert "--parallel 1" not in steps  # the report already ran one slot
    assert "9459-07ac3cec6" in steps


def test_steps_follow_the_log_not_a_fixed_list() -> None:
    m = match_signature(analyze.parse(CORPUS / "01_beellama-27-dflash-drafter-consecutive.log"))
    steps = "\n".join(m.steps)
    assert "v0.3.0" in steps and "single GPU" not in steps and "--kv-unified" not in steps


@pytest.fixture(scope="module")
def engine_captures(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, bool], Path]:
    out = {}
    for fault in ("none", "stale-drafter", "no-rollback"):
        for drafting in ("block", "chain"):
            for kv in (True, False):
                path = tmp_path_factory.mktemp(f"{fault}-{drafting}-{int(kv)}")
                run_engine(EngineConfig(fault=fault, requests=3, cycles=24, drafting=drafting, kv_debug=kv),
                           new_session("engine", out=path))
                out[(fault, drafting, kv)] = path
    return out


FAULT_SIGNATURE = {"none": "healthy_speculative", "stale-drafter": "stale_drafter_kv",
                   "no-rollback": "drafter_not_rolled_back"}


@pytest.mark.engine
@pytest.mark.parametrize("fault", sorted(FAULT_SIGNATURE))
def test_engine_capture_signature(fault: str, engine_captures: dict) -> None:
    for (f, drafting, kv), path in engine_captures.items():
        if f != fault:
            continue
        m = match_signature(analyze.parse(path))
        assert m.name == FAULT_SIGNATURE[fault], (drafting, kv)
        c = m.cycles
        assert c.source == ("kv" if kv else "batches") and c.n_cycles > 40
        assert c.drafter_in_step is (fault == "none"), (drafting, kv, c)
        if fault == "stale-drafter":
            assert m.match.facts["n"] == len(analyze.parse(path).errors)
            assert m.match.facts["y_max"] > m.match.facts["x"]
        if fault == "no-rollback":
            assert m.match.facts["x"] >= m.match.facts["y"]


@pytest.mark.engine
def test_healthy_engine_runs_are_not_flagged(engine_captures: dict) -> None:
    for (fault, drafting, kv), path in engine_captures.items():
        if fault != "none":
            continue
        m = match_signature(analyze.parse(path))
        assert not m.signature.failure and m.match.evidence == ()
        assert m.cycles.in_step == m.cycles.n_cycles, (drafting, kv)
        assert m.match.facts["mean_accepted_len"] > 1
        assert "no failure" in m.match.detail


@pytest.mark.parametrize(("sample", "expected"), [("healthy", "healthy_speculative"),
                                                  ("stale-drafter", "stale_drafter_kv"),
                                                  ("no-rollback", "drafter_not_rolled_back")])
def test_sample_sessions(sample: str, expected: str) -> None:
    assert match_signature(analyze.parse(ROOT / "samples" / sample)).name == expected


def _parse_lines(lines: list[str]) -> analyze.ParseResult:
    return analyze.parse(("\n".join(lines) + "\n").encode())


def test_positions_not_continuous_inside_one_batch() -> None:
    r = _parse_lines([
        "0.01.000.001 I common_speculative_init: adding implementation draft-simple",
        "0.01.000.002 E init: sequence 0 positions are not continuous",
        "0.01.000.003 E decode: failed to initialize batch",
        "0.01.000.004 E llama_decode: failed to decode, ret = -1",
        "0.01.000.005 E srv        decode: Invalid input batch. off = 0, n_batch = 2048, ret = -1",
    ])
    m = match_signature(r)
    assert m.name == "positions_not_continuous" and m.match.key == "not_continuous"
    assert m.match.evidence[0] == (2, "0.01.000.002 E init: sequence 0 positions are not continuous")


def test_kv_cache_full_with_context_shift() -> None:
    r = _parse_lines([
        "slot update_slots: id  0 | task 3 | slot context shift, n_keep = 0, n_left = 4094, n_discard = 2047",
        "decode: failed to find a memory slot for batch of size 512",
        "srv  update_slots: failed to find free space in the KV cache, retrying with smaller batch size, off = 0, "
        "n_batch = 256, ret = 1",
    ])
    m = match_signature(r)
    assert m.name == "kv_cache_full"
    # the decode's warning and the server's retry line are one failure
    assert m.match.facts == {"n": 1, "context_shifts": 1}
    assert any("--ctx-size" in s for s in m.steps)


def test_mrope_le_variant_built_to_the_notes() -> None:
    e = new_scheme(44.0, "E")
    lines = position_error(e, 0, 65, 20, closing="mrope_le") + [f"{new_scheme(44.1, 'W')}draft: llama_decode returned -1"]
    m = match_signature(_parse_lines(lines))
    assert m.name == "mrope_position_order"
    assert m.match.facts["op"] == "<=" and (m.match.facts["x"], m.match.facts["y"]) == (65, 20)
    assert m.env.mrope


def test_stale_drafter_with_the_fix_already_running_says_so() -> None:
    m = match_signature(analyze.parse(stale_drafter_log().encode()))
    assert m.name == "stale_drafter_kv" and m.env.stale_kv_clear
    steps = "\n".join(m.steps)
    assert "already shows the v0.3.0 stale-KV clear" in steps and "upgrade" not in steps
    assert DEBUG_ENV not in steps  # this log has batch and find_slot lines already


def test_parallel_slots_and_kv_unified_feed_the_steps() -> None:
    text = (CORPUS / "08_llamacpp-17316-http500-seq2-parallel.log").read_text(encoding="utf-8")
    r = analyze.parse(("./llama-server -m model.gguf --parallel 4 --kv-unified\n" + text).encode())
    m = match_signature(r)
    assert m.name == "parallel_slot_mismatch"
    assert m.match.facts == {"seq_id": 2, "slot_before": 3, "slots_after": [0, 1]}
    steps = "\n".join(m.steps)
    assert "runs 4 slots" in steps and "without `--kv-unified`" in steps


def test_matching_slot_is_not_a_mismatch() -> None:
    m = match_signature(analyze.parse(CORPUS / "10_llamacpp-19953-vulkan-ngram-seq3-datetime-pid-prefix.log"))
    assert m.name == "target_position_mismatch" and m.signature.failure  # named, but not a slot mismatch


def test_drafter_x_at_or_above_y_is_not_rolled_back() -> None:
    e = "0.02.000.000 E "
    lines = ["0.01.000.000 I common_speculative_init: adding implementation dflash"]
    lines += drafter_failure(e, 0, 81, 79) + drafter_failure(e, 0, 81, 80)
    m = match_signature(_parse_lines(lines))
    assert m.name == "drafter_not_rolled_back" and m.match.facts == {"x": 81, "y": 79, "n": 2}


def test_assert_outside_the_speculative_path_is_its_own_signature() -> None:
    lines = ["common/sampling.cpp:152: GGML_ASSERT(logits != nullptr) failed"]
    m = match_signature(_parse_lines(lines))
    assert m.name == "abort_outside_speculation" and m.env.speculative is False
    spec = ["common_speculative_init: adding implementation draft-simple"] + lines
    assert match_signature(_parse_lines(spec)).name == "speculative_assert"


def test_healthy_per_position_acceptance_and_mean_length() -> None:
    lines = [
        "0.10.000.000 I slot print_timing: id  0 | task 7 | draft acceptance = 0.62500 (   50 accepted /    80 "
        "generated), mean len =  2.60",
        "0.10.000.001 T slot print_timing: id  0 | task 7 |      acc per pos = (0.800, 0.600, 0.400, 0.200)",
    ]
    m = match_signature(_parse_lines(lines))
    assert m.name == "healthy_speculative"
    assert m.match.facts["accepted_per_position"] == [0.8, 0.6, 0.4, 0.2]
    assert m.match.facts["mean_accepted_len"] == 2.6
    assert "50 of 80" in m.match.detail and "per position 0.80, 0.60, 0.40, 0.20" in m.match.detail


def test_no_log_is_not_a_failure() -> None:
    m = match_signature(analyze.parse(b"just some prose, no llama.cpp here\n"))
    assert m.name == "unclassified" and not m.signature.failure


def test_log_values_in_steps_are_reduced_to_a_safe_alphabet() -> None:
    evil = "--spec-type <img/src=x>`**pwn**`"
    r = analyze.parse((evil + "\n" + (CORPUS / "01_beellama-27-dflash-drafter-consecutive.log").read_text()).encode())
    m = match_signature(r)
    assert all(c.isalnum() or c in "._+-" for c in m.env.spec_type)
    assert "<" not in "".join(m.steps) and "**pwn" not in "".join(m.steps)


def test_catalogue_is_data() -> None:
    names = [s.name for s in SIGNATURES]
    assert len(names) == len(set(names)) and names[-1] == "unclassified"
    for s in SIGNATURES:
        assert s.title and s.explanation and s.next_steps


@pytest.mark.parametrize("text", [
    'the model throws error "llama_decode: failed to decode, ret = -1"\n',
    "srv  update_slots: failed to decode the batch, n_batch = 512, ret = -1\n",
])
def test_decode_minus_one_without_a_position_block_is_an_invalid_batch(text: str) -> None:
    m = match_signature(analyze.parse(text.encode()))
    assert (m.name, m.match.key) == ("decode_invalid_batch", "invalid_batch")
    assert m.signature.failure and m.steps


def test_an_allocation_that_failed_before_a_target_start_up_failure_is_out_of_memory() -> None:
    text = (b"E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 36864.00 MiB on device 0: cudaMalloc failed: "
            b"out of memory\n"
            b"E llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache\n")
    r = analyze.parse(text)
    assert (r.verdict.kind, r.verdict.component) == ("other", "target")
    assert match_signature(r).name == "out_of_memory"


@pytest.mark.parametrize("text", [
    b"ggml_new_object: not enough space in the context's memory pool (needed 10882896, available 10650320)\n",
    b"llama.cpp: loading model from models/7B/ggml-model-q4_0.bin\n"
    b"ggml_new_tensor_impl: not enough space in the scratch memory pool (needed 1279262720, available 1197473280)\n",
])
def test_ggml_s_memory_pool_out_of_room_is_the_target_s_out_of_memory(text: bytes) -> None:
    r = analyze.parse(text)
    assert (r.verdict.kind, r.verdict.component) == ("other", "target")
    assert r.verdict.confidence != "low"  # ggml's own line, read by the table
    m = match_signature(r)
    assert (m.name, m.match.key) == ("out_of_memory", "oom")


def test_a_memory_pool_line_after_a_crash_keeps_the_crash_s_signature() -> None:
    text = (b"ggml_new_tensor_impl: not enough space in the context's memory pool (needed 13340448, available 10485760)\n"
            b"Segmentation fault (core dumped)\n")
    assert match_signature(analyze.parse(text)).name == "abort_outside_speculation"


def test_a_drafter_that_needs_its_target_s_context_is_the_draft_side_s_start_up_failure() -> None:
    text = (b"llama-server process has terminated: llama_init_from_model: failed to initialize the context: "
            b"Gemma4Assistant requires ctx_other to be set (this warning is normal during memory fitting)\n")
    r = analyze.parse(text)
    assert r.verdict.component == "drafter"
    assert match_signature(r).name == "draft_context_failed"


# ggml's own abort line (GGML_ABORT("fatal error") prints `file:line: fatal error`), a CUDA kernel's and a CPU
# op's, before a backtrace cut mid-line: an abort, named by whether speculative decoding was on
FATAL = ("0.20.084.652 I slot launch_slot_: id  2 | task 2311 | processing task, is_child = 0\n"
         "{line}\n/src/llama.cpp/build/bin/libggml-base.so.0(+0x1b076) [0x7666b54b3076]\n"
         "/src/llama.cpp/build/bin/libggml-base.so.0(ggml_pr\n")


@pytest.mark.parametrize("line", ["/src/llama.cpp/ggml/src/ggml-cuda/fattn.cu:574: fatal error",
                                  r"E:\llama.cpp\ggml\src\ggml-cpu\ggml-cpu.c:2455: fatal error"])
def test_ggml_s_fatal_error_line_is_an_abort_named_by_the_run_it_is_in(line: str) -> None:
    plain = analyze.parse(FATAL.format(line=line).encode())
    assert plain.verdict.kind == "other" and plain.verdict.evidence[0]["text"] == line
    assert match_signature(plain).name == "abort_outside_speculation"
    spec = "./llama-server -m gemma.gguf --model-draft mtp.gguf --spec-type draft-mtp\n" + FATAL.format(line=line)
    assert match_signature(analyze.parse(spec.encode())).name == "speculative_assert"


def test_a_compiler_s_fatal_error_is_not_ggml_s_abort() -> None:
    text = b"/src/llama.cpp/ggml/src/ggml-cuda/fattn.cu:574:10: fatal error: cuda.h: No such file or directory\n"
    assert analyze.parse(text).errors.empty


@pytest.mark.parametrize(("line", "words"), [
    ("/home/u/llama.cpp/ggml/src/ggml.c:13458: GGML_ASSERT(i01 >= 0 && i01 < ne01) failed",
     "GGML_ASSERT(i01 >= 0 && i01 < ne01)"),
    ("D:/a/llama.cpp/llama.cpp/ggml/src/ggml-backend.cpp:194: GGML_ASSERT(buffer) failed", "GGML_ASSERT(buffer)"),
    ("GGML_ASSERT: /Users/runner/llama.cpp/ggml.c:4000: ctx->mem_buffer != NULL", "GGML_ASSERT(ctx->mem_buffer != NULL)"),
    ("Assertion failed: n_tokens <= n_batch, file llama.cpp, line 1234", "assert(n_tokens <= n_batch)"),
    ("llama-server: llama.cpp:99: int main(): Assertion `ctx != nullptr' failed.", "assert(ctx != nullptr)"),
    ("0.01.100.200 E CUDA error: out of memory", "CUDA error: out of memory"),
    ("Error: an unknown error was encountered while running the model CUDA error: out of memory",
     "CUDA error: out of memory"),
    ("  current device: 0, in function alloc at /build/ggml-cuda.cu:412", "current device: N, in function alloc at "
     "ggml-cuda.cu"),
    ("check_tensor_dims: tensor 'blk.0.attn_q_b.weight' has wrong shape; expected  1536, 24576, got  1536, 16384",
     "check_tensor_dims: tensor 'blk.0.attn_q_b.weight' has wrong shape; expected N, N, got N, N"),
    ("ggml_vulkan: Device memory allocation of size 1073741824 failed at 0x7f3a", "ggml_vulkan: Device memory "
     "allocation of size N failed at 0x…"),
])
def test_failure_words_keep_what_tells_one_bug_from_another(line: str, words: str) -> None:
    from kvtrace.analyze.findings.rules import failure_words

    assert failure_words(line) == words


def test_a_nested_load_error_is_named_by_its_innermost_message(tmp_path: Path) -> None:
    log = tmp_path / "load.log"
    log.write_text("llama_model_load: error loading model: error loading model architecture: unknown model "
                   "architecture: 'pangu-embedded'\nllama_load_model_from_file: failed to load model\n")
    m = match_signature(analyze.parse(log))
    assert m.name == "model_load_failed" and m.match.identity == "unknown model architecture: 'pangu-embedded'"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("line", ["GGML_ASSERT(" * 100_000, "Assertion '" + "x" * 1_000_000, "/a" * 500_000,
                                  "CUDA error " + "1." * 500_000])
def test_failure_words_stay_fast_on_a_pasted_megabyte_line(line: str) -> None:
    """A stranger's paste can hold a 1 MB line; its first 2,000 characters are what is read."""
    from kvtrace.analyze.findings.rules import failure_words

    assert len(failure_words(line)) <= 120
