"""What a paste does to llama.cpp's lines (docs/llama-cpp-lines.md#pastes): re-wrapped at about 72 columns,
all its newlines lost, journald and docker-compose and router prefixes, journald lines cut at the terminal width,
`[pid]` before every backtrace frame, the 2023 assert form, the `cmn` tag, statistics in a script's template, and
a draft model loaded near a decode that fails. The lines are built to that page's formats (#the-position-check,
#the-servers-lines, #pastes)."""

from __future__ import annotations

import textwrap

import pytest

from kvtrace import analyze
from kvtrace.analyze.reader.normalize import rejoin, split_glued, uncut

BLOCK = [
    "init: the tokens of sequence 0 in the input batch have inconsistent sequence positions:",
    " - the last position stored in the memory module of the context (i.e. the KV cache) for sequence 0 is X = 259",
    " - the tokens for sequence 0 in the input batch have a starting position of Y = 1361",
    " it is required that the sequence positions remain consecutive: Y = X + 1",
    "decode: failed to initialize batch",
    "llama_decode: failed to decode, ret = -1",
]


def _xy(text: str) -> tuple[str, int | None, int | None, int | None]:
    v = analyze.parse(text.encode()).verdict
    return v.kind, v.seq_id, v.last_pos, v.batch_start


@pytest.mark.parametrize("width", [*range(30, 109, 6), 72])
def test_a_block_re_wrapped_at_a_paste_width_still_gives_x_and_y(width: int) -> None:
    """Cut in two, three or four pieces; every width in one process, so what one paste leaves in the reader's
    memo must not change how the next is read."""
    wrapped = [part for line in BLOCK for part in textwrap.wrap(line, width)]
    assert len(wrapped) > len(BLOCK)  # the X line at least is cut
    assert _xy("\n".join(wrapped) + "\n") == ("inconsistent_positions", 0, 259, 1361)


def test_a_re_wrapped_block_twice_reads_the_same_both_times() -> None:
    """The accelerator skips lines it remembers: the halves of a re-wrapped line must come back to the walker."""
    wrapped = "\n".join(part for line in BLOCK for part in textwrap.wrap(line, 72)) + "\n"
    r = analyze.parse((wrapped + "srv  update_slots: all slots are idle\n" * 40 + wrapped).encode())
    assert [(e.last_pos, e.batch_start) for e in r.errors.itertuples()] == [(259, 1361), (259, 1361)]


def test_rejoin_takes_only_short_lines_with_a_word_worth_joining() -> None:
    assert rejoin(" - the tokens for sequence 0 in the input batch have a starting position of", "Y = 1361") == (
        " - the tokens for sequence 0 in the input batch have a starting position of Y = 1361")
    assert rejoin("hello", "world") is None
    assert rejoin("x" * 300 + " sequence", "Y = 1") is None


def test_a_docker_compose_log_pasted_on_one_line_reads_as_its_lines() -> None:
    lines = [f"llama-bee    | {line}" for line in BLOCK]
    one = " ".join(["llama-bee    | main: server is listening on http://127.0.0.1:8080 - starting the main loop",
                    *lines])
    assert split_glued(one) == ["llama-bee    | main: server is listening on http://127.0.0.1:8080 - starting the main loop",
                                *lines]
    assert _xy(one + "\n") == _xy("\n".join(lines) + "\n") == ("inconsistent_positions", 0, 259, 1361)


def test_a_long_ordinary_line_is_not_split() -> None:
    line = "llama_model_loader: - kv  14: tokenizer.ggml.token_type arr[i32,654] = [" + ", ".join(["1"] * 300) + "]"
    assert split_glued(line) is None


def test_journald_lines_cut_at_the_terminal_width_lose_their_cut_word() -> None:
    head = "Apr 27 08:12:09 host llama-server[888649]: "
    cut = head + BLOCK[1][:-2] + ">"  # `X = 2>`: the 59 was cut off
    assert uncut(cut) == head + BLOCK[1][:-3]
    assert uncut(BLOCK[1] + " ->") == BLOCK[1] + " ->"  # no journald prefix: left alone
    kind, seq, x, _ = _xy("\n".join([head + BLOCK[0], cut, head + BLOCK[2][:40] + ">", head + BLOCK[4]]) + "\n")
    assert (kind, seq, x) == ("inconsistent_positions", 0, None)  # never the cut 2
    whole = "\n".join(head + line for line in BLOCK) + "\n"
    assert _xy(whole) == ("inconsistent_positions", 0, 259, 1361)


@pytest.mark.parametrize("prefix", ["[39385] ", "llama-bee    | ", "llama-swap-1  | [39385] ",
                                    "2026-04-27T08:12:09+0200 host llama-server[888649]: "])
def test_router_docker_and_journald_prefixes(prefix: str) -> None:
    assert _xy("\n".join(prefix + line for line in BLOCK) + "\n") == ("inconsistent_positions", 0, 259, 1361)


def test_pid_prefixed_backtrace_frames_belong_to_the_failure_and_name_its_side() -> None:
    text = "\n".join([
        "[60957] /src/llama.cpp/src/llama-context.cpp:1023: GGML_ASSERT(n_tokens_all <= cparams.n_batch) failed",
        "[60957] #0  0x00007f3c2a1b2c3d in ggml_abort () from libggml-base.so",
        "[60957] #1  0x00007f3c2a1b2c3e in llama_decode () from libllama.so",
        "[60957] #2  0x00007f3c2a1b2c3f in common_speculative_draft(common_speculative*, int) () from libcommon.so",
    ]) + "\n"
    r = analyze.parse(text.encode())
    assert len(r.errors) == 1
    assert r.verdict.component == "drafter"
    assert r.verdict.component_evidence == 4


def test_the_2023_assert_form_is_an_assert() -> None:
    r = analyze.parse(b"GGML_ASSERT: /home/user/llama.cpp/ggml.c:4785: view_src == NULL || data_size <= ggml_nbytes(view_src)\n"
                      b"zsh: abort      ./main -m model.gguf\n")
    assert r.verdict.kind == "other"
    assert r.errors["variant"].iloc[0] == "ggml_assert_old"


def test_the_cmn_tag_is_a_llama_cpp_line() -> None:
    v = analyze.parse(b"0.00.079.033 I cmn  common_param: device_info:\n").verdict
    assert v.kind == "other"  # a log, with no failure: not no_log


@pytest.mark.parametrize("stats", [
    "  code_python        pred= 192 draft=  89 acc=  84 rate=0.944 tok/s=52.3\n"
    "  code_cpp           pred= 192 draft=  83 acc=  77 rate=0.928 tok/s=50.3\n",
    "INFO [metrics.py:101] SpecDecoding metrics: Mean acceptance length: 2.91, Accepted: 632 tokens, Drafted: 1655 tokens\n",
    "speculative: accepted 84 of 89 draft tokens (94.4%)\n",
])
def test_statistics_in_a_template_or_in_prose_make_a_healthy_run(stats: str) -> None:
    v = analyze.parse(stats.encode()).verdict
    assert v.kind == "draft_stats_only"
    assert v.acceptance["generated"] > v.acceptance["accepted"] > 0


def test_a_console_spinner_glued_to_the_first_line_is_not_a_failure() -> None:
    text = ("\\|/-\\|/-build: 4067 (54ef9cfc) with cc (GCC) 14.2.1 20240910 for x86_64-pc-linux-gnu\n"
            "main: model loaded\n"
            "draft acceptance rate = 0.75000 (   75 accepted /   100 generated)\n")
    v = analyze.parse(text.encode()).verdict
    assert v.kind == "draft_stats_only"
    assert v.n_errors == 0


def test_a_draft_model_loaded_nearby_does_not_decide_a_failing_decode_s_side() -> None:
    text = ("srv    load_model: loading draft model 'draft.gguf'\n"
            "decode: failed to find a memory slot for batch of size 512\n")
    assert analyze.parse(text.encode()).verdict.component == "unknown"
    load = ("srv    load_model: loading draft model 'draft.gguf'\n"
            "llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' has wrong shape\n")
    assert analyze.parse(load.encode()).verdict.component == "drafter"  # a load right after it is the draft's


@pytest.mark.parametrize("cut", [
    "init: the tokens of sequence 0 in the input ba",  # the paste ends inside the header
    "Dec 24 23:48:35 host llama-server[3974]: init: the tokens of sequence 0 in the input batch have inconsis>",
])
def test_a_position_header_cut_off_is_still_the_position_check(cut: str) -> None:
    v = analyze.parse(("srv  update_slots: all slots are idle\n" + cut + "\n").encode()).verdict
    assert (v.kind, v.seq_id, v.last_pos, v.batch_start, v.n_position_errors) == (
        "inconsistent_positions", 0, None, None, 1)


@pytest.mark.parametrize("table", [
    "Model | n_draft | n_predict | n_drafted | n_accept | accept ratio\n-- | -- | -- | -- | -- | --\n"
    "Qwen2.5-3B-Instruct.Q4_0.gguf | 5 | 129 | 93 | 23 | 24.70%\n",
    "| --draft          |      0 |       1 |       2 |\n|------------------|--------|---------|---------|\n"
    "| n_drafted master |      0 |     151 |     254 |\n| n_accept master  |      0 |     120 |     200 |\n",
])
def test_a_table_of_n_drafted_and_n_accept_is_draft_statistics(table: str) -> None:
    assert analyze.parse(table.encode()).verdict.kind == "draft_stats_only"


@pytest.mark.parametrize("table", [
    "|          | base t/s | DFlash t/s | speedup | acceptance     |\n|---|---|---|---|---|\n"
    "| ik_llama | 4.05     | 10.80      | 2.67x   | ~62% (273/436) |\n",
    "| temp | accepted length | throughput |\n|---|---|---|\n| 0.1 | +1.93% | +4.21% |\n",
    "| Accept rate | 0.61 | 0.58 |\n",
    # the acceptance with its unit, or with the draft tokens it counts (tests/fixtures/blind/batch-9, 15 and 16)
    "| Output Tokens | Speed (tok/s) | Draft Accepted/Total | Accept % |\n|---|---|---|---|\n| 64 | 92.1 | 52/137 | 38.0% |\n",
    "| Temp | Speed | Accept % |\n|------|-------|----------|\n| 0.0 | 52.0 | 17.4% |\n",
    "| Model | Device | Speed (tok/sec) | Draft Model | Draft Tokens Accepted |\n| --- | --- | --- | --- | --- |\n",
])
def test_a_table_whose_column_is_the_acceptance_is_draft_statistics(table: str) -> None:
    v = analyze.parse(table.encode()).verdict
    assert v.kind == "draft_stats_only"
    assert not v.acceptance  # the report's cells are never the log's counts


@pytest.mark.parametrize("text", [
    # ik_llama.cpp's per-position acceptance, its statistics line quoted inline and the figures on their own
    "my `ngram_mod` output: `statistics ngram_mod(tail), blocked = 2/64, pos_accept=[87%,78%,68%,67%,58%]`.\n",
    "the token acceptance rate for MTP is: `pos_accept=[91%,76%,63%,53%]`\n",
    # a fork's adaptive draft-max, the depth it chose from the acceptance it saw
    "0.16.956.807 I slot launch_slot_: id  0 | task 0 | processing task, is_child = 0\n"
    "0.19.967.115 I slot apply_adapti: id  0 | task 0 | adaptive draft-max profit: 0 -> 15 (score=22.65)\n",
    "0.17.959.806 I slot print_timing: id  0 | task 8 | adaptive dm: fringe=0.00 n_max=15\n",
])
def test_per_position_acceptance_and_adaptive_draft_depth_are_draft_statistics(text: str) -> None:
    v = analyze.parse(text.encode()).verdict
    assert v.kind == "draft_stats_only"
    assert not v.acceptance.get("generated")  # no drafted-token counts in these lines


def test_a_per_step_json_record_of_n_draft_and_n_accepted_is_draft_statistics() -> None:
    """A fork's speculative dump, one JSON object per verification step: each step's counts are summed."""
    text = ('{"step":1,"seq":3,"n_draft":3,"n_accepted":2,"pmin_drop":0,"pos":[{"i":0,"acc":true}]}\n'
            '{"step": 2, "seq": 3, "n_draft": 3, "n_accepted": 0, "pmin_drop": 1, "pos": []}\n')
    v = analyze.parse(text.encode()).verdict
    assert v.kind == "draft_stats_only" and (v.seq_id, v.n_position_errors) == (None, 0)
    assert (v.acceptance["accepted"], v.acceptance["generated"]) == (2, 6)
    # the keys alone, with no accepted count beside the drafted one, are no statistics
    assert analyze.parse(b'{"n_draft": 3, "model": "x"}\n').verdict.kind == "no_log"


@pytest.mark.parametrize("text", [
    "| temp | throughput |\n|---|---|\n| 0.1 | +4.21% |\n",  # a table of other figures
    "the draft was not accepted | see below\n",  # prose with a pipe, the word inside a sentence
    "| Model | Accepted answers % | Notes |\n|---|---|---|\n",  # a column that counts something else accepted
    "| tokens accepted by the grammar | 12 |\n",
])
def test_a_table_or_prose_that_only_mentions_acceptance_is_no_log(text: str) -> None:
    assert analyze.parse(text.encode()).verdict.kind == "no_log"


@pytest.mark.parametrize("text", [
    "./bin/llama-speculative -m big.gguf -md small.gguf --draft-max 8 -np 4 -fa\n",
    "I can reproduce it with:\n./llama-speculative \\\n    -m big.gguf \\\n    -md small.gguf \\\n"
    "    -c 8000 -ngl 99 --draft 16\n",
])
def test_command_lines_alone_are_no_log(text: str) -> None:
    r = analyze.parse(text.encode())
    assert r.verdict.kind == "no_log"
    assert r.meta["flags"]["-md"] == "small.gguf"  # the flags are still read


def test_an_error_quoted_before_the_log_takes_the_side_the_log_gives_it() -> None:
    text = ("when I load the dflash model there is an error:\n"
            "llama_model_load: error loading model: unknown model architecture: 'dflash'\n"
            "\n".join(["", *["how can I fix it?"] * 8, ""]) +
            "llama_model_load: error loading model: unknown model architecture: 'dflash'\n"
            "llama_model_load_from_file_impl: failed to load model\n"
            "srv    load_model: failed to load draft model, 'dflash.gguf'\n")
    v = analyze.parse(text.encode()).verdict
    assert (v.kind, v.component) == ("other", "drafter")
    assert "failed to load draft model" in next(e["text"] for e in v.evidence if e["line"] == v.component_evidence)


@pytest.mark.parametrize("text", [
    "prompt eval time =    3616.15 ms /   455 tokens (    7.95 ms per token,   125.82 tokens per second)\n"
    "       eval time =   10210.28 ms /   512 tokens (   19.94 ms per token,    50.15 tokens per second)\n",
    'time="2025-10-27T18:41:57Z" level=info msg="prompt eval time =    1630.37 ms /    43 tokens (   37.92 ms per '
    'token,    26.37 tokens per second)" component=llama.cpp\n'
    'time="2025-10-27T18:41:57Z" level=info msg="      total time =  301889.01 ms /  1526 tokens" component=llama.cpp\n',
])
def test_llama_server_timings_on_their_own_lines_are_a_llama_cpp_log(text: str) -> None:
    """print_timing's message on a line of its own, bare or in a runtime's logfmt: a healthy log, not `no_log`."""
    assert analyze.parse(text.encode()).verdict.kind == "other"
    assert analyze.parse(b"the total time = 5 s and the eval time was fine\n").verdict.kind == "no_log"


@pytest.mark.parametrize("text", [
    # LocalAI 4.x relays the backend's stderr as logfmt (`GRPC stderr id=... line="..."`), earlier builds as
    # `GRPC(model-host:port): stderr LINE` behind a docker-compose column (tests/fixtures/blind/batch-7, report 4)
    'Apr 15 22:10:45 DEBUG GRPC stderr id="Gemma 31B - Q6_K speculative-127.0.0.1:39857" '
    'line="no implementations specified for speculative decoding" caller={caller.file="/build/pkg/model/process.go"\n',
    "api_1  | 1:06AM DBG GRPC(gemma-4-31b.gguf-127.0.0.1:42109): stderr 0.00.254.000 I spec common_specu: "
    "no implementations specified for speculative decoding\n",
])
def test_a_speculative_set_up_that_named_no_implementation_is_a_llama_cpp_log_without_a_failure(text: str) -> None:
    """llama.cpp's own line behind a wrapper's stderr prefix: a log with no failure (`other`), not `no_log`."""
    r = analyze.parse(text.encode())
    assert (r.verdict.kind, r.verdict.n_errors) == ("other", 0)
    assert not r.meta["spec_impls"]
    assert analyze.parse(b"no speculative decoding was specified in my config\n").verdict.kind == "no_log"
