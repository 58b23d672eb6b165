"""Every llama.cpp log line the reader understands, as data.

One entry per wording. A new fork's wording is one more entry here, not a new code path: the walker
(analyze/walker.py) only looks at an entry's `family` and `kind`. Regexes use named groups and no
look-around (so they also run on RE2/Rust engines) and are searched, not anchored, because lines arrive
with prefixes, markdown noise or stray characters glued on by interleaved stdout.

`anchor` is a literal that every matching line contains: the walker tests it with `in` before running
the regex, which keeps the hot loop cheap. References (F-xx, S-xx, section numbers) point into the
project's log-format notes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(slots=True, frozen=True)
class Pattern:
    name: str
    family: str
    anchor: str
    regex: re.Pattern[str]
    kind: str = ""
    component: str = "unknown"
    builds: str = "upstream"
    extra: dict[str, str] = field(default_factory=dict)


def _p(name: str, family: str, anchor: str, regex: str, **kw: object) -> Pattern:
    return Pattern(name, family, anchor, re.compile(regex), **kw)  # type: ignore[arg-type]


INT = r"-?\d+"

# Families:
#   batch   LLAMA_BATCH_DEBUG dumps (llama-batch.cpp)
#   kv      LLAMA_KV_CACHE_DEBUG find_slot lines (llama-kv-cache.cpp)
#   block   the multi-line "inconsistent sequence positions" error
#   failure one line of a failed decode: validation errors, decode/caller lines, KV-room, asserts
#   follow  lines that belong to the failure before them and never start one (send_error, frames)
#   event   resets, slot life-cycle, draft statistics, DFlash key=value lines
#   hint    lines that say which context was working just before a failure
#   meta    build, backends, GPUs, context creation, speculative implementation, flags
#   generic any other recognisable llama.cpp line (only counted, to tell a log from prose)
PATTERNS: tuple[Pattern, ...] = (
    # ---- LLAMA_BATCH_DEBUG (§3.1): the input batch is dumped once, then once per ubatch split
    _p("batch_input", "batch", "input batch info", r"input batch info:", kind="input"),
    _p("batch_ubatch", "batch", "added ubatch to split", r"added ubatch to split", kind="ubatch"),
    _p("batch_field", "batch", "ubatch_print:",
       r"ubatch_print:\s+(?P<key>[a-z_]+)\s*= (?P<value>\S*)", kind="field"),
    _p("batch_seq_pos", "batch", ": pos = [",
       rf"init:\s+(?P<seq>\d+): pos = \[\s*(?P<pos_min>{INT}),\s*(?P<pos_max>{INT})\]", kind="seq_pos"),
    _p("batch_seq_open", "batch", "init:", r"init:\s+seq\s+= \[", kind="seq_open"),
    _p("batch_seq_close", "batch", "init:", r"init:\s+\]\s*$", kind="seq_close"),
    # ---- LLAMA_KV_CACHE_DEBUG (§5)
    _p("kv_stream", "kv", "find_slot: stream[",
       r"find_slot: stream\[(?P<stream>\d+)\], n = \s*(?P<n>\d+), used = \s*(?P<used>\d+), "
       r"head = \s*(?P<head>\d+), size = \s*(?P<size>\d+)", kind="stream"),
    _p("kv_seq", "kv", "find_slot: stream[",
       rf"find_slot: stream\[(?P<stream>\d+)\] min\[(?P<seq>\d+)\] = \s*(?P<pos_min>{INT}), "
       rf"max\[\d+\] = \s*(?P<pos_max>{INT})", kind="seq"),
    # ---- per-cycle slot line, early in the table because it is the most frequent after the dumps
    _p("accepted", "event", "draft tokens",
       r"accepted\s+(?P<accepted>\d+)/\s*(?P<drafted>\d+) draft tokens(?:, new n_tokens = (?P<pos>\d+))?",
       kind="accepted", component="target"),
    # ---- the position-check error block (§3.2); every closing variant, any part may be cut off
    _p("pos_header", "block", "inconsistent sequence positions",
       r"the tokens of sequence (?P<seq>\d+) in the input batch have inconsistent sequence positions",
       kind="header"),
    _p("pos_x", "block", "is X = ",
       rf"the last position stored in the memory module.*?for sequence (?P<seq>\d+) is X = (?P<x>{INT})",
       kind="x"),
    _p("pos_y", "block", "the tokens for sequence",
       rf"the tokens for sequence (?P<seq>\d+) in the input batch(?: have a starting position of Y = (?P<y>{INT}))?",
       kind="y"),
    _p("pos_close_consecutive", "block", "remain consecutive",
       r"sequence positions remain consecutive: Y = X \+ 1", kind="close", extra={"variant": "consecutive"}),
    _p("pos_close_mrope", "block", "for M-RoPE",
       r"for M-RoPE, it is required that the position satisfies: X (?P<op><=|&lt;=|<|&lt;) Y",
       kind="close", builds="upstream (X < Y); forks and older upstream (X <= Y)"),
    # ---- batch validation failures that return -1 (§3.2)
    _p("not_continuous", "failure", "positions are not continuous",
       r"sequence (?P<seq>\d+) positions are not continuous", kind="decode_failed"),
    _p("decreasing", "failure", "positions are decreasing",
       r"sequence (?P<seq>\d+) positions are decreasing", kind="decode_failed"),
    _p("diverged", "failure", "in the input batch, but have",
       r"sequence (?P<seq>\d+) is coupled to (?P<other>\d+) in the input batch, but have div\w*ged",
       kind="decode_failed"),
    _p("incompatible_sets", "failure", "incompatible sequence sets",
       r"sequence (?P<seq>\d+) belongs to incompatible sequence sets", kind="decode_failed"),
    _p("coupled_split", "failure", "coupled sequences in the input batch",
       r"sequential split is not supported when there are coupled sequences", kind="decode_failed"),
    _p("seq_not_from_last", "failure", "does not start from the last position",
       r"sequence (?P<seq>\d+) does not start from the last position stored in the memory", kind="decode_failed",
       builds="libllama mid-2025 (the position check before the X/Y wording)"),
    _p("invalid_token", "failure", "invalid token[", rf"invalid token\[(?P<i>\d+)\] = (?P<token>{INT})",
       kind="decode_failed"),
    _p("invalid_seq_id", "failure", "invalid seq_id[",
       rf"invalid seq_id\[(?P<i>\d+)\]\[\d+\] = (?P<seq>{INT}) >= (?P<max>\d+)", kind="decode_failed"),
    # ---- decode / encode failures (§4) and the callers that say which side failed (§2.3, §6, §7)
    _p("init_failed", "failure", "failed to initialize batch", r"failed to initialize batch",
       kind="decode_failed", extra={"stage": "1"}),
    _p("llama_decode_ret", "failure", "failed to decode, ret =",
       rf"llama_(?:de|en)code: failed to (?:de|en)code, ret = (?P<ret>{INT})",
       kind="decode_failed", extra={"stage": "2"}),
    _p("dflash_drafter_failed", "failure", "drafter decode failed",
       rf"dflash: drafter decode failed with (?P<ret>{INT})", kind="decode_failed", component="drafter",
       builds="beellama.cpp v0.2-v0.3 (F-30/F-40)", extra={"stage": "3"}),
    _p("dflash_batch_failed", "failure", "dflash batch: decode failed",
       rf"dflash batch: decode failed with (?P<ret>{INT})", kind="decode_failed", component="drafter",
       builds="beellama.cpp v0.2-v0.3 (F-50)", extra={"stage": "3"}),
    _p("ctx_dft_failed", "failure", "ctx_dft)",
       rf"llama_(?:(?:de|en)code|process)\(ctx_dft\)[^\n]*?rc=(?P<ret>{INT})", kind="decode_failed", component="drafter",
       builds="upstream EAGLE3/MTP/draft-dflash, forks", extra={"stage": "3"}),
    _p("draft_decode_returned", "failure", " returned ",
       rf"draft\w*: llama_(?:decode|process)(?:\[\d+\])? returned (?P<ret>{INT})", kind="decode_failed",
       component="drafter", builds="upstream draft-simple/draft-dflash, MTP forks", extra={"stage": "3"}),
    _p("draft_batch_failed", "failure", "failed to decode draft batch",
       rf"failed to decode draft batch, ret = (?P<ret>{INT})", kind="decode_failed", component="drafter",
       extra={"stage": "3"}),
    _p("speculative_batch_failed", "failure", "failed to process speculative batch",
       r"failed to process speculative batch", kind="decode_failed", component="drafter",
       extra={"stage": "4"}),
    _p("invalid_input_batch", "failure", "Invalid input batch",
       rf"Invalid input batch\.? (?:i|off) = (?P<off>\d+), n_batch = (?P<n_batch>\d+), ret = (?P<ret>{INT})",
       kind="decode_failed", component="target", extra={"stage": "4"}),
    _p("compute_error", "failure", "Compute error",
       rf"Compute error\.? (?:i|off) = (?P<off>\d+), n_batch = (?P<n_batch>\d+), ret = (?P<ret>{INT})",
       kind="decode_failed", component="target", extra={"stage": "4"}),
    _p("context_exceeded", "failure", "Context size has been exceeded",
       rf"Context size has been exceeded\.?(?: (?:i|off) = (?P<off>\d+), n_batch = (?P<n_batch>\d+), "
       rf"ret = (?P<ret>{INT}))?", kind="kv_slot", component="target", extra={"stage": "4"}),
    _p("kv_cache_full", "failure", "KV cache is full",
       rf"KV cache is full(?:[^\n]*?ret = (?P<ret>{INT}))?", kind="kv_slot", component="target",
       builds="server 2024 (failed to decode the batch: KV cache is full - try increasing it via the context size)",
       extra={"stage": "4"}),
    _p("no_kv_slot_old", "failure", "failed to find KV cache slot",
       r"failed to find KV cache slot(?: for ubatch of size (?P<n_tokens>\d+))?", kind="kv_slot",
       builds="libllama 2024-2025 (llama_decode_impl / llama_decode_internal)", extra={"stage": "1"}),
    _p("request_exceeds_context", "failure", "exceeds the available context size",
       r"exceeds the available context size", kind="kv_slot", component="target", extra={"stage": "4"}),
    _p("server_decode_failed", "failure", "failed to decode the batch",
       rf"failed to decode the batch, n_batch = (?P<n_batch>\d+), ret = (?P<ret>{INT})",
       kind="decode_failed", component="target", builds="server before 2025", extra={"stage": "4"}),
    # wrappers that word a failed decode their own way: llama-cpp-python raises, the ollama Go runner
    # panics, the old server / ik_llama.cpp print `ERR [ function ] message | key=value`
    _p("python_decode_raise", "failure", "llama_decode returned",
       rf"(?:RuntimeError|ValueError|Exception|Error)\b\W*llama_decode returned (?P<ret>{INT})", kind="decode_failed",
       builds="llama-cpp-python (Llama.eval raises)", extra={"stage": "4"}),
    _p("go_kv_slot", "failure", "could not find a kv cache slot",
       r"could not find a kv cache slot(?: \(length: (?P<n_tokens>\d+)\))?", kind="kv_slot",
       builds="ollama runner (Go panic or level=ERROR line)", extra={"stage": "4"}),
    _p("go_decode_panic", "failure", "failed to decode batch",
       r"(?:panic: |msg=\"?)failed to decode batch(?:: (?P<msg>.*))?", kind="decode_failed",
       builds="ollama runner (Go panic or level=ERROR line)", extra={"stage": "4"}),
    _p("invalid_input_batch_msg", "failure", "Invalid input batch",
       r"[\'\"]message[\'\"]\s*:\s*[\'\"]Invalid input batch", kind="decode_failed", component="target",
       builds="llama-server's HTTP 500 body as a client (Python openai, requests) raises it", extra={"stage": "4"}),
    _p("kv_form_decode", "failure", "ret=",
       rf"(?:failed to decode the batch|Invalid input batch|Compute error|failed to decode)[^|\n]*\|[^\n]*?\bret=(?P<ret>{INT})",
       kind="decode_failed", component="target", builds="server 2024, ik_llama.cpp (`ERR [ fn ] msg | key=value`)",
       extra={"stage": "4"}),
    _p("cannot_decode_encoder", "failure", "use llama_encode() instead",
       r"cannot decode batches with this context \(use llama_encode\(\) instead\)", kind="decode_failed",
       builds="an embedding/encoder-only model called with llama_decode", extra={"stage": "1"}),
    _p("prepare_ubatch_failed", "failure", "failed to prepare ubatch", r"failed to prepare ubatch",
       kind="decode_failed", extra={"stage": "1"}),
    # ---- a draft / MTP / EAGLE / DFlash context that fails to load or initialise (kind `load`)
    _p("draft_ctx_create_failed", "failure", "failed to create",
       r"failed to create (?:the )?(?:shared )?(?P<what>MTP|draft|DFlash|EAGLE\d?|speculative|drafter)\w*(?: drafter)? context",
       kind="load", component="drafter", extra={"stage": "2"}),
    _p("draft_ctx_measure_failed", "failure", "MTP context memory", r"failed to measure MTP context memory",
       kind="load", component="drafter", extra={"stage": "2"}),
    _p("draft_model_load_failed", "failure", "failed to load",
       r"failed to load (?:the )?(?P<what>draft model|MTP head|drafter|DFlash drafter|EAGLE\d? (?:draft|model))",
       kind="load", component="drafter", extra={"stage": "2"}),
    _p("draft_not_valid", "failure", "is not a valid DFlash drafter", r"is not a valid DFlash drafter",
       kind="load", component="drafter", builds="beellama.cpp (S-02)", extra={"stage": "2"}),
    _p("draft_vocab_mismatch", "failure", "draft model vocab",
       r"draft model vocab type must match target model", kind="load", component="drafter", extra={"stage": "2"}),
    _p("embd_mismatch", "failure", "match",
       r"(?:n_embd|hidden[ _]size|embedding (?:size|length))[^\n]{0,60}?(?:mismatch|does not match|differs)",
       kind="load", extra={"stage": "2"}),
    _p("init_context_failed", "failure", "failed to initialize the context",
       r"failed to initialize the context(?:: (?P<msg>.*))?", kind="load", extra={"stage": "1"}),
    _p("mtp_layers_missing", "failure", "doesn't contain MTP layers",
       r"context type MTP requested but model doesn't contain MTP layers", kind="load", component="drafter",
       extra={"stage": "1"}),
    # the model itself fails to load: a start-up failure (the device cannot hold the split, a bad file)
    _p("model_load_error", "failure", "error loading model", r"error loading model: (?P<msg>.*)", kind="load",
       extra={"stage": "1"}),
    _p("rc_failed", "failure", "rc=", rf"\bfailed\b[^\n]*?\brc=(?P<ret>{INT})", kind="decode_failed",
       extra={"stage": "3"}),
    # ---- no room in the KV cache (§4, §5, §6)
    _p("no_memory_slot", "failure", "failed to find a memory slot",
       r"failed to find a memory slot for batch of size (?P<n_tokens>\d+)", kind="kv_slot",
       extra={"stage": "1"}),
    _p("no_free_space", "failure", "failed to find free space in the KV cache",
       r"failed to find free space in the KV cache(?:, retrying with smaller (?:batch size|n_batch)\D*(?P<n_batch>\d+))?",
       kind="kv_slot", component="target", extra={"stage": "4"}),
    _p("ubatch_prepare", "failure", "failed to prepare",
       r"failed to prepare (?P<what>attention|recurrent) ubatches", kind="kv_slot", extra={"stage": "1"}),
    _p("no_cells", "failure", "available cells in kv cache",
       r"failed to find (?:(?P<n>\d+) )?available cells in kv cache", kind="kv_slot", extra={"stage": "1"}),
    _p("not_enough_cells", "failure", "not enough cells in kv cache", r"not enough cells in kv cache",
       kind="kv_slot", extra={"stage": "1"}),
    _p("kv_too_small", "failure", "> size =", r"find_slot: n_tokens = (?P<n_tokens>\d+) > size = (?P<size>\d+)",
       kind="kv_slot", extra={"stage": "1"}),
    # ---- asserts and aborts
    _p("encoder_assert", "failure", "encoder requires",
       r"GGML_ASSERT\((?P<cond>.*encoder requires.*)\) failed", kind="assert", component="drafter",
       builds="DFlash drafters are non-causal: llama_decode routes them through encode()", extra={"stage": "0"}),
    _p("ggml_assert", "failure", "GGML_ASSERT", r"GGML_ASSERT\((?P<cond>.*)\) failed", kind="assert",
       extra={"stage": "0"}),
    _p("c_assert", "failure", "Assertion", r"Assertion [`'\"](?P<cond>.*)['\"] failed", kind="assert",
       extra={"stage": "0"}),
    _p("ggml_abort", "failure", "GGML_ABORT", r"GGML_ABORT\((?P<cond>.*)\)", kind="assert", extra={"stage": "0"}),
    _p("segfault", "failure", "Segmentation fault", r"Segmentation fault", kind="assert", extra={"stage": "0"}),
    _p("aborted", "failure", "Aborted", r"(?:^|\s)Aborted(?: \(core dumped\))?\s*$", kind="assert", extra={"stage": "0"}),
    _p("cuda_error", "failure", "CUDA error", r"CUDA error: (?P<cond>.*)", kind="assert", extra={"stage": "0"}),
    _p("device_lost", "failure", "DeviceLost", r"(?:ErrorDeviceLost|DeviceLostError)", kind="assert",
       extra={"stage": "0"}, builds="Vulkan"),
    # an RPC device that went away: ggml-rpc's RPC_STATUS_ASSERT aborts, after the socket error it saw
    _p("rpc_lost", "failure", "Remote RPC server", r"Remote RPC server crashed or returned malformed response",
       kind="assert", extra={"stage": "0"}, builds="ggml-rpc"),
    _p("rpc_io", "failure", " failed (bytes_", r"(?P<op>send|recv) failed \(bytes_", kind="error",
       extra={"stage": "0"}, builds="ggml-rpc"),
    _p("rpc_connect", "failure", "Failed to connect to", r"Failed to connect to (?P<endpoint>\S+)", kind="error",
       extra={"stage": "0"}, builds="ggml-rpc"),
    _p("invalid_reduced_logits", "failure", "invalid reduced-logits",
       r"invalid reduced-logits (?:token (?P<token>-?\d+)|shape) in (?P<where>\w+)", kind="error",
       component="drafter", builds="beellama.cpp (F-32, F-33, F-42, F-51)", extra={"stage": "0"}),
    _p("terminate", "failure", "terminate called", r"terminate called (?P<cond>.*)", kind="assert",
       extra={"stage": "0"}),
    # ---- lines that follow a failure (never start one)
    _p("decode_exception", "follow", "decode() failed", r"decode\(\) failed: (?P<msg>.*)"),
    _p("send_error", "follow", "send_error", r"send_error: task id = (?P<task>\d+), error: (?P<msg>.*)"),
    _p("invalid_logits", "follow", "invalid logits id", r"invalid logits id (?P<i>\d+)"),
    _p("kobold_predict_failed", "follow", "Failed to predict",
       r"Failed to predict at token position (?P<pos>\d+)", builds="koboldcpp (after its llama_decode fails)"),
    _p("model_load_exit", "follow", "exiting due to model loading error", r"exiting due to model loading error"),
    _p("goroutine", "follow", "goroutine", r"^goroutine (?P<n>\d+) \[running\]"),
    # the address class holds no lone digit, so the walker can remember frames by their masked text
    _p("frame", "follow", "#", r"^\s*#(?P<n>\d+)\s+(?:[0-9a-fx]+ in )?(?P<fn>[\w:~<>]+)"),
    # ---- resets (§2.1, §5, §6)
    _p("dflash_clear_stale", "event", "clearing stale drafter KV",
       rf"dflash: clearing stale drafter KV for seq=(?P<seq>\d+) before (?P<where>[^:]+): "
       rf"pos_max=(?P<pos_max>{INT}) next_pos=(?P<next_pos>{INT})",
       kind="reset", component="drafter", builds="beellama.cpp >= v0.3.0 (F-01)"),
    _p("dflash_clear_seq", "event", "DFLASH_DBG clear drafter seq",
       rf"DFLASH_DBG clear drafter seq: seq=(?P<seq>\d+) reason=(?P<reason>.*?) pos_max=(?P<pos_max>{INT})",
       kind="reset", component="drafter", builds="beellama.cpp >= v0.3.0 (F-02)"),
    _p("dflash_discard_ring", "event", "discarding cross-ring state",
       r"dflash: discarding cross-ring state: (?P<reason>.*)", kind="reset", component="drafter",
       builds="beellama.cpp (F-03)"),
    _p("seq_rm", "event", "memory_seq_rm [", rf"memory_seq_rm \[(?P<pos>{INT}), end\)", kind="reset",
       component="target", extra={"hint": "1"}),
    _p("kv_cache_rm", "event", "kv cache rm", rf"kv cache rm -? ?\[(?P<pos>{INT}), end\)", kind="reset",
       component="target", extra={"hint": "1"}, builds="server before 2024"),
    _p("truncate_clear", "event", "failed to truncate tokens",
       rf"failed to truncate tokens with position >= (?P<pos>{INT}) - clearing the memory", kind="reset",
       component="target"),
    _p("memory_removed", "event", "removing memory module entries",
       rf"removing memory module entries for seq_id = (?P<seq>\d+), pos = \[(?P<pos>{INT}), \+inf\)",
       kind="reset"),
    _p("purge", "event", "purging positions",
       rf"purging positions \[(?P<pos>{INT}), (?P<pos_end>{INT})\] of sequence (?P<seq>\d+)", kind="reset"),
    _p("context_shift", "event", "context shift",
       r"context shift, n_keep = (?P<n_keep>\d+), n_left = (?P<n_left>\d+), n_discard = (?P<n_discard>\d+)",
       kind="reset", component="target"),
    _p("checkpoint_restore", "event", "checkpoint",
       rf"restor\w* (?:speculative |context )?checkpoint(?: \(pos_min = (?P<pos_min>{INT}), pos_max = (?P<pos>{INT}))?",
       kind="checkpoint_restore", component="target"),
    # ---- slot life-cycle (§2.4 S-21, §6)
    _p("new_prompt", "event", "new prompt",
       r"new prompt, n_ctx_slot = (?P<n_ctx_slot>\d+), n_keep = (?P<n_keep>\d+), task\.n_tokens = (?P<n_tokens>\d+)",
       kind="new_prompt", component="target", extra={"hint": "1"}),
    _p("prompt_done", "event", "done, n_tokens",
       r"prompt (?:processing )?done, n_tokens = (?P<pos>\d+)(?:, batch\.n_tokens = (?P<batch_n_tokens>\d+))?",
       kind="prompt_done", component="target", extra={"hint": "1"}),
    _p("prompt_progress", "hint", "prompt processing progress",
       r"prompt processing progress, n_tokens = (?P<pos>\d+), batch\.n_tokens = (?P<batch_n_tokens>\d+)",
       kind="prompt_progress", component="target"),
    _p("stop_processing", "event", "stop processing",
       r"stop processing: n_tokens = (?P<pos>\d+), truncated = (?P<truncated>\d+)", kind="stop",
       component="target"),
    # ---- speculative statistics, every wording (§2.4 S-19, §6, §7, 2023 CLI)
    _p("draft_acceptance", "event", "draft acceptance",
       r"draft acceptance(?: rate)? = (?P<rate>[\d.]+) \(\s*(?P<accepted>\d+) accepted /\s*(?P<generated>\d+) generated\)"
       r"(?:, mean len =\s*(?P<mean_len>[\d.]+))?", kind="draft_stats"),
    _p("spec_statistics", "event", "#gen drafts",
       r"statistics\s+(?P<impl>[\w-]+): #calls\(b,g,a\) = \s*(?P<calls_b>\d+)\s+(?P<calls_g>\d+)\s+(?P<calls_a>\d+), "
       r"#gen drafts = \s*(?P<gen_drafts>\d+), #acc drafts = \s*(?P<acc_drafts>\d+), "
       r"#gen tokens = \s*(?P<gen_tokens>\d+), #acc tokens = \s*(?P<acc_tokens>\d+)"
       r"(?:, #mean acc len = (?P<mean_acc_len>[\d.]+))?(?:, #acc rate/pos = \((?P<acc_per_pos>[^)]*)\))?",
       kind="draft_stats"),
    _p("acc_per_pos", "event", "acc per pos", r"acc per pos = \((?P<acc_per_pos>[^)]*)\)", kind="draft_stats"),
    _p("cli_drafted", "event", "n_drafted", r"^\s*n_drafted\s*=\s*(?P<generated>\d+)\s*$", kind="draft_stats",
       builds="examples/speculative 2023"),
    _p("json_draft_n", "event", '"draft_n"',
       r'"draft_n"\s*:\s*(?P<generated>\d+)(?:,\s*"draft_n_accepted"\s*:\s*(?P<accepted>\d+))?', kind="draft_stats",
       builds="server responses (timings)"),
    _p("json_draft_accepted", "event", '"draft_n_accepted"', r'"draft_n_accepted"\s*:\s*(?P<accepted>\d+)',
       kind="draft_stats", builds="server responses (timings), pretty-printed"),
    _p("cli_accept", "event", "n_accept", r"^\s*n_accept\s*=\s*(?P<accepted>\d+)\s*$", kind="draft_stats",
       builds="examples/speculative 2023"),
    _p("dflash_histogram", "event", "dflash acceptance histogram",
       r"dflash acceptance histogram: cycles=(?P<cycles>\d+) requested=(?P<requested>\d+) "
       r"produced=(?P<produced>\d+) accepted=(?P<accepted>\d+)", kind="draft_stats", builds="beellama.cpp"),
    _p("adaptive_depth", "event", "adaptive n",
       r"adaptive n\s*:\s*(?P<n_from>\d+)\s*->\s*(?P<n_to>\d+)\s*\(seq (?P<seq>\d+), n_draft=(?P<generated>\d+), "
       r"n_accepted=(?P<accepted>\d+)\)", kind="draft_stats", builds="upstream draft-mtp-adaptive"),
    # ---- warnings that name a sequence (the failure after them may not) and multimodal chunks
    _p("kv_nonconsecutive", "event", "non-consecutive token position",
       r"non-consecutive token position (?P<pos>\d+) after (?P<prev>\d+) for sequence (?P<seq>\d+)",
       kind="kv_warning"),
    _p("mm_image", "event", "image",
       r"(?:decoding image batch|failed to decode image|image (?:slice )?(?:decoded|processed|encoded)|processing image|"
       r"encoding image)", kind="mm"),
    _p("mm_chunk", "event", "eval chunk", r"failed to eval chunk", kind="mm"),
    # ---- which side was working just before a failure
    _p("draft_loading", "hint", "loading draft model", r"loading draft model", kind="draft_init", component="drafter",
       builds="server/common: a failure right after it is the draft model's load"),
    _p("draft_candidate", "hint", "draft candidate",
       r"seq_id (?P<seq>\d+), draft candidate\s+(?P<i>\d+), pos\s+(?P<pos>\d+)", kind="draft",
       component="drafter"),
    _p("server_decode", "hint", "n_batch (effective)", r"n_batch \(effective\) = (?P<n_batch>\d+)", kind="decode",
       component="target", builds="upstream server SRV_DBG, printed right before it decodes the slots' batch"),
    _p("generate_draft", "hint", "generate_draft", r"generate_draft: id=(?P<id>\d+).*?pos_next=(?P<pos>\d+)",
       kind="draft", component="drafter"),
    _p("spec_gen_draft", "hint", "common_speculative_gen_draft", r"common_speculative_gen_draft:", kind="draft_start",
       component="drafter", builds="server 2024-2025: printed right before the draft context decodes"),
    # the fork names no implementation line in some versions, but only DFlash checks its contract (F-15) or
    # caps the drafter's context for --spec-type dflash (fork arg.cpp): either names the type. Before dflash_kv,
    # which would take the contract line's key=value body as an event.
    _p("dflash_named", "meta", "dflash: ", r"(?P<impl>dflash): (?:contract ok:|setting -cd to )", kind="spec_impl",
       builds="beellama.cpp v0.3 (F-15, arg.cpp)"),
    # ---- DFlash key=value lines, generically (after the specific ones above)
    _p("dflash_kv", "event", "=", r"(?P<tag>DFLASH_DBG [\w ]+?|dflash[\w ]*?|ddtree[\w ]*?):? (?P<body>\S+=.*)",
       kind="dflash", component="drafter", builds="beellama.cpp v0.2-v0.3"),
    # ---- environment
    _p("version", "meta", "version:", r"version: (?P<build>\d+) \((?P<commit>[0-9a-f]+)\)", kind="version"),
    _p("build", "meta", "build:",
       r"build: (?P<build>\d+) \((?P<commit>[0-9a-f]+)\)(?: with (?P<compiler>.*?) for (?P<target>\S+))?",
       kind="version"),
    _p("built_with", "meta", "built with", r"built with (?P<compiler>.*?) for (?P<target>\S+)", kind="version"),
    _p("cuda_init", "meta", "ggml_cuda_init", r"ggml_cuda_init: found (?P<n>\d+) (?P<backend>CUDA|ROCm) devices?",
       kind="backend"),
    _p("vulkan_init", "meta", "Vulkan devices", r"ggml_vulkan: Found (?P<n>\d+) Vulkan devices?", kind="backend",
       extra={"backend": "Vulkan"}),
    _p("load_backend", "meta", "load_backend", r"load_backend: loaded (?P<backend>\w+) backend", kind="backend"),
    _p("metal_init", "meta", "ggml_metal_init", r"ggml_metal_init: (?:found|picking default) device:? (?P<name>.*)",
       kind="gpu", extra={"backend": "Metal"}),
    _p("gpu_device", "meta", "Device ",
       r"Device (?P<idx>\d+): (?P<name>[^,]+), (?:compute capability (?P<cc>[\d.]+)|(?P<arch>gfx\w+))"
       r"(?:.*?VRAM: (?P<mib>\d+) MiB)?", kind="gpu"),
    _p("metal_gpu_name", "meta", "GPU name:", r"ggml_metal\w*: GPU name:\s+(?P<name>\S.*?)\s*$", kind="gpu",
       extra={"backend": "Metal"}),
    _p("vulkan_device", "meta", "ggml_vulkan: ", r"ggml_vulkan: (?P<idx>\d+) = (?P<name>[^(|]+?) \(", kind="gpu",
       extra={"backend": "Vulkan"}),
    _p("smi_gpu", "meta", "NVIDIA",
       r"^\|\s+(?P<idx>\d+)\s+(?P<name>NVIDIA [^|]*?)\s+(?:On|Off)\s+\|", kind="gpu", extra={"backend": "CUDA"}),
    _p("multi_gpu_dflash", "meta", "multi-GPU placement detected",
       r"multi-GPU placement detected \(target=(?P<target_devices>\d+) devices, drafter=(?P<drafter_devices>\d+) devices\)",
       kind="placement", builds="beellama.cpp (F-17)"),
    # ---- the device layout (analyze/devices.py): devices, and where each model's layers and buffers went
    _p("device_listed", "meta", "MiB free)",
       r"(?:^|[\s-])(?P<device>[A-Za-z][A-Za-z_]*\d*)\s*: (?P<name>[^\s-].*?) \((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)",
       kind="device", builds="common_param device_info, --list-devices (2025-)"),
    _p("device_used", "meta", "using device",
       r"using device (?P<device>[\w.-]+) \((?P<name>.*?)\)(?: \((?P<id>[^)]*)\))? - (?P<free>\d+) MiB free",
       kind="use_device", builds="llama_model_load_from_file_impl, llama_prepare_model_devices"),
    _p("model_start", "meta", "loaded meta data with",
       r"loaded meta data with \d+ key-value pairs and \d+ tensors from (?P<path>.+?) \(version", kind="model_start"),
    _p("load_mode", "meta", "loading model tensors",
       r"loading model tensors, this can take a while\.\.\. \((?:load_mode = (?P<mode>\w+)|mmap = (?P<mmap>\w+))",
       kind="load_mode"),
    _p("layer_device", "meta", "assigned to device",
       r"layer\s+(?P<layer>\d+) assigned to device (?P<device>[\w.-]+)", kind="layer_device"),
    _p("kv_layer_device", "meta", ": dev = ", r"llama_kv_cache\w*: layer\s+(?P<layer>\d+): dev = (?P<device>[\w.-]+)",
       kind="kv_layer_device"),
    _p("buffer_size", "meta", "buffer size =",
       r"(?:^|\s)(?P<buffer>[A-Za-z][\w.]*(?:\[[^\]]*\])?)\s+(?:(?P<what>model|KV|RS|compute|output) )?buffer size ="
       r"\s*(?P<mib>[\d.]+) ?MiB", kind="buffer"),
    _p("offloaded", "meta", "layers to GPU", r"offloaded (?P<done>\d+)/(?P<total>\d+) layers to GPU", kind="offloaded"),
    _p("build_info", "meta", "print_info: build ",
       r"print_info: build (?P<build>\d+) \((?P<commit>[0-9a-f]+|unknown)\)(?: with (?P<compiler>.*?) for (?P<target>\S+))?",
       kind="version", builds="common_params_print_info (2026)"),
    _p("ctx_created", "meta", "n_ctx         =", r"llama_context: n_ctx\s+= (?P<n_ctx>\d+)", kind="context"),
    _p("kv_created", "meta", "cells", r"llama_kv_cache\w*: size = .*?\(\s*(?P<cells>\d+) cells", kind="kv_cache"),
    # the implementation line names the spec type: before the generic draft marker, which also matches it
    _p("spec_impl", "meta", "implementation", r"adding (?:speculative )?implementation '?(?P<impl>[\w-]+)'?",
       kind="spec_impl"),
    # every draft names its implementation too (`called impl draft-simple, hist size = ...`): a log cut after start-up
    _p("spec_impl_called", "meta", "called impl", r"called impl (?P<impl>[a-z][\w-]*), hist size", kind="spec_impl"),
    _p("draft_load", "meta", "draft", r"(?:loading draft model|adding speculative implementation|common_speculative_init|"
       r"draft model warmup|dflash: setting -cd)", kind="draft_marker"),
    # after spec_impl: the other lines a speculative implementation prints while it creates the draft context
    _p("spec_init", "hint", "common_speculative", r"common_speculative_(?:impl_\w+|init\w*):", kind="draft_init",
       component="drafter"),
    _p("rope_type", "meta", "rope", r"(?:rope type|rope_type)\s*=\s*(?P<rope>\S+)", kind="rope"),
    _p("model_arch", "meta", "general.architecture", r"general\.architecture\s+\w*\s*=\s*(?P<arch>\S+)",
       kind="arch"),
    _p("flags", "meta", "-",
       r"(?:^|\s)(?P<flag>--(?:spec-type|spec-draft-model|model-draft|spec-draft-ngl|n-gpu-layers|gpu-layers|"
       r"split-mode|tensor-split|kv-unified|parallel|ctx-size|ctx-size-draft|cache-type-k|cache-type-v|flash-attn|"
       r"spec-dflash-cross-ctx|draft-max|spec-draft-n-max|main-gpu|spec-draft-device|device-draft|device|rpc)|-md|-ngl|-np|-sm|-ts|-fa|-cd|"
       r"-kvu|-devd|-dev|-mg)"
       r"(?:[ =](?P<value>\"[^\"]*\"|[^\s\"-][^\s\"]*))?", kind="flag"),
    # ---- anything else llama.cpp prints, to tell a log from prose
    _p("generic", "generic", ":",
       r"(?:^|\s|\])(?:llama_model_loader|load_tensors|print_info|llama_context|llama_kv_cache\w*|llama_model_load\w*|"
       r"ggml_\w+|srv\s+\w+|slot\s+\w+|main|system_info|llama_print_timings|load_backend|common_\w+|"
       r"llama_init_from_model|init|decode|ubatch_\w+|update_slots|server_\w+|log_server_r|sampler_\w+|"
       r"que\s+\w+|spec\s+\w+|cmn\s+\w+|log_info|build_info|llama_perf_\w+):"),
)

BY_NAME: dict[str, Pattern] = {p.name: p for p in PATTERNS}
