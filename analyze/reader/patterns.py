"""Every llama.cpp log line the reader understands, as data.

One entry per wording. A new fork's wording is one more entry here, not a new code path: the walker
(analyze/reader/walker.py) only looks at an entry's `family` and `kind`. Regexes use named groups and no
look-around (so they also run on RE2/Rust engines) and are searched, not anchored, because lines arrive
with prefixes, markdown noise or stray characters glued on by interleaved stdout.

`anchor` is a literal that every matching line contains: the walker tests it with `in` before running
the regex, which keeps the hot loop cheap. Comments that cite `docs/llama-cpp-lines.md#...` point to the
project's account of that wording: which build prints it, in what format, and why the reader reads it so.

`examples` are the lines an entry is for, one per wording: copied from the real captures and reports
(tests/fixtures, samples) where they have one; otherwise the comment above them says where they come
from (built by hand to a format docs/llama-cpp-lines.md gives, or read by another test). tests/analyze/reader/test_patterns.py checks
that each holds the anchor, matches the regex and is given to its own entry by the walker's lookup.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field

from kvtrace.analyze.reader.normalize import message, plain_words


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
    examples: tuple[str, ...] = ()  # the lines it is for, one per wording (see above)
    # a failure's words (`failure_words`): a template over the named groups, `{cond}` as written (code), `{msg!n}`
    # as plain words (`plain_words`); empty: the line's message as plain words
    words: str = ""


def _p(name: str, family: str, anchor: str, regex: str, **kw: object) -> Pattern:
    return Pattern(name, family, anchor, re.compile(regex), **kw)  # type: ignore[arg-type]


class _Words(string.Formatter):
    """str.format with one more conversion, `!n`: the field as plain words."""

    def convert_field(self, value: object, conversion: str | None) -> object:
        if conversion == "n":
            return plain_words(str(value))
        return super().convert_field(value, conversion)


_WORDS = _Words()
CODE_KEPT = 400  # characters of an assert's condition that are kept (a pasted line can be 1 MB)


def failure_words(p: Pattern, m: re.Match[str], line: str) -> str:
    """What the failure `p` matched in `line` says, in the words that tell one bug from another (clusters of
    failures, a dataset's `failure`): read here, once, at match time."""
    if not p.words:
        return plain_words(message(line[: 16 * CODE_KEPT]))
    groups = {k: (v or "")[:CODE_KEPT].strip() for k, v in m.groupdict().items()}
    return _WORDS.format(p.words, **groups)


INT = r"-?\d+"
# Every regex here is searched over a stranger's line, which can be 1 MB of one wording's opening repeated. A run
# that can reach the line's end is rescanned from every opening, so the line costs openings x length: quadratic.
# So no run after an opening is unbounded unless it stops at the next opening (its class excludes the opening's
# character). The bounds, each far over the longest real text of its kind (the fixtures and the corpus):
# a group between an opening and a closing (an assert's condition, a gap of a line's words) spans at most SPAN
SPAN = r".{0,256}"
GAP = rf"{SPAN}?"  # the shortest words between two parts of a line (`.*?` bounded)
# the rest of a C function's name or a word after its known start (`llama_kv_cache_unified`, `restoring`):
# llama.cpp's longest function names are about 40 characters
NAME = r"\w{0,64}"
NUM = r"\d{1,12}"  # a count a line opens with (`4 sequences of ...`): a search restarts it at every digit
PATH = r".{1,1024}?"  # a model's path: longer than a gap, still a line's part

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
    # ---- LLAMA_BATCH_DEBUG (docs/llama-cpp-lines.md#batch-dumps): the input batch is dumped once, then once per ubatch split
    _p("batch_input", "batch", "input batch info", r"input batch info:", kind="input",
       examples=("0.00.228.522 D init: input batch info:",)),
    _p("batch_ubatch", "batch", "added ubatch to split", r"added ubatch to split", kind="ubatch",
       examples=("0.00.228.602 D ubatch_add: added ubatch to split:",)),
    _p("batch_field", "batch", "ubatch_print:",
       r"ubatch_print:\s+(?P<key>[a-z_]+)\s*= (?P<value>\S*)", kind="field",
       # the last two: b11739's header lines, read and passed over like any field the walker does not use
       examples=("0.00.228.525 D ubatch_print:   n_tokens     = 2",
                 "0.00.228.526 D ubatch_print:   n_seq_tokens = 1",
                 "0.00.228.527 D ubatch_print:   embd_state = (nil)",
                 "0.00.228.531 D ubatch_print:   type       = (nil)")),
    _p("batch_seq_pos", "batch", ": pos = [",
       rf"init:\s+(?P<seq>\d+): pos = \[\s*(?P<pos_min>{INT}),\s*(?P<pos_max>{INT})\]", kind="seq_pos",
       examples=("0.01.099.514 D init:     0: pos = [   0,   23], cpl = -",)),
    _p("batch_seq_open", "batch", "init:", r"init:\s+seq\s+= \[", kind="seq_open",
       examples=("0.00.228.574 D init:   seq       = [",)),
    _p("batch_seq_close", "batch", "init:", r"init:\s+\]\s*$", kind="seq_close",
       examples=("0.00.228.587 D init:   ]",)),
    # ---- LLAMA_KV_CACHE_DEBUG (docs/llama-cpp-lines.md#kv-cache-lines)
    _p("kv_stream", "kv", "find_slot: stream[",
       r"find_slot: stream\[(?P<stream>\d+)\], n = \s*(?P<n>\d+), used = \s*(?P<used>\d+), "
       r"head = \s*(?P<head>\d+), size = \s*(?P<size>\d+)", kind="stream",
       examples=("0.00.228.636 D find_slot: stream[0], n =     0, used =     0, head =     0, size =   512, n_swa =     0",)),
    _p("kv_seq", "kv", "find_slot: stream[",
       rf"find_slot: stream\[(?P<stream>\d+)\] min\[(?P<seq>\d+)\] = \s*(?P<pos_min>{INT}), "
       rf"max\[\d+\] = \s*(?P<pos_max>{INT})", kind="seq",
       examples=("0.01.111.729 D find_slot: stream[0] min[0] =     0, max[0] =    23",)),
    # ---- per-cycle slot line, early in the table because it is the most frequent after the dumps
    _p("accepted", "event", "draft tokens",
       r"accepted\s+(?P<accepted>\d+)/\s*(?P<drafted>\d+) draft tokens(?:, new n_tokens = (?P<pos>\d+))?",
       kind="accepted", component="target",
       examples=("0.01.116.440 I slot   operator(): id  0 | task 0 | accepted  1/ 3 draft tokens",
                 "0.01.118.254 D slot   operator(): id  0 | task 0 | accepted 1/3 draft tokens, new n_tokens = 26")),
    # ---- the position-check error block (docs/llama-cpp-lines.md#the-position-check); every closing variant, any part may be cut off
    # the header cut where a paste or a terminal ended it (`... in the input ba`, journald's `... batch have>`) is
    # still the header: no other message of llama-batch.cpp says "the tokens of sequence N in the input"
    _p("pos_header", "block", "the tokens of sequence",
       r"the tokens of sequence (?P<seq>\d+) in the input"
       r"(?: batch have inconsistent sequence positions| b[a-z ]*$| ?$)",
       kind="header",
       # examples: the second cut by the end of the paste (tests/fixtures/blind/batch-3, report 01)
       examples=("3.28.378.761 E init: the tokens of sequence 0 in the input batch have inconsistent sequence positions:",
                 "init: the tokens of sequence 0 in the input ba")),
    # cut before its sequence number (tests/fixtures/blind/batch-4, report 01: `init: the tokens of`), the same
    # family as the cut above; `init:` is llama-batch.cpp's function, so prose ending in "the tokens of" is not it
    _p("pos_header_cut", "block", "init: the tokens of", r"\binit: the tokens of(?: s[a-z]*)? ?$", kind="header",
       examples=("[...] init: the tokens of", "0.12.000.001 E init: the tokens of seq")),
    _p("pos_x", "block", "is X = ",
       rf"the last position stored in the memory module{GAP}for sequence (?P<seq>\d+) is X = (?P<x>{INT})",
       kind="x",
       examples=(" - the last position stored in the memory module of the context (i.e. the KV cache) for sequence 0 is X = 259",)),
    _p("pos_y", "block", "the tokens for sequence",
       rf"the tokens for sequence (?P<seq>\d+) in the input batch(?: have a starting position of Y = (?P<y>{INT}))?",
       kind="y",
       examples=(" - the tokens for sequence 0 in the input batch have a starting position of Y = 1361",
                 "2026-02-27 15:14:00 [60957]  - the tokens for sequence 3 in the input batch")),
    _p("pos_close_consecutive", "block", "remain consecutive",
       r"sequence positions remain consecutive: Y = X \+ 1", kind="close", extra={"variant": "consecutive"},
       examples=(" it is required that the sequence positions remain consecutive: Y = X + 1",)),
    _p("pos_close_mrope", "block", "for M-RoPE",
       r"for M-RoPE, it is required that the position satisfies: X (?P<op><=|&lt;=|<|&lt;) Y",
       kind="close", builds="upstream (X < Y); forks and older upstream (X <= Y)",
       examples=(" for M-RoPE, it is required that the position satisfies: X < Y",
                 " for M-RoPE, it is required that the position satisfies: X <= Y")),
    # ---- batch validation failures that return -1 (docs/llama-cpp-lines.md#the-position-check)
    _p("not_continuous", "failure", "positions are not continuous",
       r"sequence (?P<seq>\d+) positions are not continuous", kind="decode_failed",
       # examples: built to docs/llama-cpp-lines.md#the-position-check
       examples=("0.01.000.002 E init: sequence 0 positions are not continuous",)),
    _p("decreasing", "failure", "positions are decreasing",
       r"sequence (?P<seq>\d+) positions are decreasing", kind="decode_failed",
       # examples: built to docs/llama-cpp-lines.md#the-position-check
       examples=("0.01.000.002 E init: sequence 0 positions are decreasing (not allowed)",)),
    _p("diverged", "failure", "in the input batch, but have",
       r"sequence (?P<seq>\d+) is coupled to (?P<other>\d+) in the input batch, but have div\w*ged",
       kind="decode_failed",
       # examples: built to docs/llama-cpp-lines.md#the-position-check (sic: divereged)
       examples=("0.01.000.002 E init: sequence 1 is coupled to 0 in the input batch, but have divereged",)),
    _p("incompatible_sets", "failure", "incompatible sequence sets",
       r"sequence (?P<seq>\d+) belongs to incompatible sequence sets", kind="decode_failed",
       # examples: built to docs/llama-cpp-lines.md#the-position-check
       examples=("0.01.000.002 E init: sequence 1 belongs to incompatible sequence sets (not allowed)",)),
    _p("coupled_split", "failure", "coupled sequences in the input batch",
       r"sequential split is not supported when there are coupled sequences", kind="decode_failed",
       # examples: built to docs/llama-cpp-lines.md#the-position-check
       examples=("0.01.000.002 E split_equal: sequential split is not supported when there are coupled sequences in the input batch (you may need to use the -kvu flag)",)),
    _p("seq_not_from_last", "failure", "does not start from the last position",
       r"sequence (?P<seq>\d+) does not start from the last position stored in the memory", kind="decode_failed",
       builds="libllama mid-2025 (the position check before the X/Y wording)",
       examples=("Processing Prompt (1 / 1 tokens)init: sequence 0 does not start from the last position stored in the memory",)),
    _p("invalid_token", "failure", "invalid token[", rf"invalid token\[(?P<i>\d+)\] = (?P<token>{INT})",
       kind="decode_failed",
       # examples: built to docs/llama-cpp-lines.md#the-position-check
       examples=("0.01.000.002 E init: invalid token[3] = 151936",)),
    _p("invalid_seq_id", "failure", "invalid seq_id[",
       rf"invalid seq_id\[(?P<i>\d+)\]\[\d+\] = (?P<seq>{INT}) >= (?P<max>\d+)", kind="decode_failed",
       # examples: built to docs/llama-cpp-lines.md#the-position-check
       examples=("0.01.000.002 E init: invalid seq_id[0][0] = 4 >= 4",)),
    # b11739 (upstream llama-batch.cpp, the batch's content types): an input check reworded for batches whose
    # entries may carry a token id, an embedding or both; read as decode_failed causes like the checks above
    _p("entry_empty", "failure", "has neither a token id nor an embedding",
       r"entry (?P<i>\d+) has neither a token id nor an embedding", kind="decode_failed",
       builds="b11739 and later",
       # examples: built to docs/llama-cpp-lines.md#newer-builds-and-forks
       examples=("0.01.000.002 E init: entry 3 has neither a token id nor an embedding",)),
    _p("entries_mixed", "failure", "cannot be mixed with other entries",
       r"entries with both a token id and an embedding cannot be mixed with other entries", kind="decode_failed",
       builds="b11739 and later",
       # examples: built to docs/llama-cpp-lines.md#newer-builds-and-forks
       examples=("0.01.000.002 E init: entries with both a token id and an embedding cannot be mixed with other "
                 "entries",)),
    _p("mixed_unsupported", "failure", "batches mixing token and embedding",
       r"does not support batches mixing token and embedding entries", kind="decode_failed",
       builds="b11739 and later",
       # examples: built to docs/llama-cpp-lines.md#newer-builds-and-forks
       examples=("0.01.000.002 E init: this model or context does not support batches mixing token and embedding "
                 "entries",)),
    # ---- decode / encode failures and the callers that say which side failed (docs/llama-cpp-lines.md#decode-failures)
    _p("init_failed", "failure", "failed to initialize batch", r"failed to initialize batch",
       kind="decode_failed", extra={"stage": "1"},
       examples=("3.28.378.763 E decode: failed to initialize batch",)),
    _p("llama_decode_ret", "failure", "code, ret =",
       rf"llama_(?:de|en)code: failed to (?:de|en)code, ret = (?P<ret>{INT})",
       kind="decode_failed", extra={"stage": "2"},
       # examples: the second built to docs/llama-cpp-lines.md#decode-failures
       examples=("3.28.378.764 E llama_decode: failed to decode, ret = -1",
                 "1.02.345.607 E llama_encode: failed to encode, ret = -1")),
    _p("dflash_drafter_failed", "failure", "drafter decode failed",
       rf"dflash: drafter decode failed with (?P<ret>{INT})", kind="decode_failed", component="drafter",
       builds="beellama.cpp v0.2-v0.3, flat and tree drafts", extra={"stage": "3"},
       examples=("0.00.168.950 E dflash: drafter decode failed with -1",)),
    _p("dflash_batch_failed", "failure", "dflash batch: decode failed",
       rf"dflash batch: decode failed with (?P<ret>{INT})", kind="decode_failed", component="drafter",
       builds="beellama.cpp v0.2-v0.3, batched drafts", extra={"stage": "3"},
       # examples: built to docs/llama-cpp-lines.md#drafting-failures
       examples=("1.02.345.690 E dflash batch: decode failed with -1",)),
    _p("ctx_dft_failed", "failure", "ctx_dft)",
       rf"llama_(?:(?:de|en)code|process)\(ctx_dft\){GAP}rc=(?P<ret>{INT})", kind="decode_failed", component="drafter",
       builds="upstream EAGLE3/MTP/draft-dflash, forks", extra={"stage": "3"},
       # examples: the others built to docs/llama-cpp-lines.md#speculative-decoding-upstream and #decode-failures
       examples=("3.28.378.765 E spec flush_deferr: llama_decode(ctx_dft) deferred flush failed rc=-1",
                 "0.01.000.000 E spec      process: llama_process(ctx_dft) failed rc=-1 (n_tokens=16, offset=0)",
                 "0.01.000.000 E spec      process: llama_encode(ctx_dft) failed rc=-1 (n_tokens=16, offset=0)")),
    _p("draft_decode_returned", "failure", " returned ",
       rf"draft{NAME}: llama_(?:decode|process)(?:\[\d+\])? returned (?P<ret>{INT})", kind="decode_failed",
       component="drafter", builds="upstream draft-simple/draft-dflash, MTP forks", extra={"stage": "3"},
       # examples: the second measured (docs/llama-cpp-lines.md#measured-on-real-runs), the third built to #speculative-decoding-upstream
       examples=("0.44.777.485 W draft: llama_decode returned -1",
                 "W draft: llama_process returned 1",
                 "1.00.000.100 E spec        draft: llama_decode[0] returned -1")),
    _p("draft_batch_failed", "failure", "failed to decode draft batch",
       rf"failed to decode draft batch, ret = (?P<ret>{INT})", kind="decode_failed", component="drafter",
       extra={"stage": "3"},
       # examples: built to docs/llama-cpp-lines.md#decode-failures
       examples=("1.00.000.100 E spec      process: failed to decode draft batch, ret = -1",)),
    _p("speculative_batch_failed", "failure", "failed to process speculative batch",
       r"failed to process speculative batch", kind="decode_failed", component="drafter",
       extra={"stage": "4"},
       examples=("3.28.378.766 E srv        decode: failed to process speculative batch",)),
    _p("invalid_input_batch", "failure", "Invalid input batch",
       rf"Invalid input batch\.? (?:i|off) = (?P<off>\d+), n_batch = (?P<n_batch>\d+), ret = (?P<ret>{INT})",
       kind="decode_failed", component="target", extra={"stage": "4"},
       # examples: the second built to docs/llama-cpp-lines.md#the-servers-lines
       examples=("srv  update_slots: Invalid input batch. i = 0, n_batch = 2048, ret = -1",
                 "3.01.002.003 E srv        decode: Invalid input batch. off = 0, n_batch = 2048, ret = -1")),
    _p("compute_error", "failure", "Compute error",
       rf"Compute error\.? (?:i|off) = (?P<off>\d+), n_batch = (?P<n_batch>\d+), ret = (?P<ret>{INT})",
       kind="decode_failed", component="target", extra={"stage": "4"},
       # examples: built to docs/llama-cpp-lines.md#the-servers-lines (off, then i)
       examples=("3.01.002.003 E srv        decode: Compute error. off = 0, n_batch = 2048, ret = -3",
                 "srv  update_slots: Compute error. i = 0, n_batch = 2048, ret = -3")),
    _p("context_exceeded", "failure", "Context size has been exceeded",
       rf"Context size has been exceeded\.?(?: (?:i|off) = (?P<off>\d+), n_batch = (?P<n_batch>\d+), "
       rf"ret = (?P<ret>{INT}))?", kind="kv_slot", component="target", extra={"stage": "4"},
       # examples: built to docs/llama-cpp-lines.md#the-servers-lines (off, then i)
       examples=("3.01.002.003 E srv        decode: Context size has been exceeded. off = 0, n_batch = 2048, ret = 1",
                 "3.01.002.003 E srv  update_slots: Context size has been exceeded. i = 0, n_batch = 2048, ret = 1")),
    _p("kv_cache_full", "failure", "KV cache is full",
       rf"KV cache is full(?:[^\n]*?ret = (?P<ret>{INT}))?", kind="kv_slot", component="target",
       builds="server 2024 (failed to decode the batch: KV cache is full - try increasing it via the context size)",
       extra={"stage": "4"},
       # examples: the 2024 server's wording as tests/analyze/reader/test_walker.py reads it (no capture has one)
       examples=("srv  update_slots: failed to decode the batch: KV cache is full - try increasing it via the context size, i = 0, n_batch = 512, ret = 1",)),
    _p("no_kv_slot_old", "failure", "failed to find KV cache slot",
       r"failed to find KV cache slot(?: for ubatch of size (?P<n_tokens>\d+))?", kind="kv_slot",
       builds="libllama 2024-2025 (llama_decode_impl / llama_decode_internal)", extra={"stage": "1"},
       examples=("decode: failed to find KV cache slot for ubatch of size 454",)),
    _p("request_exceeds_context", "failure", "exceeds the available context size",
       r"exceeds the available context size", kind="kv_slot", component="target", extra={"stage": "4"},
       # examples: llama-server's send_error with this wording (no capture has one)
       examples=("srv  send_error: task id = 0, error: the request exceeds the available context size, try increasing it",)),
    _p("server_decode_failed", "failure", "failed to decode the batch",
       rf"failed to decode the batch, n_batch = (?P<n_batch>\d+), ret = (?P<ret>{INT})",
       kind="decode_failed", component="target", builds="server before 2025", extra={"stage": "4"},
       examples=("[1707364943] update_slots : failed to decode the batch, n_batch = 1, ret = 1",)),
    # wrappers that word a failed decode their own way: llama-cpp-python raises, the ollama Go runner
    # panics, the old server / ik_llama.cpp print `ERR [ function ] message | key=value`
    _p("python_decode_raise", "failure", "llama_decode returned",
       rf"(?:RuntimeError|ValueError|Exception|Error)\b\W*llama_decode returned (?P<ret>{INT})", kind="decode_failed",
       builds="llama-cpp-python (Llama.eval raises)", extra={"stage": "4"},
       # examples: the exception as docs/llama-cpp-lines.md#runtimes-around-llamacpp gives it
       examples=("RuntimeError: llama_decode returned -1",)),
    _p("go_kv_slot", "failure", "could not find a kv cache slot",
       r"could not find a kv cache slot(?: \(length: (?P<n_tokens>\d+)\))?", kind="kv_slot",
       builds="ollama runner (Go panic or level=ERROR line)", extra={"stage": "4"},
       examples=("panic: failed to decode batch: could not find a kv cache slot (length: 2560)",)),
    # llama.h's words for llama_decode's 1 (no KV slot), as wrappers raise them with the code or without it: the
    # ollama 0.4 runner's `error="could not find a KV slot for the batch - ... code: 1"` after its `failed to
    # decode batch` (so this entry comes before that one), node-llama-cpp's `[Error: could not find a KV slot ...`;
    # only as an error's text, not where llama.h's doc comment lists the codes (`///  - 1: could not find ...`)
    _p("kv_slot_for_batch", "failure", "could not find a KV slot",
       rf"(?:error=\"|Error: )could not find a KV slot for the batch(?:[^\n]*?code: (?P<ret>{INT}))?", kind="kv_slot",
       builds="wrappers quoting llama.h (ollama 0.4 runner, node-llama-cpp)", extra={"stage": "4"},
       examples=('ERROR source=runner.go:426 msg="failed to decode batch" error="could not find a KV slot for the batch - try reducing the size of the batch or increase the context. code: 1"',
                 "[Error: could not find a KV slot for the batch (try reducing the size of the batch or increase the context)]")),
    _p("go_decode_panic", "failure", "failed to decode batch",
       r"(?:panic: |msg=\"?)failed to decode batch(?:: (?P<msg>.*))?", kind="decode_failed",
       builds="ollama runner (Go panic or level=ERROR line)", extra={"stage": "4"},
       # examples: ollama's runner, both forms, with a decode error other than the KV slot one (no capture has one)
       examples=("panic: failed to decode batch: llama_decode failed with code -1",
                 'time=2025-05-26T18:51:32.027Z level=ERROR source=runner.go:360 msg="failed to decode batch" error="llama_decode failed with code -1"')),
    _p("invalid_input_batch_msg", "failure", "Invalid input batch",
       r"[\'\"]message[\'\"]\s*:\s*[\'\"]Invalid input batch", kind="decode_failed", component="target",
       builds="llama-server's HTTP 500 body as a client (Python openai, requests) raises it", extra={"stage": "4"},
       examples=('{"error":{"code":500,"message":"Invalid input batch.","type":"server_error"}}',)),
    _p("kv_form_decode", "failure", "ret=",
       rf"(?:Invalid input batch|Compute error|failed to decode)[^|\n]{{0,256}}\|[^|\n]{{0,256}}?\bret=(?P<ret>{INT})",
       kind="decode_failed", component="target", builds="server 2024, ik_llama.cpp (`ERR [ fn ] msg | key=value`)",
       extra={"stage": "4"},
       # examples: as tests/analyze/reader/test_walker.py reads it (no capture has one)
       # (`failed to decode` covers `failed to decode the batch`; the key=value part has no second `|`)
       examples=('ERR [              update_slots] failed to decode the batch | tid="140478308075456" timestamp=1724599956 i=0 n_batch=512 ret=-1',)),
    _p("cannot_decode_encoder", "failure", "use llama_encode() instead",
       r"cannot decode batches with this context \(use llama_encode\(\) instead\)", kind="decode_failed",
       builds="an embedding/encoder-only model called with llama_decode", extra={"stage": "1"},
       examples=("decode: cannot decode batches with this context (use llama_encode() instead)",)),
    _p("prepare_ubatch_failed", "failure", "failed to prepare ubatch", r"failed to prepare ubatch",
       kind="decode_failed", extra={"stage": "1"},
       examples=("decode: failed to prepare ubatch",)),
    # ---- a draft / MTP / EAGLE / DFlash context that fails to load or initialise (kind `load`)
    _p("draft_ctx_create_failed", "failure", "failed to create",
       r"failed to create (?:the )?(?:shared )?(?P<what>MTP|draft|DFlash|EAGLE\d?|speculative|drafter)\w*(?: drafter)? context",
       kind="load", component="drafter", extra={"stage": "2"},
       # examples: the others built to docs/llama-cpp-lines.md#the-servers-lines and #start-up-lines
       examples=("E srv    load_model: failed to create MTP context",
                 "E srv    load_model: failed to create draft context",
                 "E srv    load_model: failed to create shared DFlash drafter context")),
    _p("draft_ctx_measure_failed", "failure", "MTP context memory", r"failed to measure MTP context memory",
       kind="load", component="drafter", extra={"stage": "2"},
       examples=("[spec] failed to measure MTP context memory: failed to create llama_context from model",)),
    _p("draft_model_load_failed", "failure", "failed to load",
       r"failed to load (?:the )?(?P<what>draft model|MTP head|drafter|DFlash drafter|EAGLE\d? (?:draft|model))",
       kind="load", component="drafter", extra={"stage": "2"},
       examples=("srv    load_model: failed to load MTP head from 'C:\\Qwen3.6-35B-A3B-MTP-UD-Q4_K_XL.gguf'",
                 "srv    load_model: failed to load draft model, 'C:\\Qwen3.5-0.8B-Q4_K_M.gguf'")),
    _p("draft_not_valid", "failure", "is not a valid DFlash drafter", r"is not a valid DFlash drafter",
       kind="load", component="drafter", builds="beellama.cpp", extra={"stage": "2"},
       # examples: built to docs/llama-cpp-lines.md#start-up-lines
       examples=("E srv    load_model: draft model 'dflash.gguf' is not a valid DFlash drafter: missing complete DFlash metadata",)),
    _p("draft_vocab_mismatch", "failure", "draft model vocab",
       r"draft model vocab type must match target model", kind="load", component="drafter", extra={"stage": "2"},
       # examples: built to docs/llama-cpp-lines.md#speculative-decoding-upstream (the end as upstream words it)
       examples=("E common_speculative_are_compatible: draft model vocab type must match target model to use speculation but vocab_type_dft = 1 while vocab_type_tgt = 2",)),
    # one entry per anchor: no literal is in all three wordings
    _p("embd_mismatch", "failure", "match",
       r"(?:n_embd|hidden[ _]size|embedding (?:size|length))[^\n]{0,60}?(?:mismatch|does not match)",
       kind="load", extra={"stage": "2"},
       # examples: no capture has one: the first as tests/analyze/reader/test_walker.py reads it, the second a DFlash contract check's
       examples=("common_speculative_impl_draft_eagle3: draft n_embd 4096 does not match target hidden size 5120",
                 "dflash: invalid contract: drafter/target n_embd mismatch")),
    _p("embd_differs", "failure", "differs",
       r"(?:n_embd|hidden[ _]size|embedding (?:size|length))[^\n]{0,60}?differs",
       kind="load", extra={"stage": "2"},
       # examples: no capture has one: the wording issue 23 names
       examples=("n_embd of the draft differs from the target's (2048 vs 4096)",)),
    # a drafter that needs its target's context to be created (DFlash, an MTP head such as Gemma4Assistant): the
    # draft side's, even where no other line names the draft (docs/llama-cpp-lines.md#start-up-notices: `dflash requires ctx_other`,
    # tests/fixtures/blind/batch-4 report 03's `Gemma4Assistant requires ctx_other`)
    _p("ctx_other_required", "failure", "requires ctx_other",
       r"failed to initialize the context: (?P<msg>\S+ requires ctx_other to be set.*)", kind="load",
       component="drafter", extra={"stage": "1"},
       examples=("llama_init_from_model: failed to initialize the context: dflash requires ctx_other to be set "
                 "(this warning is normal during memory fitting)",
                 "llama_init_from_model: failed to initialize the context: Gemma4Assistant requires ctx_other to be "
                 "set")),
    _p("init_context_failed", "failure", "failed to initialize the context",
       r"failed to initialize the context(?:: (?P<msg>.*))?", kind="load", extra={"stage": "1"},
       examples=("llama_init_from_model: failed to initialize the context: failed to allocate compute pp buffers",)),
    _p("mtp_layers_missing", "failure", "doesn't contain MTP layers",
       r"context type MTP requested but model doesn't contain MTP layers", kind="load", component="drafter",
       extra={"stage": "1"},
       examples=("W llama_init_from_model: context type MTP requested but model doesn't contain MTP layers",)),
    # the model itself fails to load: a start-up failure (the device cannot hold the split, a bad file)
    # an architecture only a drafter has (DSpark's, DFlash's, EAGLE's heads): the model that could not be read is
    # the draft model when no line of the failure names a side (analyze/reader/verdict.py's failing_side); before
    # `model_load_error`, which reads the same line
    _p("draft_arch_unknown", "failure", "unknown model architecture",
       r"unknown model architecture: '(?P<arch>dspark|dflash|eagle\d?)'", kind="load", extra={"stage": "1"},
       examples=("llama_model_load: error loading model: unknown model architecture: 'dspark'",
                 "llama_model_load: error loading model: error loading model architecture: unknown model architecture: 'dflash'")),
    # the message is the innermost one, as llama.cpp re-raises it (`error loading model: error loading model
    # architecture: ...`)
    _p("model_load_error", "failure", "error loading model",
       r"error loading model: (?:error loading model architecture: )?(?P<msg>.*)", kind="load", extra={"stage": "1"},
       words="{msg!n}",
       examples=("llama_model_load: error loading model: invalid vector subscript",)),
    # ---- b11434 and a turboquant-derived fork (docs/llama-cpp-lines.md#newer-builds-and-forks): failures of
    # their own wording
    _p("draft_trim_failed", "failure", "failed to trim draft memory",
       r"failed to trim draft memory for sequence (?P<seq>\d+)", kind="error", component="drafter",
       builds="a turboquant-derived fork: deferred-flush MTP (not llama.cpp b11434 or master)", extra={"stage": "0"},
       # examples: built to docs/llama-cpp-lines.md#stale-draft-trims
       examples=("0.02.000.000 E spec flush_deferr: failed to trim draft memory for sequence 0",)),
    # b11434's slot memory aborts when a context cannot remove part of a sequence (common/common.cpp): a recurrent or
    # hybrid model's memory, such as a draft context created with n_rs_seq = 0 (docs/llama-cpp-lines.md#versions-forks-and-their-debug-switches)
    _p("seq_rm_failed", "failure", "failed to remove sequence",
       rf"failed to remove sequence (?P<seq>\d+) with p0=(?P<p0>{INT}), p1=(?P<p1>{INT})", kind="assert",
       builds="llama.cpp b11434 (common_memory::seq_rm)", extra={"stage": "0"},
       # examples: a real llama-server b11434 run with a Mamba drafter (tools/scenarios.py), its build path shortened
       examples=("llama.cpp/common/common.cpp:1597: failed to remove sequence 0 with p0=27, p1=-1",)),
    _p("chain_process_failed", "failure", "llama_process(chain) returned",
       rf"llama_process\(chain\) returned (?P<ret>{INT})", kind="decode_failed", component="drafter",
       builds="a turboquant-derived fork: chained MTP, LLAMA_SPEC_CHAIN", extra={"stage": "3"},
       # examples: built to docs/llama-cpp-lines.md#dflash-clamps-adaptive-depth-and-chained-mtp
       examples=("0.02.000.000 E llama_process(chain) returned -1",)),
    _p("adaptive_range_abort", "failure", "invalid adaptive draft range",
       r"invalid adaptive draft range(?:: (?P<cond>.*))?", kind="assert", builds="a turboquant-derived fork: draft-mtp-adaptive",
       extra={"stage": "0"},
       # examples: built to docs/llama-cpp-lines.md#dflash-clamps-adaptive-depth-and-chained-mtp (the detail after the colon made up)
       examples=("common/speculative.cpp:1500: invalid adaptive draft range: n_min = 4 > n_max = 2",)),
    _p("synthetic_bad_args", "failure", "synthetic acceptance",
       r"synthetic acceptance (?P<cond>length and rates are mutually exclusive|rates must be monotonically "
       r"non-increasing|requires at least one speculative token)", kind="error",
       builds="b11434 --spec-synth-len/--spec-synth-rates, at start-up", extra={"stage": "0"},
       # examples: built to docs/llama-cpp-lines.md#synthetic-acceptance
       examples=("error: synthetic acceptance length and rates are mutually exclusive",
                 "error: synthetic acceptance rates must be monotonically non-increasing",
                 "error: synthetic acceptance requires at least one speculative token")),
    _p("rc_failed", "failure", "rc=", rf"\bfailed\b{GAP}\brc=(?P<ret>{INT})", kind="decode_failed",
       extra={"stage": "3"},
       # examples: any other call that failed with an rc= (no capture has one)
       examples=("E spec      prepare: chain decode failed rc=-1",)),
    # ---- no room in the KV cache (docs/llama-cpp-lines.md#kv-cache-lines)
    _p("no_memory_slot", "failure", "failed to find a memory slot",
       r"failed to find a memory slot for batch of size (?P<n_tokens>\d+)", kind="kv_slot",
       extra={"stage": "1"},
       examples=("decode: failed to find a memory slot for batch of size 1024",)),
    _p("no_free_space", "failure", "failed to find free space in the KV cache",
       r"failed to find free space in the KV cache(?:, retrying with smaller (?:batch size|n_batch)\D*(?P<n_batch>\d+))?",
       kind="kv_slot", component="target", extra={"stage": "4"},
       examples=("llama.cpp-gpu  | update_slots : failed to find free space in the KV cache, retrying with smaller n_batch = 256",
                 "1148.24.913.094 W srv              update_slots: failed to find free space in the KV cache, retrying with smaller batch size - try increasing it via total context size or enabling defragmentation, i = -32, n_batch = 32, ret = 1")),
    _p("ubatch_prepare", "failure", "failed to prepare",
       r"failed to prepare (?P<what>attention|recurrent) ubatches", kind="kv_slot", extra={"stage": "1"},
       # examples: the second built to docs/llama-cpp-lines.md#kv-cache-lines
       examples=("29.22.010.153 E init_batch: failed to prepare attention ubatches",
                 "0.01.000.000 E init_batch: failed to prepare recurrent ubatches")),
    _p("no_cells", "failure", "available cells in kv cache",
       r"failed to find (?:(?P<n>\d+) )?available cells in kv cache", kind="kv_slot", extra={"stage": "1"},
       # examples: built to docs/llama-cpp-lines.md#kv-cache-lines (upstream, then the fork)
       examples=("0.01.000.000 E state_read_meta: failed to find 512 available cells in kv cache",
                 "0.01.000.000 E state_read_meta: failed to find available cells in kv cache")),
    _p("not_enough_cells", "failure", "not enough cells in kv cache", r"not enough cells in kv cache",
       kind="kv_slot", extra={"stage": "1"},
       # examples: built to docs/llama-cpp-lines.md#kv-cache-lines
       examples=("0.01.000.000 E state_read_meta: not enough cells in kv cache",)),
    _p("kv_too_small", "failure", "> size =", r"find_slot: n_tokens = (?P<n_tokens>\d+) > size = (?P<size>\d+)",
       kind="kv_slot", extra={"stage": "1"},
       # examples: built to docs/llama-cpp-lines.md#kv-cache-lines
       examples=("0.01.000.000 E find_slot: n_tokens = 1024 > size = 512",)),
    # ---- asserts and aborts
    _p("encoder_assert", "failure", "encoder requires",
       r'GGML_ASSERT\((?P<cond>[^"]{0,160}"encoder requires[^"]{0,160}")\)\s*failed', kind="assert", component="drafter",
       words="GGML_ASSERT({cond})",
       builds="DFlash drafters are non-causal: llama_decode routes them through encode()", extra={"stage": "0"},
       examples=('/raid/models/llama-cpp-dflash/src/llama-context.cpp:2320: GGML_ASSERT(cparams.n_ubatch >= n_tokens && "encoder requires n_ubatch >= n_tokens") failed',)),
    _p("ggml_assert", "failure", "GGML_ASSERT", rf"GGML_ASSERT\((?P<cond>{SPAN}?)\)\s*failed", kind="assert",
       extra={"stage": "0"}, words="GGML_ASSERT({cond})",
       examples=("/home/user/llama.cpp-b9550/ggml/src/ggml-backend.cpp:194: GGML_ASSERT(buffer) failed",)),
    _p("ggml_assert_old", "failure", "GGML_ASSERT: ", r"GGML_ASSERT: (?P<file>(?:[A-Za-z]:)?[^\s:]+):(?P<at>\d+): (?P<cond>.*)",
       kind="assert", builds="ggml 2023 (`GGML_ASSERT: file:line: cond`)", extra={"stage": "0"},
       words="GGML_ASSERT({cond})",
       # examples: ggml.h's 2023 macro as it printed (fprintf(stderr, "GGML_ASSERT: %s:%d: %s\n", ...))
       examples=("GGML_ASSERT: /home/user/llama.cpp/ggml.c:4785: view_src == NULL || data_size + view_offs <= ggml_nbytes(view_src)",
                 "[1707364943] GGML_ASSERT: llama.cpp:9186: n_tokens <= n_batch",
                 r"GGML_ASSERT: D:\a\llama.cpp\llama.cpp\ggml.c:4785: false")),
    # llama.cpp's own copy of that 2023 macro (llama-util.h's LLAMA_ASSERT, the same fprintf): a Windows build
    # prints the file with its drive letter
    _p("llama_assert_old", "failure", "LLAMA_ASSERT: ",
       r"LLAMA_ASSERT: (?P<file>(?:[A-Za-z]:)?[^\s:]+):(?P<at>\d+): (?P<cond>.*)",
       kind="assert", builds="llama.cpp 2023 (`LLAMA_ASSERT: file:line: cond`)", extra={"stage": "0"},
       examples=(r"LLAMA_ASSERT: D:\a\llama.cpp\llama.cpp\llama.cpp:830: false",
                 "LLAMA_ASSERT: /home/user/llama.cpp/llama.cpp:1120: n_tokens <= n_batch")),
    _p("c_assert", "failure", "Assertion", rf"Assertion [`'\"](?P<cond>{SPAN})['\"] failed", kind="assert",
       extra={"stage": "0"}, words="assert({cond})",
       # examples: the title of corpus report 30 (tests/fixtures/corpus/labels.json)
       examples=("title: Eval bug: Assertion `count > 0 && count <= ctx->penalty_last_n' failed.",)),
    # MSVC's C runtime words the same assert its own way (`Assertion failed: expr, file path, line N`)
    _p("msvc_assert", "failure", "Assertion failed: ", rf"Assertion failed: (?P<cond>{SPAN}?), file ", kind="assert",
       extra={"stage": "0"}, words="assert({cond})", builds="Windows builds (MSVC's assert)",
       # examples: the MSVC CRT's wording of assert (no capture has one)
       examples=("Assertion failed: n_tokens <= n_batch, file llama.cpp, line 1234",)),
    _p("ggml_abort", "failure", "GGML_ABORT", rf"GGML_ABORT\((?P<cond>{SPAN})\)", kind="assert", extra={"stage": "0"},
       # examples: the macro as a report quotes the code (docs/llama-cpp-lines.md#speculative-decoding-upstream)
       examples=('    GGML_ABORT("failed to remove sequence %d\\n")',)),
    # what GGML_ABORT("fatal error") prints (ggml_abort: `%s:%d: ` then the message): the backend's own abort
    # line, before its backtrace, a CPU op it cannot run or a CUDA kernel it has no case for; a compiler's
    # `file.c:12:10: fatal error: x.h: No such file` has a column and a colon after it, so it is not read
    _p("ggml_fatal_error", "failure", "fatal error",
       r"(?P<file>(?:[A-Za-z]:)?[^\s:]{0,256}\.(?:c|cc|cpp|cu|m)):(?P<at>\d+): fatal error\s*$", kind="assert",
       builds="ggml (GGML_ABORT(\"fatal error\"))", extra={"stage": "0"},
       # examples: the CPU and CUDA backends' lines of tests/fixtures/blind/batch-10 reports 02 and 07
       examples=(r"E:\buun-llama-cpp\ggml\src\ggml-cpu\ggml-cpu.c:2455: fatal error",
                 "/home/user/llama.cpp/ggml/src/ggml-cuda/fattn.cu:574: fatal error")),
    _p("segfault", "failure", "Segmentation fault", r"Segmentation fault", kind="assert", extra={"stage": "0"},
       # examples: the shell's report of the crash (no capture has one)
       examples=("Segmentation fault (core dumped)",)),
    _p("aborted", "failure", "Aborted", r"(?:^|\s)Aborted(?: \(core dumped\))?\s*$", kind="assert", extra={"stage": "0"},
       # examples: the shell's report of the crash (no capture has one)
       examples=("Aborted (core dumped)",)),
    _p("cuda_error", "failure", "CUDA error", r"CUDA error: (?P<cond>.*)", kind="assert", extra={"stage": "0"},
       words="CUDA error: {cond!n}",
       # examples: as tests/analyze/reader/test_walker.py reads it (no capture has one)
       examples=("CUDA error: an illegal memory access was encountered",)),
    # the CUDA backend naming the op it could not run (ggml_cuda_compute_forward), before its CUDA error and
    # abort; after `cuda_error` so a line holding both keeps the error's text
    _p("cuda_op_failed", "failure", "compute_forward: ", r"compute_forward: (?P<op>[A-Z][A-Z0-9_]*) failed",
       kind="assert", builds="ggml CUDA backend", extra={"stage": "0"},
       examples=("ggml_cuda_compute_forward: RMS_NORM failed", "Output : ggml_cuda_compute_forward: ADD failed")),
    _p("device_lost", "failure", "DeviceLost", r"(?:ErrorDeviceLost|DeviceLostError)", kind="assert",
       extra={"stage": "0"}, builds="Vulkan",
       # examples: Vulkan-Hpp's exception and result names (no capture has one)
       examples=("terminate called after throwing an instance of 'vk::DeviceLostError'",
                 "  what():  vk::Queue::submit: ErrorDeviceLost")),
    # an RPC device that went away: ggml-rpc's RPC_STATUS_ASSERT aborts, after the socket error it saw
    _p("rpc_lost", "failure", "Remote RPC server", r"Remote RPC server crashed or returned malformed response",
       kind="assert", extra={"stage": "0"}, builds="ggml-rpc",
       # examples: ggml-rpc's, as tests/analyze/reader/test_devices.py reads it (no capture has one)
       examples=("/build/llama.cpp/ggml/src/ggml-rpc/ggml-rpc.cpp:509: Remote RPC server crashed or returned malformed response",)),
    _p("rpc_io", "failure", " failed (bytes_", r"(?P<op>send|recv) failed \(bytes_", kind="error",
       extra={"stage": "0"}, builds="ggml-rpc",
       # examples: ggml-rpc's, as tests/analyze/reader/test_devices.py reads it (no capture has one)
       examples=("0.02.000.000 E send failed (bytes_sent=0, size_to_send=8)",
                 "0.02.000.000 E recv failed (bytes_recv=0, size_to_recv=8)")),
    # ggml's 2023 allocator (ggml_new_object, ggml_new_tensor_impl) out of room in a context's fixed pool or in a
    # scratch buffer: the model's tensors or the compute graph did not fit the size the loader reserved
    _p("memory_pool", "failure", "memory pool",
       r"(?P<fn>ggml_new_\w{1,64}): not enough space in the (?P<pool>context's|scratch) memory pool"
       r"(?: \(needed (?P<needed>\d+), available (?P<available>\d+)\))?", kind="error",
       extra={"stage": "0"}, builds="ggml 2023 (ggjt and early GGUF)",
       # examples: tests/fixtures/blind/batch-9 reports 11, 13 and 10 (glued to koboldcpp's progress line)
       examples=("ggml_new_object: not enough space in the context's memory pool (needed 10882896, available 10650320)",
                 "ggml_new_tensor_impl: not enough space in the context's memory pool (needed 458853944, available 454395136)",
                 "`Processing Prompt [BLAS] (7168 / 7321 tokens)ggml_new_tensor_impl: not enough space in the scratch "
                 "memory pool (needed 1279262720, available 1197473280)")),
    _p("rpc_connect", "failure", "Failed to connect to", r"Failed to connect to (?P<endpoint>\S+)", kind="error",
       extra={"stage": "0"}, builds="ggml-rpc",
       # examples: ggml-rpc's (no capture has one)
       examples=("Failed to connect to 127.0.0.1:50052",)),
    _p("invalid_reduced_logits", "failure", "invalid reduced-logits",
       r"invalid reduced-logits (?:token (?P<token>-?\d+)|shape) in (?P<where>\w+)", kind="error",
       component="drafter", builds="beellama.cpp v0.2-v0.3", extra={"stage": "0"},
       # examples: built to docs/llama-cpp-lines.md#drafting-failures
       examples=("0.14.967.966 E dflash: invalid reduced-logits token -1 in draft at row=1/16 (top_k=1 committed=382 cross_len=382)",
                 "0.14.967.966 E dflash: invalid reduced-logits shape in draft_tree (rows=15 required=16 top_k=1)")),
    _p("terminate", "failure", "terminate called", r"terminate called (?P<cond>.*)", kind="assert",
       extra={"stage": "0"},
       # examples: libstdc++'s (no capture has one)
       examples=("terminate called after throwing an instance of 'std::runtime_error'",)),
    # ---- lines that follow a failure (never start one)
    _p("decode_exception", "follow", "decode() failed", r"decode\(\) failed: (?P<msg>.*)",
       # examples: built to docs/llama-cpp-lines.md#the-servers-lines
       examples=("3.01.002.004 E srv  update_slots: decode() failed: Invalid input batch.",)),
    _p("send_error", "follow", "send_error", r"send_error: task id = (?P<task>\d+), error: (?P<msg>.*)",
       examples=("srv    send_error: task id = 297, error: Invalid input batch.",)),
    # alone (no failure open) it is an error of its own: the caller asked for logits the batch did not output
    _p("invalid_logits", "follow", "invalid logits id", r"invalid logits id (?P<i>-?\d+)", extra={"alone": "error"},
       examples=("get_logits_ith: invalid logits id 2, reason: batch.logits[2] != true",
                 "[2025-07-03 19:48:39.319779] E get_logits_ith: invalid logits id -1, reason: no logits")),
    _p("kobold_predict_failed", "follow", "Failed to predict",
       r"Failed to predict at token position (?P<pos>\d+)", builds="koboldcpp (after its llama_decode fails)",
       examples=("Failed to predict at token position 15480! Check your context buffer sizes!",)),
    _p("model_load_exit", "follow", "exiting due to model loading error", r"exiting due to model loading error",
       examples=("srv  llama_server: exiting due to model loading error",)),
    _p("goroutine", "follow", "goroutine", r"^goroutine (?P<n>\d+) \[running\]",
       examples=("goroutine 60 [running]:",)),
    # the address class holds no lone digit, so the walker can remember frames by their masked text
    # a backtrace pasted with each line's `[pid]` or docker-compose `service |` column in front
    _p("frame", "follow", "#", r"^(?:\[\d+\]|[\w.-]+\s+\|)?\s*#(?P<n>\d+)\s+(?:[0-9a-fx]+ in )?(?P<fn>[\w:~<>]+)",
       examples=("#3 llama_context::encode(llama_batch const&)",
                 "[60957] #4  0x00007f3c2a1b2c3d in common_speculative_draft(common_speculative*, ...)",
                 "llama-bee    | #2  0x000055d0c1f2a3b4 in llama_decode ()")),
    # ---- resets (docs/llama-cpp-lines.md#resets-and-the-stale-drafter-fix, #kv-cache-lines, #the-servers-lines)
    _p("dflash_clear_stale", "event", "clearing stale drafter KV",
       rf"dflash: clearing stale drafter KV for seq=(?P<seq>\d+) before (?P<where>[^:]+): "
       rf"pos_max=(?P<pos_max>{INT}) next_pos=(?P<next_pos>{INT})",
       kind="reset", component="drafter", builds="beellama.cpp >= v0.3.0 (the fix)",
       # examples: built to docs/llama-cpp-lines.md#resets-and-the-stale-drafter-fix
       examples=("1.02.345.678 W dflash: clearing stale drafter KV for seq=0 before flat draft: pos_max=259 next_pos=1361",)),
    _p("dflash_clear_seq", "event", "DFLASH_DBG clear drafter seq",
       rf"DFLASH_DBG clear drafter seq: seq=(?P<seq>\d+) reason=(?P<reason>{GAP}) pos_max=(?P<pos_max>{INT})",
       kind="reset", component="drafter", builds="beellama.cpp >= v0.3.0 (the fix)",
       # examples: built to docs/llama-cpp-lines.md#resets-and-the-stale-drafter-fix
       examples=("1.02.345.679 D DFLASH_DBG clear drafter seq: seq=0 reason=flat draft pos_max=259",)),
    _p("dflash_discard_ring", "event", "discarding cross-ring state",
       r"dflash: discarding cross-ring state: (?P<reason>.*)", kind="reset", component="drafter",
       builds="beellama.cpp v0.2-v0.3",
       # examples: built to docs/llama-cpp-lines.md#resets-and-the-stale-drafter-fix
       examples=("0.41.002.117 W dflash: discarding cross-ring state: prefill flush mismatch",)),
    # the draft mirror and MTP find the drafter's memory stale (it ends at or past the target's next row) and
    # trim it themselves (docs/llama-cpp-lines.md#stale-draft-trims): the seed's bug detected and repaired by a
    # turboquant-derived fork (the verdict's stale_trims)
    _p("draft_mirror_trim", "event", "stale draft memory",
       rf"seq (?P<seq>\d+): stale draft memory \(ends at (?P<last_pos>{INT}), target rows start at "
       rf"(?P<batch_start>{INT})\), trimming", kind="stale_trim", component="drafter",
       builds="a turboquant-derived fork: the draft mirror, continues_draft (not llama.cpp b11434 or master)",
       # examples: built to docs/llama-cpp-lines.md#stale-draft-trims
       examples=("0.02.113.410 W spec continues_dr: seq 0: stale draft memory (ends at 259, target rows start at 200), trimming",)),
    _p("mtp_stale_trim", "event", "stale draft KV for seq",
       rf"stale draft KV for seq (?P<seq>\d+) (?P<where>[^:]*?): pos_max (?P<last_pos>{INT}) >= (?:\w+ )?start "
       rf"(?P<batch_start>{INT}), trimming", kind="stale_trim", component="drafter",
       builds="a turboquant-derived fork: deferred-flush MTP (not llama.cpp b11434 or master)",
       # examples: built to docs/llama-cpp-lines.md#stale-draft-trims (the second's wording less certain)
       examples=("0.02.113.410 W spec flush_deferr: stale draft KV for seq 0 at deferred flush: pos_max 41 >= flush start 38, trimming",
                 "0.02.113.410 W spec      process: stale draft KV for seq 1 at process: pos_max 97 >= batch start 95, trimming")),
    # the mirror gives a sequence up instead (no drafts for it until its draft memory catches up)
    _p("draft_not_trimmable", "event", "the draft memory cannot be trimmed",
       r"seq (?P<seq>\d+): the draft memory cannot be trimmed, the sequence is not mirrored", kind="not_mirrored",
       component="drafter", builds="a turboquant-derived fork: the draft mirror",
       # examples: built to docs/llama-cpp-lines.md#stale-draft-trims
       examples=("0.02.113.410 W spec continues_dr: seq 0: the draft memory cannot be trimmed, the sequence is not mirrored",)),
    _p("draft_outside_vocab", "event", "outside the draft vocab",
       r"seq (?P<seq>\d+): the draft cannot take token (?P<token>\d+) \(outside the draft vocab\)", kind="not_mirrored",
       component="drafter", builds="a turboquant-derived fork: the draft mirror, report_rejected",
       # examples: built to docs/llama-cpp-lines.md#stale-draft-trims
       examples=("0.02.113.410 W spec report_rejec: seq 0: the draft cannot take token 151900 (outside the draft vocab), the sequence is not mirrored while its draft memory lags the target",)),
    _p("draft_rejected_again", "event", "rejected by the draft again",
       r"seq (?P<seq>\d+): token (?P<token>\d+) rejected by the draft again", kind="not_mirrored",
       component="drafter", builds="a turboquant-derived fork: the draft mirror, report_rejected",
       # examples: built to docs/llama-cpp-lines.md#stale-draft-trims
       examples=("0.02.113.410 D spec report_rejec: seq 0: token 151900 rejected by the draft again",)),
    _p("draft_not_mirrored", "event", "not mirrored",
       rf"seq (?P<seq>\d+): draft memory ends at (?P<last_pos>{INT}), target rows start at (?P<batch_start>{INT}), "
       r"not mirrored", kind="not_mirrored", component="drafter", builds="a turboquant-derived fork: the draft mirror",
       # examples: built to docs/llama-cpp-lines.md#stale-draft-trims
       examples=("0.02.113.410 D spec continues_dr: seq 0: draft memory ends at 150, target rows start at 200, not mirrored",)),
    # DFlash (docs/llama-cpp-lines.md#dflash-clamps-adaptive-depth-and-chained-mtp): the draft batch is too small for every sequence's block, or refused one of its rows
    _p("draft_batch_clamp", "event", "do not fit the draft batch",
       rf"(?P<n_seqs>{NUM}) sequences of n_max=(?P<n_max>\d+) do not fit the draft batch (?P<n_batch>\d+) -- clamping "
       r"n_max to (?P<n_to>\d+)", kind="draft_clamp", component="drafter", builds="a turboquant-derived fork: DFlash",
       # examples: built to docs/llama-cpp-lines.md#dflash-clamps-adaptive-depth-and-chained-mtp (its function name unknown)
       examples=("0.01.000.000 W 4 sequences of n_max=16 do not fit the draft batch 32 -- clamping n_max to 7",)),
    _p("draft_features_sanitized", "event", "non-finite/f",
       r"sanitized (?P<n>\d+) non-finite/f\d+-overflow target feature values", kind="draft_warning",
       component="drafter", builds="a turboquant-derived fork: DFlash, once per process",
       # examples: built to docs/llama-cpp-lines.md#dflash-clamps-adaptive-depth-and-chained-mtp (its end unknown)
       examples=("0.01.000.000 W sanitized 12 non-finite/f16-overflow target feature values",)),
    _p("injection_row_rejected", "event", "injection batch rejected feature row",
       r"injection batch rejected feature row (?P<row>\d+) of (?P<n_rows>\d+)", kind="draft_rejected",
       component="drafter", builds="a turboquant-derived fork: DFlash",
       # examples: built to docs/llama-cpp-lines.md#dflash-clamps-adaptive-depth-and-chained-mtp
       examples=("0.01.000.000 E injection batch rejected feature row 3 of 16",)),
    _p("noise_row_rejected", "event", "rejected a noise-block row",
       r"seq (?P<seq>\d+): the draft batch rejected a noise-block row, no draft this round", kind="draft_rejected",
       component="drafter", builds="a turboquant-derived fork: DFlash",
       # examples: built to docs/llama-cpp-lines.md#dflash-clamps-adaptive-depth-and-chained-mtp
       examples=("0.01.000.000 E seq 1: the draft batch rejected a noise-block row, no draft this round",)),
    _p("chain_unsupported", "event", "chained MTP is not supported",
       r"chained MTP is not supported for this model; using sequential MTP", kind="draft_warning",
       component="drafter", builds="a turboquant-derived fork: chained MTP, LLAMA_SPEC_CHAIN",
       # examples: built to docs/llama-cpp-lines.md#dflash-clamps-adaptive-depth-and-chained-mtp
       examples=("0.00.300.000 W chained MTP is not supported for this model; using sequential MTP",)),
    # synthetic acceptance (b11434, docs/llama-cpp-lines.md#synthetic-acceptance): the server makes up which drafts are accepted, for benchmarking
    _p("synthetic_enabled", "event", "synthetic speculative acceptance is enabled",
       r"synthetic speculative acceptance is enabled", kind="synthetic", builds="b11434 --spec-synth-len/--spec-synth-rates",
       examples=("0.00.078.200 W spec common_specu: synthetic speculative acceptance is enabled for benchmarking; generated output is not valid",)),
    _p("synthetic_config", "event", "synthetic acceptance: n_max",
       r"synthetic acceptance: n_max = (?P<n_max>\d+), mean length = (?P<mean_length>[\d.]+), rates = \[(?P<rates>[^\][]*)\]",
       kind="synthetic", builds="b11434 --spec-synth-len/--spec-synth-rates",
       examples=("0.00.078.206 I spec common_specu: synthetic acceptance: n_max = 3, mean length = 2.000000, rates = [0.543689, 0.295598, 0.160713]",)),
    _p("synthetic_limit", "event", "synthetic acceptance draft limit",
       r"synthetic acceptance draft limit was reduced from (?P<n_from>\d+) to (?P<n_to>\d+)", kind="synthetic",
       builds="b11434 --spec-synth-len/--spec-synth-rates",
       # examples: built to docs/llama-cpp-lines.md#synthetic-acceptance
       examples=("0.00.078.207 I spec common_specu: synthetic acceptance draft limit was reduced from 16 to 3 by the initialized speculative implementations",)),
    _p("seq_rm", "event", "memory_seq_rm [", rf"memory_seq_rm \[(?P<pos>{INT}), end\)", kind="reset",
       component="target", extra={"hint": "1"},
       examples=("0.01.472.239 I slot   operator(): id  0 | task 20 | cached n_tokens = 4, memory_seq_rm [4, end)",)),
    _p("kv_cache_rm", "event", "kv cache rm", rf"kv cache rm -? ?\[(?P<pos>{INT}), end\)", kind="reset",
       component="target", extra={"hint": "1"}, builds="server before 2024",
       examples=("llama.cpp-gpu  | slot 0 : kv cache rm - [24, end)",)),
    _p("truncate_clear", "event", "failed to truncate tokens",
       rf"failed to truncate tokens with position >= (?P<pos>{INT}) - clearing the memory", kind="reset",
       component="target",
       # examples: built to docs/llama-cpp-lines.md#the-servers-lines
       examples=("slot update_slots: id  0 | task 94 | failed to truncate tokens with position >= 512 - clearing the memory",)),
    _p("memory_removed", "event", "removing memory module entries",
       rf"removing memory module entries for seq_id = (?P<seq>\d+), pos = \[(?P<pos>{INT}), \+inf\)",
       kind="reset",
       # examples: built to docs/llama-cpp-lines.md#kv-cache-lines
       examples=("0.01.000.000 W decode: removing memory module entries for seq_id = 0, pos = [24, +inf)",)),
    _p("purge", "event", "purging positions",
       rf"purging positions \[(?P<pos>{INT}), (?P<pos_end>{INT})\] of sequence (?P<seq>\d+)", kind="reset",
       # examples: built to docs/llama-cpp-lines.md#kv-cache-lines
       examples=("0.01.000.000 D apply_ubatch: purging positions [24, 31] of sequence 0 from KV cache",)),
    _p("context_shift", "event", "context shift",
       r"context shift, n_keep = (?P<n_keep>\d+), n_left = (?P<n_left>\d+), n_discard = (?P<n_discard>\d+)",
       kind="reset", component="target",
       examples=("0.00.768.462 W slot   operator(): id  0 | task 0 | slot context shift, n_keep = 1, n_left = 254, n_discard = 127",)),
    _p("checkpoint_restore", "event", "checkpoint",
       rf"restor{NAME} (?:speculative |context )?checkpoint(?: \(pos_min = (?P<pos_min>{INT}), pos_max = (?P<pos>{INT}))?",
       kind="checkpoint_restore", component="target",
       # examples: built to docs/llama-cpp-lines.md#the-servers-lines
       examples=("0.01.000.000 D slot   operator(): id  0 | task 0 | restoring speculative checkpoint (pos_min = 0, pos_max = 23, size = 1024)",
                 "0.01.000.000 D slot   operator(): id  0 | task 0 | restored context checkpoint (pos_min = 0, pos_max = 23, n_tokens = 24, size = 0.062 MiB)")),
    # ---- slot life-cycle (docs/llama-cpp-lines.md#the-servers-lines)
    _p("new_prompt", "event", "new prompt",
       r"new prompt, n_ctx_slot = (?P<n_ctx_slot>\d+), n_keep = (?P<n_keep>\d+), task\.n_tokens = (?P<n_tokens>\d+)",
       kind="new_prompt", component="target", extra={"hint": "1"},
       examples=("0.01.099.220 I slot   operator(): id  0 | task 0 | new prompt, n_ctx_slot = 512, n_keep = 0, task.n_tokens = 24",)),
    _p("prompt_done", "event", "done, n_tokens",
       r"prompt (?:processing )?done, n_tokens = (?P<pos>\d+)(?:, batch\.n_tokens = (?P<batch_n_tokens>\d+))?",
       kind="prompt_done", component="target", extra={"hint": "1"},
       examples=("slot update_slots: id  3 | task 299 | prompt done, n_tokens = 1728, batch.n_tokens = 4",
                 "slot update_slots: id  0 | task 275 | prompt processing done, n_tokens = 455, batch.n_tokens = 4")),
    _p("prompt_progress", "hint", "prompt processing progress",
       r"prompt processing progress, n_tokens = (?P<pos>\d+), batch\.n_tokens = (?P<batch_n_tokens>\d+)",
       kind="prompt_progress", component="target",
       examples=("slot update_slots: id  0 | task 275 | prompt processing progress, n_tokens = 451, batch.n_tokens = 451, progress = 0.991209",)),
    _p("stop_processing", "event", "stop processing",
       r"stop processing: n_tokens = (?P<pos>\d+), truncated = (?P<truncated>\d+)", kind="stop",
       component="target",
       examples=("0.01.172.278 I slot      release: id  0 | task 0 | stop processing: n_tokens = 47, truncated = 0",)),
    # ---- the server came up and serves (docs/llama-cpp-lines.md#start-up-notices): a start-up failure before these lines did not stop it
    _p("server_model_loaded", "event", ": model loaded", r"(?:llama_server|main): model loaded\s*$", kind="server_ready",
       component="target",
       examples=("0.00.021.477 I srv  llama_server: model loaded",
                 # examples: older upstream servers print it from main()
                 "main: model loaded")),
    _p("server_listening", "event", "listening on http",
       r"(?:server is )?listening on (?P<url>https?://\S+)", kind="server_ready", component="target",
       examples=("0.00.021.487 I srv  llama_server: listening on http://127.0.0.1:18094",
                 "main: server is listening on http://127.0.0.1:8080 - starting the main loop")),
    _p("server_idle", "event", "all slots are idle", r"all slots are idle", kind="server_ready", component="target",
       examples=("0.00.021.631 I srv  update_slots: all slots are idle",)),
    # ---- speculative statistics, every wording (docs/llama-cpp-lines.md#acceptance-in-four-wordings, #runtimes-around-llamacpp)
    _p("draft_acceptance", "event", "draft acceptance",
       r"draft acceptance(?: rate)? = (?P<rate>[\d.]+) \(\s*(?P<accepted>\d+) accepted /\s*(?P<generated>\d+) generated\)"
       r"(?:, mean (?:len|acceptance length) =\s*(?P<mean_len>[\d.]+))?"
       r"(?:, acceptance rate per position = \((?P<acc_per_pos>[^)]*)\))?", kind="draft_stats",
       # examples: the four wordings of docs/llama-cpp-lines.md#acceptance-in-four-wordings (the third built to it)
       examples=("draft acceptance rate = 0.00000 (    0 accepted /     3 generated)",
                 "0.00.205.061 I slot print_timing: id  0 | task 0 | draft acceptance = 0.08333 (    1 accepted /    12 generated)",
                 "0.01.172.204 I slot print_timing: id  0 | task 0 | draft acceptance = 0.10417 (    5 accepted /    48 generated), mean acceptance length =  1.29, acceptance rate per position = (0.294, 0.000, 0.000)",
                 "0.01.172.204 I slot print_timing: id  0 | task 0 | draft acceptance = 0.10417 (    5 accepted /    48 generated), mean len =  1.29")),
    _p("spec_statistics", "event", "#gen drafts",
       r"statistics\s+(?P<impl>[\w-]+): #calls\(b,g,a\) = \s*(?P<calls_b>\d+)\s+(?P<calls_g>\d+)\s+(?P<calls_a>\d+), "
       r"#gen drafts = \s*(?P<gen_drafts>\d+), #acc drafts = \s*(?P<acc_drafts>\d+), "
       r"#gen tokens = \s*(?P<gen_tokens>\d+), #acc tokens = \s*(?P<acc_tokens>\d+)"
       r"(?:, #mean acc len = (?P<mean_acc_len>[\d.]+))?(?:, #acc rate/pos = \((?P<acc_per_pos>[^)]*)\))?",
       kind="draft_stats",
       # examples: the second built to docs/llama-cpp-lines.md#debug-and-profile-lines
       examples=("0.01.172.224 I spec common_specu: statistics     draft-dflash: #calls(b,g,a) =    1     17     17, #gen drafts =     17, #acc drafts =     5, #gen tokens =     48, #acc tokens =     5, #mean acc len = 1.29, #acc rate/pos = (0.294), dur(b,g,a) = 0.002, 15.220, 0.007 ms",
                 "2.10.130.010 I statistics           dflash: #calls(b,g,a) =    1    412    412, #gen drafts =    412, #acc drafts =   301, #gen tokens =   6180, #acc tokens =  1020, dur(b,g,a) = 0.052, 33012.441, 1.234 ms")),
    _p("acc_per_pos", "event", "acc per pos", r"acc per pos = \((?P<acc_per_pos>[^()]*)\)", kind="draft_stats",
       examples=("0.01.172.204 I slot print_timing: id  0 | task 0 |      acc per pos = (0.294, 0.000, 0.000)",)),
    # ik_llama.cpp's per-position acceptance (its `statistics` line, quoted inline in reports): the same figures
    # as mainline's `acc per pos` and `#acc rate/pos`
    _p("pos_accept", "event", "pos_accept", r"pos_accept\s*=\s*\[(?P<acc_per_pos>\s*\d[^\]]*)\]?", kind="draft_stats",
       builds="ik_llama.cpp (dual speculation)",
       examples=("statistics ngram_mod(tail), blocked = 2/64, pos_accept=[87%,78%,68%,67%,58%,57%,49%,41%,...]",
                 "the token acceptance rate for MTP is: `pos_accept=[91%,76%,63%,53%]`")),
    # forks' adaptive draft-max: the draft depth the server chose from the acceptance it saw (beellama's `adaptive
    # dm:` lines, docs/llama-cpp-lines.md#debug-and-profile-lines, and v0.4.0's `adaptive draft-max profit`)
    _p("adaptive_draft_max", "event", "adaptive d",
       r"adaptive (?:dm|draft-max)(?: profit)?:\s*(?:(?P<n_from>\d+)\s*->\s*(?P<n_to>\d+)|fringe=|reset state)",
       kind="draft_stats", builds="beellama.cpp",
       examples=("0.19.967.115 I slot apply_adapti: id  0 | task 0 | adaptive draft-max profit: 0 -> 15 (score=22.65)",
                 "0.17.959.806 I slot print_timing: id  0 | task 8 | adaptive dm: fringe=0.00 n_max=15",
                 "adaptive dm: fringe=0.41 (win=32, rch 20, acc 13) n_max=8->6")),
    # beellama.cpp v0.4+ (its DFlash is upstream's draft-dflash, GGML_DFLASH_DEBUG gone): what tells the build apart
    _p("beellama_dflash_depth", "event", "defaults to the drafter block depth",
       r"DFlash: omitted --spec-draft-n-max defaults to the drafter block depth \((?P<n_to>\d+)\)",
       kind="build_marker", builds="beellama.cpp >= v0.4",
       # examples: built to docs/llama-cpp-lines.md#versions-forks-and-their-debug-switches
       examples=("0.00.412.118 W DFlash: omitted --spec-draft-n-max defaults to the drafter block depth (15)",)),
    _p("cli_drafted", "event", "n_drafted", r"^\s*n_drafted\s*=\s*(?P<generated>\d+)\s*$", kind="draft_stats",
       builds="examples/speculative 2023",
       examples=("n_drafted = 132",)),
    # the same statistics as a Markdown table a report made of its runs: `n_drafted` a column's name or a row's
    _p("table_stats", "event", "n_drafted", r"(?:^|\|)\s*n_drafted(?:\s+[\w.-]+)?\s*\|", kind="draft_stats",
       builds="reports' tables of examples/speculative and lookup runs",
       # examples: a table's header (tests/fixtures/blind/batch-3, report 19) and a row's label (report 25)
       examples=("Model | n_draft | n_predict | n_drafted | n_accept | accept ratio | 1st time | 2nd time",
                 "| n_drafted master |      0 |     151 |     254 |     450 |")),
    # a Markdown table whose column (or row) names the draft acceptance itself: `| acceptance |`, `| accepted
    # length |`, `| accept rate |`, `| mean acceptance length |` (its cells are the report's figures, not counted),
    # its unit after it (`(tokens)`, `%`, `/Total`) and the draft tokens it counts before it (`Draft Tokens Accepted`)
    _p("table_acceptance", "event", "ccept",
       r"(?i)(?:^|\|)\s*(?:mean\s+)?(?:draft(?:ed)?\s+(?:tokens?\s+)?)?accept(?:ance|ed)?"
       r"(?:\s+(?:length|len|rate|ratio))?(?:\s*\([^)|]*\)|\s*%|\s*/\s*(?:total|drafted|generated))?"
       r"\s*\|", kind="draft_stats", builds="reports' tables of speculative runs",
       # examples: headers of tests/fixtures/blind/batch-5 report 24, batch-6 report 17 and batch-9 reports 15 and
       # 16 (two tables there), and a row's label
       examples=("|          | base t/s | DFlash t/s | speedup | acceptance     |",
                 "| temp | accepted length | throughput |",
                 "| Mean acceptance length (tokens) | 2.91 | 3.10 |",
                 "| Output Tokens | Speed (tok/s) | Draft Accepted/Total | Accept % |",
                 "| Temp | Speed | Accept % |",
                 "| Model | Device | Speed (tok/sec) | Draft Model | Draft Tokens Accepted |")),
    _p("json_draft_n", "event", '"draft_n"',
       r'"draft_n"\s*:\s*(?P<generated>\d+)(?:,\s*"draft_n_accepted"\s*:\s*(?P<accepted>\d+))?', kind="draft_stats",
       builds="server responses (timings)",
       # examples: the second pretty-printed, as tests/analyze/reader/test_walker.py reads it
       examples=('0.01.172.547 D srv    operator(): http: streamed chunk: data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"created":1796103891,"id":"chatcmpl-1wetjBWDkYvspcBfAaKodVT977Gnm5sC","model":"models/target.gguf","system_fingerprint":"b0-unknown","object":"chat.completion.chunk","timings":{"cache_n":0,"prompt_n":24,"prompt_ms":12.282,"prompt_per_token_ms":0.51175,"prompt_per_second":1954.0791402051784,"predicted_n":24,"predicted_ms":60.675,"predicted_per_token_ms":2.6380434782608693,"predicted_per_second":379.0688092295014,"draft_n":48,"draft_n_accepted":5},"__verbose":{"index":0,"content":"","tokens":[],"id_slot":0,"stop":true,"model":"models/target.gguf","tokens_predicted":24,"tokens_evaluated":24,"generation_settings":{"seed":4294967295,"temperature":0.0,"dynatemp_range":0.0,"dynatemp_exponent":1.0,"top_k":40,"top_p":0.949999988079071,"min_p":0.05000000074505806,"top_n_sigma":-1.0,"xtc_probability":0.0,"xtc_threshold":0.10000000149011612,"typical_p":1.0,"repeat_last_n":64,"repeat_penalty":1.0,"presence_penalty":0.0,"frequency_penalty":0.0,"dry_multiplier":0.0,"dry_base":1.75,"dry_allowed_length":2,"dry_penalty_last_n":64,"dry_sequence_breakers":["\\n",":","\\"","*"],"mirostat":0,"mirostat_tau":5.0,"mirostat_eta":0.10000000149011612,"adaptive_target":-1.0,"adaptive_decay":0.8999999761581421,"stop":[],"max_tokens":24,"n_predict":24,"n_keep":0,"n_discard":0,"ignore_eos":false,"stream":true,"logit_bias":[],"n_probs":0,"min_keep":0,"grammar":"","grammar_lazy":false,"grammar_triggers":[],"preserved_tokens":[],"chat_format":"peg-native","reasoning_format":"deepseek","reasoning_in_content":false,"generation_prompt":"assistant:","samplers":["penalties","dry","top_n_sigma","top_k","typ_p","top_p","min_p","xtc","temperature"],"speculative.types":"none,draft-dflash","timings_per_token":false,"post_sampling_probs":false,"backend_sampling":false,"lora":[]},"prompt":"<s> user: the cache and the draft of the target batch\\nassistant:","has_new_line":false,"truncated":false,"stop_type":"limit","stopping_word":"","tokens_cached":47,"timings":{"cache_n":0,"prompt_n":24,"prompt_ms":12.282,"prompt_per_token_ms":0.51175,"prompt_per_second":1954.0791402051784,"predicted_n":24,"predicted_ms":60.675,"predicted_per_token_ms":2.6380434782608693,"predicted_per_second":379.0688092295014,"draft_n":48,"draft_n_accepted":5}}}',
                 '    "draft_n": 55,')),
    # the same counter pair as a per-step JSON record names it, as common/speculative.cpp's own variables do
    # (`n_draft`, `n_accepted`): one object per draft verification step, so each is counted like a step's line
    _p("json_n_draft", "event", '"n_draft"',
       r'"n_draft"\s*:\s*(?P<generated>\d+)\s*,\s*"n_accepted"\s*:\s*(?P<accepted>\d+)', kind="draft_stats",
       builds="forks' per-step speculative dumps (JSON lines)",
       # examples: the record of tests/fixtures/blind/batch-10 report 08, and one spaced as json.dumps writes it
       examples=('{"step":1,"seq":3,"n_draft":3,"n_accepted":2,"pmin_drop":0,"pos":[',
                 '{"step": 7, "n_draft": 4, "n_accepted": 0}')),
    _p("json_draft_accepted", "event", '"draft_n_accepted"', r'"draft_n_accepted"\s*:\s*(?P<accepted>\d+)',
       kind="draft_stats", builds="server responses (timings), pretty-printed",
       # examples: the pretty-printed timings as tests/analyze/reader/test_walker.py reads them
       examples=('    "draft_n_accepted": 51',)),
    # statistics a benchmark script or a wrapper prints its own way: a key=value template, or prose
    _p("template_stats", "event", "cc",
       r"(?:^|[\s|,;(])(?:draft(?:ed)?(?:[_ ]tokens)?\s*[=:]\s*(?P<generated>\d+)[\s,;|]+"
       r"acc(?:epted)?(?:[_ ]tokens)?\s*[=:]\s*(?P<accepted>\d+)"
       r"|Accepted:\s*(?P<accepted_n>\d+) tokens, Drafted:\s*(?P<generated_n>\d+) tokens)", kind="draft_stats",
       builds="benchmark scripts, wrappers, vLLM's SpecDecoding metrics",
       # examples: a bench script's per-prompt line (tests/fixtures/blind/batch-1, report 16) and vLLM's metrics
       # line (batch-2, report 19), both cut; the second built to the same template
       examples=("  code_python        pred= 192 draft=  89 acc=  84 rate=0.944 tok/s=52.3",
                 "request 3: drafted: 120, accepted: 97, tokens/s: 41.2",
                 "(APIServer pid=1) INFO 05-04 01:06:43 [metrics.py:101] SpecDecoding metrics: Mean acceptance length: 2.91, Accepted: 632 tokens, Drafted: 1655 tokens")),
    _p("prose_stats", "event", " draft",
       r"(?:accepted (?P<accepted>\d+) (?:of|out of) (?P<generated>\d+) draft"
       rf"|(?P<accepted_n>{NUM}) (?:of|out of|/) (?P<generated_n>\d+) draft(?:ed)? tokens (?:were )?accepted)",
       kind="draft_stats", builds="wrappers and reports that word the acceptance in prose",
       # examples: built to the two orders the wording takes
       examples=("speculative: accepted 84 of 89 draft tokens (94.4%)",
                 "84 of 89 drafted tokens were accepted")),
    _p("cli_accept", "event", "n_accept", r"^\s*n_accept\s*=\s*(?P<accepted>\d+)\s*$", kind="draft_stats",
       builds="examples/speculative 2023",
       examples=("n_accept  = 47",)),
    _p("dflash_histogram", "event", "dflash acceptance histogram",
       r"dflash acceptance histogram: cycles=(?P<cycles>\d+) requested=(?P<requested>\d+) "
       r"produced=(?P<produced>\d+) accepted=(?P<accepted>\d+)", kind="draft_stats", builds="beellama.cpp",
       # examples: built to docs/llama-cpp-lines.md#debug-and-profile-lines
       examples=("dflash acceptance histogram: cycles=412 requested=6180 produced=6180 accepted=1020 bins[0,1,2,3,4+]=[111,150,90,40,21]",)),
    _p("adaptive_depth", "event", "adaptive n",
       r"adaptive n\s*:\s*(?P<n_from>\d+)\s*->\s*(?P<n_to>\d+)\s*\(seq (?P<seq>\d+), n_draft=(?P<generated>\d+), "
       r"n_accepted=(?P<accepted>\d+)\)", kind="draft_stats", builds="a turboquant-derived fork: draft-mtp-adaptive (the type of upstream PR #27210, open)",
       examples=("0.48.122.337 I spec       accept: adaptive n : 1 -> 2 (seq 0, n_draft=1, n_accepted=1)",)),
    _p("adaptive_depth_seq", "event", "adaptive draft depth seq",
       r"adaptive draft depth seq (?P<seq>\d+): (?P<n_from>\d+) -> (?P<n_to>\d+) \(n_draft=(?P<generated>\d+), "
       r"n_accepted=(?P<accepted>\d+)\)", kind="draft_stats", builds="a turboquant-derived fork: draft-mtp-adaptive",
       # examples: built to docs/llama-cpp-lines.md#dflash-clamps-adaptive-depth-and-chained-mtp
       examples=("0.48.122.337 D spec       accept: adaptive draft depth seq 0: 3 -> 4 (n_draft=3, n_accepted=3)",)),
    # ---- warnings that name a sequence (the failure after them may not) and multimodal chunks
    # whether a context can remove part of a sequence (b11434, once per context): a recurrent or hybrid drafter
    # cannot, so every partial rollback after a draft fails (docs/llama-cpp-lines.md#versions-forks-and-their-debug-switches)
    _p("partial_seq_rm", "event", "partial sequence removal",
       r"context (?P<support>does not support|supports bounded) partial sequence removal", kind="seq_rm_support",
       builds="llama.cpp b11434 (common_context)",
       # examples: the first from a real llama-server b11434 run with a Mamba drafter; the second built to
       # the same heading
       examples=("0.00.049.603 I cmn  common_conte: the context does not support partial sequence removal",
                 "0.00.049.603 I cmn  common_conte: the context supports bounded partial sequence removal")),
    _p("kv_nonconsecutive", "event", "non-consecutive token position",
       r"non-consecutive token position (?P<pos>\d+) after (?P<prev>\d+) for sequence (?P<seq>\d+)",
       kind="kv_warning",
       examples=("0.57.309.308 W find_slot: non-consecutive token position 323 after 323 for sequence 0 with 376 new tokens",)),
    _p("mm_image", "event", "image",
       r"(?:decoding image batch|failed to decode image|image (?:slice )?(?:decoded|processed|encoded)|processing image|"
       r"encoding image)", kind="mm",
       examples=("decoding image batch 1/3, n_tokens_batch = 512",
                 "failed to decode image",
                 "image slice encoded in 1699 ms",
                 "image decoded (batch 1/3) in 183 ms",
                 "0.57.580.176 I srv  process_chun: image processed in 9008 ms",
                 "0.58.007.487 I srv  process_chun: processing image...",
                 "encoding image slice...")),
    _p("mm_chunk", "event", "eval chunk", r"failed to eval chunk", kind="mm",
       examples=("failed to eval chunk 1",)),
    # ---- which side was working just before a failure
    _p("draft_loading", "hint", "loading draft model", r"loading draft model", kind="draft_init", component="drafter",
       builds="server/common: a failure right after it is the draft model's load",
       examples=("0.00.250.916 I common_speculative_init_result: loading draft model 'models/dflash-v2.gguf'",)),
    _p("draft_candidate", "hint", "draft candidate",
       r"seq_id (?P<seq>\d+), draft candidate\s+(?P<i>\d+), pos\s+(?P<pos>\d+)", kind="draft",
       component="drafter",
       examples=("0.01.112.170 D  - seq_id 0, draft candidate   0, pos   0:    568 (   0.689) ' write'",)),
    _p("server_decode", "hint", "n_batch (effective)", r"n_batch \(effective\) = (?P<n_batch>\d+)", kind="decode",
       component="target", builds="upstream server SRV_DBG, printed right before it decodes the slots' batch",
       examples=("0.01.099.343 D srv        decode: n_batch (effective) = 512, off = 0",)),
    _p("generate_draft", "hint", "generate_draft", rf"generate_draft: id=(?P<id>\d+){GAP}pos_next=(?P<pos>\d+)",
       kind="draft", component="drafter",
       examples=("0.01.112.483 D slot handle_last_: id  0 | task 0 | generate_draft: id=232, #tokens=24, #draft=3, pos_next=24",)),
    _p("spec_gen_draft", "hint", "common_speculative_gen_draft", r"common_speculative_gen_draft:", kind="draft_start",
       component="drafter", builds="server 2024-2025: printed right before the draft context decodes",
       examples=("common_speculative_gen_draft: reuse_i = 2, reuse_n = 8176, prompt = 8192",)),
    # the fork names no implementation line in some versions, but only DFlash checks its contract or
    # caps the drafter's context for --spec-type dflash (fork arg.cpp): either names the type. Before dflash_kv,
    # which would take the contract line's key=value body as an event.
    _p("dflash_named", "meta", "dflash: ", r"(?P<impl>dflash): (?:contract ok:|setting -cd to )", kind="spec_impl",
       builds="beellama.cpp v0.3 (contract line; arg.cpp)",
       # examples: the second real, from a public report (docs/llama-cpp-lines.md#start-up-lines)
       examples=("0.00.122.680 I dflash: contract ok: block_size=16 mask_token=3 target_layer_ids=[1] n_target_layers=1 n_embd=64 n_target_features=64 target_layers=2 cross_ctx=512",
                 "0.00.035.194 I dflash: setting -cd to 256 (drafter doesn't need the full main ctx; pass -cd N to override)")),
    # ---- DFlash key=value lines, generically (after the specific ones above)
    _p("dflash_kv", "event", "=", r"(?P<tag>DFLASH_DBG [\w ]{1,64}?|dflash[\w ]{0,64}?|ddtree[\w ]{0,64}?):? (?P<body>\S+=.*)",
       kind="dflash", component="drafter", builds="beellama.cpp v0.2-v0.3",
       # examples: built to docs/llama-cpp-lines.md#debug-and-profile-lines
       examples=("1.02.345.600 D DFLASH_DBG build_cross_data: ring_write_pos=1361 ring_filled=1361 committed_len=1361 cross_ctx=1024 gpu=0",
                 "1.03.100.500 I slot update_slots: id  0 | task 7 | dflash cycle: task=7 pos=1361 adaptive_n_max=15 n_draft=15 n_accept=3 verify_rows=16 useful_rows=16 pad_rows=0 cross_len=1024 ring_filled=1361 committed=1361 draft_ms=12.4 verify_ms=31.0 accept_ms=0.6 total_ms=45.2 reduced_verify=1 top_k=1 accept_bin=3 ctx_bucket=1")),
    # ---- environment
    _p("version", "meta", "version:", r"version: (?P<build>\d+) \((?P<commit>[0-9a-f]+)\)", kind="version",
       examples=("version: 9459 (07ac3cec6)",)),
    _p("build", "meta", "build:",
       r"build: (?P<build>\d+) \((?P<commit>[0-9a-f]+)\)(?: with (?P<compiler>.*?) for (?P<target>\S+))?",
       kind="version",
       # examples: common's older build line (no capture has one)
       examples=("build: 4067 (54ef9cfc) with cc (GCC) 14.2.1 20240910 for x86_64-pc-linux-gnu",)),
    _p("built_with", "meta", "built with", rf"built with (?P<compiler>{GAP}) for (?P<target>\S+)", kind="version",
       examples=("built with GNU 15.2.1 for Linux x86_64",)),
    _p("cuda_init", "meta", "ggml_cuda_init", r"ggml_cuda_init: found (?P<n>\d+) (?P<backend>CUDA|ROCm) devices?",
       kind="backend",
       # examples: the second as tests/analyze/reader/test_devices.py reads it
       examples=("ggml_cuda_init: found 2 CUDA devices (Total VRAM: 23822 MiB):",
                 "ggml_cuda_init: found 1 ROCm devices:")),
    _p("vulkan_init", "meta", "Vulkan devices", r"ggml_vulkan: Found (?P<n>\d+) Vulkan devices?", kind="backend",
       extra={"backend": "Vulkan"},
       # examples: as tests/analyze/reader/test_devices.py reads it (no capture has one)
       examples=("ggml_vulkan: Found 1 Vulkan devices:",)),
    _p("load_backend", "meta", "load_backend", r"load_backend: loaded (?P<backend>\w+) backend", kind="backend",
       # examples: as tests/capture/test_devices_manifest.py reads it (no capture has one)
       examples=("load_backend: loaded RPC backend from /x/libggml-rpc.so",)),
    _p("metal_init", "meta", "ggml_metal_init", r"ggml_metal_init: (?:found|picking default) device:? (?P<name>.*)",
       kind="gpu", extra={"backend": "Metal"},
       # examples: no capture has these
       examples=("ggml_metal_init: found device: Apple M2 Max",
                 "ggml_metal_init: picking default device: Apple M2 Max")),
    _p("gpu_device", "meta", "Device ",
       r"Device (?P<idx>\d+): (?P<name>[^,]+), (?:compute capability (?P<cc>[\d.]+)|(?P<arch>gfx\w+))"
       r"(?:.*?VRAM: (?P<mib>\d+) MiB)?", kind="gpu",
       # examples: the second as tests/analyze/reader/test_devices.py reads it
       examples=("  Device 0: NVIDIA GeForce RTX 3080, compute capability 8.6, VMM: yes, VRAM: 11910 MiB",
                 "  Device 0: AMD Radeon RX 7900 XTX, gfx1100 (0x1100), VMM: no, Wave Size: 32")),
    _p("metal_gpu_name", "meta", "GPU name:", rf"ggml_metal{NAME}: GPU name:\s+(?P<name>\S.*?)\s*$", kind="gpu",
       extra={"backend": "Metal"},
       # examples: as tests/analyze/reader/test_devices.py reads it (no capture has one)
       examples=("ggml_metal_device_init: GPU name:   Apple M2 Max",)),
    _p("vulkan_device", "meta", "ggml_vulkan: ", r"ggml_vulkan: (?P<idx>\d+) = (?P<name>[^(|]{1,256}?) \(", kind="gpu",
       extra={"backend": "Vulkan"},
       # examples: as tests/analyze/reader/test_devices.py reads it (no capture has one)
       examples=("ggml_vulkan: 0 = AMD Radeon 890M Graphics (RADV GFX1150) (radv) | uma: 1 | fp16: 1 | warp size: 64 | shared memory: 65536 | int dot: 1 | matrix cores: KHR_coopmat",)),
    _p("smi_gpu", "meta", "NVIDIA",
       r"^\|\s+(?P<idx>\d+)\s+(?P<name>NVIDIA [^|]*?)\s+(?:On|Off)\s+\|", kind="gpu", extra={"backend": "CUDA"},
       examples=("|   0  NVIDIA GeForce RTX 3060        Off |   00000000:04:00.0 Off |                  N/A |",)),
    _p("multi_gpu_dflash", "meta", "multi-GPU placement detected",
       r"multi-GPU placement detected \(target=(?P<target_devices>\d+) devices, drafter=(?P<drafter_devices>\d+) devices\)",
       kind="placement", builds="beellama.cpp v0.2-v0.3",
       # examples: built to docs/llama-cpp-lines.md#start-up-lines
       examples=("0.09.112.004 I dflash: multi-GPU placement detected (target=2 devices, drafter=1 devices); disabling GPU cross ring and graph hidden capture",)),
    # ---- the device layout (analyze/reader/devices.py): devices, and where each model's layers and buffers went
    _p("device_listed", "meta", "MiB free)",
       rf"(?:^|[\s-])(?P<device>[A-Za-z][A-Za-z_]*\d*)\s*: (?P<name>[^\s-]{GAP}) \((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)",
       kind="device", builds="common_param device_info, --list-devices (2025-)",
       examples=("0.00.079.033 I cmn  common_param:   - RPC0    : 127.0.0.1:60301 (24105 MiB, 24105 MiB free)",)),
    _p("device_used", "meta", "using device",
       rf"using device (?P<device>[\w.-]+) \((?P<name>{GAP})\)(?: \((?P<id>[^)]*)\))? - (?P<free>\d+) MiB free",
       kind="use_device", builds="llama_model_load_from_file_impl, llama_prepare_model_devices",
       # examples: the second as tests/analyze/reader/test_devices.py reads it
       examples=("0.00.123.420 I llama_prepare_model_devices: using device RPC0 (127.0.0.1:60301) (unknown id) - 24105 MiB free",
                 "llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 4090) - 23738 MiB free")),
    _p("model_start", "meta", "loaded meta data with",
       rf"loaded meta data with \d+ key-value pairs and \d+ tensors from (?P<path>{PATH}) \(version", kind="model_start",
       examples=("0.00.158.160 I llama_model_loader: loaded meta data with 21 key-value pairs and 21 tensors from models/target.gguf (version GGUF V3 (latest))",)),
    _p("load_mode", "meta", "loading model tensors",
       r"loading model tensors, this can take a while\.\.\. \((?:load_mode = (?P<mode>\w+)|mmap = (?P<mmap>\w+))",
       kind="load_mode",
       examples=("0.00.159.709 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)",
                 "load_tensors: loading model tensors, this can take a while... (mmap = true)")),
    _p("layer_device", "meta", "assigned to device",
       r"layer\s+(?P<layer>\d+) assigned to device (?P<device>[\w.-]+)", kind="layer_device",
       examples=("0.00.159.745 D load_tensors: layer   0 assigned to device CPU, is_swa = 0",)),
    _p("kv_layer_device", "meta", ": dev = ", rf"llama_kv_cache{NAME}: layer\s+(?P<layer>\d+): dev = (?P<device>[\w.-]+)",
       kind="kv_layer_device",
       examples=("0.00.230.106 D llama_kv_cache: layer   0: dev = RPC0",)),
    _p("buffer_size", "meta", "buffer size =",
       r"(?:^|\s)(?P<buffer>[A-Za-z][\w.]*(?:\[[^\]]*\])?)\s+(?:(?P<what>model|KV|RS|compute|output) )?buffer size ="
       r"\s*(?P<mib>[\d.]+) ?MiB", kind="buffer",
       examples=("0.00.160.198 I load_tensors:   CPU_Mapped model buffer size =     0.63 MiB",
                 "0.00.160.531 I llama_kv_cache:        CPU KV buffer size =     0.25 MiB",
                 "0.00.228.307 I sched_reserve:        CPU compute buffer size =     1.64 MiB")),
    _p("offloaded", "meta", "layers to GPU", r"offloaded (?P<done>\d+)/(?P<total>\d+) layers to GPU", kind="offloaded",
       examples=("0.00.160.193 I load_tensors: offloaded 3/3 layers to GPU",)),
    _p("build_info", "meta", "print_info: build ",
       r"print_info: build (?P<build>\d+) \((?P<commit>[0-9a-f]+|unknown)\)(?: with (?P<compiler>.*?) for (?P<target>\S+))?",
       kind="version", builds="common_params_print_info (2026)",
       examples=("0.00.109.407 I cmn  common_param: common_params_print_info: build 0 (unknown) with GNU 12.2.0 for Linux x86_64",)),
    _p("ctx_created", "meta", "llama_context: n_ctx", r"llama_context: n_ctx\s+= (?P<n_ctx>\d+)", kind="context",
       examples=("llama_context: n_ctx         = 2048",
                 "0.00.160.400 I llama_context: n_ctx                 = 512")),
    _p("kv_created", "meta", "cells", rf"llama_kv_cache{NAME}: size = {GAP}\(\s*(?P<cells>\d+) cells", kind="kv_cache",
       examples=("0.00.160.682 I llama_kv_cache: size =    0.25 MiB (   512 cells,   2 layers,  1/1 seqs), K (f16):    0.12 MiB, V (f16):    0.12 MiB",)),
    # the implementation line names the spec type: before the generic draft marker, which also matches it
    _p("spec_impl", "meta", "implementation", r"adding (?:speculative )?implementation '?(?P<impl>[\w-]+)'?",
       kind="spec_impl",
       # examples: the third real, from a public report (docs/llama-cpp-lines.md#start-up-lines)
       examples=("0.00.253.947 I common_speculative_impl_draft_dflash: adding speculative implementation 'draft-dflash'",
                 "0.00.074.655 I spec common_specu: adding speculative implementation 'ngram-mod'",
                 "1.16.873.687 I common_speculative_init: adding implementation dflash")),
    _p("adaptive_depth_enabled", "meta", "adaptive draft depth enabled",
       r"adaptive draft depth enabled \((?P<impl>[\w-]+)\)", kind="spec_impl",
       builds="a turboquant-derived fork: draft-mtp-adaptive",
       # examples: built to docs/llama-cpp-lines.md#dflash-clamps-adaptive-depth-and-chained-mtp
       examples=("0.00.300.000 I spec common_specu: adaptive draft depth enabled (draft-mtp-adaptive)",)),
    # every draft names its implementation too (`called impl draft-simple, hist size = ...`): a log cut after start-up
    _p("spec_impl_called", "meta", "called impl", r"called impl (?P<impl>[a-z][\w-]*), hist size", kind="spec_impl",
       examples=("0.01.112.192 D spec common_specu: called impl draft-dflash, hist size = 24, call_count = 1, gen = 3",)),
    # the other draft-context lines (loading draft model, adding speculative implementation, dflash: setting -cd,
    # common_speculative_init*) are read by draft_loading, spec_impl, dflash_named and spec_init
    _p("draft_load", "meta", "draft model warmup", r"draft model warmup", kind="draft_marker",
       # examples: built to docs/llama-cpp-lines.md#start-up-lines
       examples=("0.00.260.001 I common_speculative_create_ctx_dft: draft model warmup complete",)),
    # after spec_impl: the other lines a speculative implementation prints while it creates the draft context
    _p("spec_init", "hint", "common_speculative", rf"common_speculative_(?:impl_\w{{1,64}}|init{NAME}):", kind="draft_init",
       component="drafter",
       examples=("0.00.253.948 I common_speculative_impl_draft_dflash: - n_max=3, n_min=0, p_min=0.00",)),
    _p("rope_type", "meta", "rope", r"(?:rope type|rope_type)\s*=\s*(?P<rope>\S+)", kind="rope",
       examples=("0.00.159.694 I print_info: rope type             = 0",)),
    _p("model_arch", "meta", "general.architecture", r"general\.architecture\s+\w*\s*=\s*(?P<arch>\S+)",
       kind="arch",
       examples=("0.00.158.235 I llama_model_loader: - kv   0:                       general.architecture str              = llama",)),
    _p("flags", "meta", "-",
       r"(?:^|\s)(?P<flag>--(?:spec-type|spec-draft-model|model-draft|spec-draft-ngl|n-gpu-layers|gpu-layers|"
       r"split-mode|tensor-split|kv-unified|parallel|ctx-size|ctx-size-draft|cache-type-k|cache-type-v|flash-attn|"
       r"spec-dflash-cross-ctx|draft-max|spec-draft-n-max|spec-draft-n-min-adaptive|spec-synth-len|spec-synth-rates|"
       r"main-gpu|spec-draft-device|device-draft|device|rpc)|-md|-ngl|-np|-sm|-ts|-fa|-cd|"
       r"-kvu|-devd|-dev|-mg)"
       r"(?:[ =](?P<value>\"[^\"]*\"|[^\s\"-][^\s\"]*))?", kind="flag",
       examples=("      --spec-type dflash",
                 "      --spec-draft-ngl all",
                 # examples: b11434's synthetic acceptance, as a command line in a report gives it
                 "llama-server -m target.gguf -md draft.gguf --spec-type draft-simple --spec-synth-len 2")),
    # the speculative set-up's other outcome: where spec_impl names each implementation it added, this names none
    # (a drafter type whose draft context is missing is skipped silently), so the server runs without speculation
    _p("spec_none", "meta", "no implementations specified",
       r"no implementations specified for speculative decoding", kind="spec_none",
       # examples: upstream's SPC_TRC line, as LocalAI's gRPC stderr relays it (tests/fixtures/blind/batch-9, report 7)
       examples=("0.00.254.000 I spec common_specu: no implementations specified for speculative decoding",
                 'Apr 15 22:10:45 DEBUG GRPC stderr id="Gemma 31B - Q6_K speculative-127.0.0.1:39857" '
                 'line="no implementations specified for speculative decoding" caller={caller.file="/build/pkg/model/process.go"')),
    # ---- anything else llama.cpp prints, to tell a log from prose
    # llama-server's timings on lines of their own (print_timing's message after its line break, 2024-25 builds),
    # bare or inside a runtime's logfmt (`msg="prompt eval time = ..." component=llama.cpp`)
    _p("timings", "generic", " time =",
       r"(?:^|[\s\"'])(?:prompt eval|eval|total) time =\s*[\d.]+ ms /\s*\d+ (?:tokens|runs)",
       examples=("prompt eval time =    3616.15 ms /   455 tokens (    7.95 ms per token,   125.82 tokens per second)",
                 'time="2025-10-27T18:41:57Z" level=info msg="       eval time =  300258.64 ms /  1483 tokens '
                 '(  202.47 ms per token,     4.94 tokens per second)" component=llama.cpp')),
    _p("generic", "generic", ":",
       r"(?:^|\s|\])(?:llama_model_loader|load_tensors|print_info|llama_context|llama_kv_cache\w*|llama_model_load\w*|"
       r"ggml_\w+|srv\s+\w+|slot\s+\w+|main|system_info|llama_print_timings|load_backend|common_\w+|"
       r"llama_init_from_model|init|decode|ubatch_\w+|update_slots|server_\w+|log_server_r|sampler_\w+|"
       r"que\s+\w+|spec\s+\w+|cmn\s+\w+|log_info|build_info|llama_perf_\w+):",
       examples=("0.00.102.272 I srv  llama_server: initializing ...",
                 "0.00.109.410 I cmn  common_param: device_info:")),
)

BY_NAME: dict[str, Pattern] = {p.name: p for p in PATTERNS}
