"""The walker: feeds lines through the pattern table and keeps the little state that multi-line
messages need (a batch dump in progress, an open position-error block, the failure being assembled).

It is fed lines in order, any number at a time, so the same code serves a whole file and a live capture.
`feed_text` lets the C accelerator (analyze/reader/_skim.c) read the lines it knows and gives `feed` the rest;
`feed` is the definition of what a line does, and a change to how a dump, find_slot or hint line is handled
here is a change there too (tests/analyze/reader/test_skim.py fails until both agree).
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import TYPE_CHECKING, Any

from kvtrace.analyze.reader.attribution import caller_side, frame_side
from kvtrace.analyze.reader.concepts import CONCEPT_PREFIX, CRASH, Concept, code_of, crash_frame, recognise, side_of
from kvtrace.analyze.reader.devices import LAYOUT_KINDS, Layout, add_device, backend_of
from kvtrace.analyze.reader.normalize import (
    GLUED_LEN,
    LLAMA_PREFIX,
    WRAP_CUE,
    WRAP_WIDTH,
    llama_seconds,
    message,
    parse_prefix,
    readable,
    rejoin,
    split_glued,
    uncut,
    unescape,
)
from kvtrace.analyze.reader.patterns import BY_NAME, PATTERNS, Pattern, failure_words
from kvtrace.analyze.reader.proof import (
    SOURCE_LANGS,
    closes_fence,
    fence_of,
    line_proof,
    remark,
    source_statement,
    strongest,
)
from kvtrace.analyze.reader.prose import DRAFTER_NAMED, PROSE_ACCEPTANCE_WORDS
from kvtrace.analyze.reader.records import (
    CONTEXT_CODES,
    KEEP_LINES_FOR,
    NA,
    NGRAM_DRAFT,
    PROSE_ACCEPTANCE,
    SEVERITY,
    BatchColumns,
    Event,
    Failure,
    KvColumns,
    Meta,
    draft_counts,
    int_or_none,
)

try:
    from kvtrace.analyze.reader import (
        _skim,  # the hot lines in C (analyze/reader/_skim.c); absent where it could not be built
    )
except ImportError:  # pragma: no cover - a build without a C compiler
    _skim = None  # type: ignore[assignment]
if os.environ.get("KVTRACE_PURE_PYTHON"):  # the walker alone: to compare with, or to rule the C code out
    _skim = None  # type: ignore[assignment]

_KV_PAIR = re.compile(r"([A-Za-z_][\w.\[\]]*)=(\[[^\]]*\]|[^\s,;]+)")
if TYPE_CHECKING:
    from kvtrace.analyze.reader.jsonl import JsonlLog

_SLOT = re.compile(r": id\s+(?P<slot>\d+) \| task (?P<task>-?\d+) \|")  # a slot line's `id N | task M |`
_RESPONSE_ID = re.compile(r'"id"\s*:\s*"(?P<id>(?:chatcmpl|cmpl)-[^"]+)"')  # an OpenAI-style response's id
_NIL = {"(nil)", "0x0", "(null)", "0", "NULL"}

# the batch-dump states
_OUT, _INPUT, _SEQS, _UBATCH = 0, 1, 2, 3
FAILURE_GAP = 30  # lines after which a failure no longer collects follow-up lines
HINT_GAP = 12  # how far back a "who was working" hint still counts for a failure


def _int(v: str | None) -> int | None:
    return None if v is None else int(v)


def _int_or_na(v: str | None) -> int:
    try:
        return _i64(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return NA


def _i64(v: str) -> int:
    """A number for a column: NA where it does not fit in 64 bits (a garbled line, not a position)."""
    n = int(v)
    return n if -(2**63) < n < 2**63 else NA


class Walker:
    """Turns lines into records. `feed` as often as you like, then `close`."""

    def __init__(self) -> None:
        self.batches = BatchColumns()
        self.kv = KvColumns()
        self.failures: list[Failure] = []
        self.events: list[Event] = []
        # what the log says about its run (build, devices, contexts, flags...): ParseResult.meta is built on it
        self.meta: Meta = {
            "versions": [], "backends": [], "gpus": [], "contexts": [], "spec_impls": [], "flags": {}, "told_flags": [],
            "placement": {}, "rope": [], "arch": [], "mrope": False, "spec_none": False,
        }
        # what the meta lines leave for the lines after them: the model loads so far (placement is worked
        # out from them at the end), and whether speculative decoding was announced yet (a load or a context
        # after it is the drafter's)
        self.layout = Layout()
        self.draft_seen = False
        self.n_lines = 0
        self.n_recognised = 0
        # what changed the meta, in order, when asked for (analyze/reader/split.py replays a piece's onto the meta
        # of the pieces before it): no record depends on the meta, only the meta on what came before
        self.meta_lines: list[tuple[str, str]] | None = None
        self.first_abs_t: float | None = None
        self.jsonl: JsonlLog | None = None  # the log is llama.cpp's JSON log (analyze/reader/jsonl.py) from here on
        self._dump = _OUT
        self._fragment = False
        self._fields: dict[str, str] = {}
        self._seqs: list[tuple[int, int, int]] = []
        self._batch_line = 0
        self._batch_t = math.nan
        self._n_batches = 0
        self._cur_rows: list[int] = []  # rows of the latest input batch (one per sequence)
        self._cur_sizes: set[int] = set()
        self._cur_found_slot = False
        self._sigs: dict[frozenset[int], int] = {}
        self.buffers: dict[str, int] = {}  # batch-buffer pointer -> id: each caller reuses its own buffer
        self._requests = 0  # new-prompt lines seen
        self.buffer_request: list[int] = []  # the request each buffer id was first seen in
        self._kv_size = NA
        self._failure: Failure | None = None
        self._hint: tuple[int, str, str] | None = None  # (line number, component, text) of the last hint
        self._seq_hint: tuple[int, int] | None = None  # (line number, sequence) of the last warning naming one
        self._prev: tuple[int, str] | None = None  # (line number, text) of the last line `feed` read itself
        # a Markdown fence open in a paste: (its character, its length), and whether it quotes C/C++ source, whose
        # lines are code, not log lines (analyze/reader/proof.py); a thread's part never inherits one
        self._fence: tuple[str, int] | None = None
        self._source = False
        self.part_starts: frozenset[int] = frozenset()  # the first line of each part of a GitHub thread

    @property
    def open_failure(self) -> Failure | None:
        """The failure being assembled: its caller lines may yet come, so it is not in `failures` until it
        closes (the next batch, event or a gap does that, and `close`)."""
        return self._failure

    # ------------------------------------------------------------------ the hot loop
    def feed_text(self, text: str) -> None:
        """The lines of `text`, read by `decode` (a line break at its end ends the last line; the last
        line may have none, at the end of a log).

        Where the C accelerator is built, it reads the lines it knows and hands the others to `feed` one at
        a time; `feed` is the definition of what every line does, and the tests hold the two to it."""
        # -1: not text the C code reads; a GitHub thread's parts (small) are all the walker's, so that a fence
        # left open ends with its part
        pos = -1 if _skim is None or self._source or self.part_starts else _skim.skim(self, text, 0)
        if pos < 0:
            lines = text.split("\n")
            if not lines[-1]:
                lines.pop()
            self.feed(lines)
            return
        assert _skim is not None
        n, skim, feed, find = len(text), _skim.skim, self.feed, text.find
        while pos < n:
            end = find("\n", pos)
            if end < 0:
                end = n
            feed([text[pos:end]])
            if end < n and ((prev := self._prev) is not None and prev[0] == self.n_lines or self._source):
                # the line after a re-wrapped line's possible start is the walker's (see _unknown), as is quoted
                # source code to its fence's end
                pos = end + 1
                continue
            pos = skim(self, text, end + 1) if end < n else n

    def feed(self, lines: list[str]) -> None:
        no = self.n_lines
        in_input = self._dump == _INPUT
        fragment = self._fragment
        for line in lines:
            no += 1
            if self._fence is not None and no in self.part_starts:
                self._fence, self._source = None, False  # a fence left open ends with its part of the thread
            if self._source:  # quoted C/C++ source: code, not log lines
                if closes_fence(line, self._fence):  # type: ignore[arg-type]  # a source block has its fence
                    self._fence, self._source = None, False
                continue
            # batch dumps are most of a debug log: skip the ubatch repeats and token rows cheaply
            if "ubatch_print:" in line:
                if in_input:
                    if ": id = " in line or "[embd]" in line:  # a token row: only its end matters
                        fragment = "output = " not in line
                    elif "n_tokens" in line or "n_outputs" in line or "embd" in line or ":   pos " in line:
                        # fields are read by name (builds add fields): sizes, embeddings, the caller's buffer
                        m = _FIELD.search(line)
                        if m is not None:
                            self._fields[m["key"]] = m["value"]
                continue
            if fragment:
                # a token piece with a newline in it: the row goes on until `output = N`
                fragment = False
                if "output = " in line:
                    continue
                if "init:" not in line and "ubatch" not in line:
                    fragment = True
                    continue
            # the rest of a dump and find_slot come next in number: straight to their entry and handler
            hot = None
            if "find_slot: stream[" in line:
                hot = _KV_SEQ if "] min[" in line else _KV_STREAM
            elif "init:" in line:
                if ": pos = [" in line:
                    hot = _SEQ_POS
                elif "input batch info" in line:
                    hot = _INPUT_BATCH
                else:
                    end = line.rstrip()[-1:]
                    hot = _SEQ_CLOSE if end == "]" else _SEQ_OPEN if end == "[" else None
            elif "added ubatch to split" in line:
                hot = _UBATCH_ADD
            if hot is not None and (m := hot.regex.search(line)) is not None:
                self.n_recognised += 1
                if self._failure is not None:
                    self._close_failure()
                if hot.family == "kv":
                    self._kv(hot.kind, m, no, line)
                else:
                    self._batch(hot.kind, m, no, line)
                in_input = self._dump == _INPUT
                continue
            # paste damage, after the lines the accelerator reads itself (it reads them the same way)
            if len(line) >= GLUED_LEN and (parts := split_glued(line)) is not None:
                self.n_lines, self._fragment = no - 1, fragment
                for part in parts:  # a paste that lost its newlines: its lines, each read as line `no`
                    self.feed([part])
                    self.n_lines = no - 1
                self.n_lines = no
                in_input, fragment = self._dump == _INPUT, self._fragment
                continue
            if ("``" in line or "~~" in line) and self._fenced(line):
                continue  # a fence line and nothing else
            if ";" in line and source_statement(line):
                continue  # a statement of quoted source code (`GGML_ASSERT(...);`)
            if line[-1:] == ">":
                line = uncut(line)
            hit = _first(line)
            if hit is not None and hit[0] is _CANDIDATE:
                # a draft candidate, about one line in six of a server log: the drafter hint, without the
                # general dispatch it would take to get there (see _dispatch and _event)
                self.n_recognised += 1
                if self._failure is not None:
                    self._close_failure()
                self._hint = (no, _CANDIDATE.component, line)
                self._mark_drafter()
                continue
            if not self._match(line, no, hit) and "&" in line and (text := unescape(line)) != line:
                hit = _first(text)
                self._match(text, no, hit)  # an HTML-escaped paste: once more on the unescaped text
            if hit is None or hit[0].family == "generic":
                self._unknown(line, no, hit is None)
            elif hit[0] is _FLAGS_ENTRY:
                self._prose_acceptance(line, no)  # a quoted command with its result beside it (a table row)
            elif hit[0].family == "block" and len(line) <= WRAP_WIDTH:
                self._prev = (no, line)  # its value may be on the next line (a re-wrap cut it there)
            in_input = self._dump == _INPUT
        self.n_lines = no
        self._fragment = fragment

    def _match(self, line: str, no: int, hit: tuple[Pattern, re.Match[str]] | None) -> bool:
        """`hit` (the line's first table entry, `_first`) dispatched; then the rest of the line, where one
        message ends without a newline and the next is glued on (a paste that lost its line breaks, the
        fork's unterminated warnings). Only failure-side lines are rescanned, so the hot path never pays."""
        found = False
        for _ in range(8):
            if hit is None:
                return found
            found = True
            p, m = hit
            if self._dispatch(p, m, no, line) is not False:
                self.n_recognised += 1
            if p.family not in _RESCAN:
                return True
            rest = line[m.end():]
            if len(rest) < 16:
                return True
            line = rest
            hit = _first(line)
        return found

    def _fenced(self, line: str) -> bool:
        """A Markdown fence line: it opens a block (C/C++ source is skipped to its end) or closes the open one.
        True when the line is the fence alone; a fence with log text glued on is read on as well."""
        found = fence_of(line)
        if found is None:
            return False
        fence, lang, alone = found
        if self._fence is None:
            self._fence, self._source = fence, lang in SOURCE_LANGS and alone
        elif closes_fence(line, self._fence):
            self._fence = None
        return alone

    def _prose_acceptance(self, line: str, no: int) -> None:
        """A draft acceptance told in the report's words, kept as an event (`prose_acceptance`)."""
        if ("accept" in line or "draft" in line) and (pa := PROSE_ACCEPTANCE_WORDS.search(line)) is not None:
            t, _ = self._time(line)
            told = {"text": pa.group(0), "drafter": DRAFTER_NAMED.search(line) is not None}
            self.events.append(Event(no, t, PROSE_ACCEPTANCE, "unknown", None, None,
                                     json.dumps(told, ensure_ascii=False), PROSE_ACCEPTANCE))

    def _unknown(self, line: str, no: int, unread: bool) -> None:
        """A line no table entry read (`unread`), or only the generic one: the end of a line a paste re-wrapped
        (joined to the line before it and read again), else a failure told in words the table does not know
        (analyze/reader/concepts.py). A draft acceptance told in prose is kept as an event (`prose_acceptance`)."""
        self._prose_acceptance(line, no)
        prev = self._prev
        if unread and prev is not None and prev[0] == no - 1 and (joined := rejoin(prev[1], line)) is not None:
            hit = _first(joined)
            if hit is not None and hit[0].family in _REWRAP and hit[1].end() > len(prev[1].rstrip()) + 1:
                # a block line's value may still be on the next line (a line re-wrapped into three or more)
                self._prev = (no, joined) if hit[0].family == "block" and len(joined) <= 2 * WRAP_WIDTH else None
                self._match(joined, no, hit)
                return
            if hit is None and len(joined) <= 2 * WRAP_WIDTH and WRAP_CUE.search(joined) is not None:
                self._prev = (no, joined)  # a line re-wrapped into three or more: the next may go on with it
                if recognise(line) is None:
                    return
                # a failure of its own right after a line with a re-wrap cue (koboldcpp's `[Context Shifting:
                # ... at position N]`, then `exception: access violation ...`): read it, do not swallow it
        if len(line) <= WRAP_WIDTH and WRAP_CUE.search(line) is not None:
            # it may be a re-wrapped line's start: the walker sees it, and the line after it, every time
            self._prev = (no, line)
        found = recognise(line)
        if found is None:
            return
        concept, m = found
        f = self._failure
        if f is not None and no - f.last_line <= FAILURE_GAP:
            f.add_line(no, line)  # a wrapper's words for the failure being assembled
            if f.proof != "log":
                f.proof = strongest((f.proof, self._proof(line)))  # type: ignore[assignment]  # never empty
            return
        self._concept_failure(concept, code_of(m), no, line)

    def _proof(self, line: str) -> str:
        """What a line the concept layer read shows: inside a fenced block a paste's output is a program's, never
        a sentence of the report."""
        proof = line_proof(line)
        return "runtime" if proof == "prose" and self._fence is not None else proof

    def _concept_failure(self, concept: Concept, ret: int | None, no: int, line: str) -> None:
        kind = "kv_slot" if ret == 1 and concept.kind == "decode_failed" else concept.kind
        f = self._open_failure(no, line, kind, 4)
        f.variant, f.words, f.ret = concept.variant, concept.variant, ret
        f.proof = self._proof(line)
        side = side_of(line)
        if side != "unknown":
            f.component, f.evidence, f.evidence_line = side, message(line), no
        f.add_line(no, line)

    def close(self) -> None:
        self._end_batch()
        self._close_failure()

    # ------------------------------------------------------------------ dispatch by family
    def _dispatch(self, p: Pattern, m: re.Match[str], no: int, line: str) -> bool:
        """Hand a match to its family; False when the line turned out not to be a log line."""
        fam = p.family
        if fam == "block" and not self._block(p, m, no, line):
            return False
        if fam == "batch":
            self._batch(p.kind, m, no, line)
        elif fam == "kv":
            self._kv(p.kind, m, no, line)
        elif fam == "failure":
            self._fail(p, m, no, line)
        elif fam == "follow":
            self._follow(p, m, no, line)
        elif fam == "event" or fam == "hint":
            if self._failure is not None:
                self._close_failure()  # before the event replaces the hint the open failure may still need
            self._event(p, m, no, line)
        elif fam == "meta":
            self._meta(p, m, line)
            if p.name == "spec_impl_called":
                self._impl_called(m["impl"], no, line)
        f = self._failure
        if f is not None:
            if fam in ("batch", "kv", "event", "hint") or no - f.last_line > FAILURE_GAP:
                self._close_failure()
            elif fam != "block":
                f.block_open = False  # what follows the block is the decode failing, not more of it
        # a command line is the reporter's, not llama.cpp's: its flags are kept, but a text of command lines
        # alone (a repro, a thread of commands) holds no log
        return p.kind != "flag"

    def _time(self, line: str) -> tuple[float, str | None]:
        if (m := _PREFIX_AT_START(line)) is not None:  # a raw capture: llama.cpp's own prefix, nothing else
            return llama_seconds(m), m["lvl"]
        pre = parse_prefix(line)
        if pre.t is None:
            return math.nan, pre.level
        if pre.absolute:
            if self.first_abs_t is None:
                self.first_abs_t = pre.t
            return pre.t - self.first_abs_t, pre.level
        return pre.t, pre.level

    # ------------------------------------------------------------------ LLAMA_BATCH_DEBUG
    def _batch(self, kind: str, m: re.Match[str], no: int, line: str) -> None:
        if kind == "input":
            self._end_batch()
            self._dump = _INPUT
            self._fields = {}
            self._seqs = []
            self._batch_line = no
            self._batch_t = self._time(line)[0]
        elif kind == "ubatch":
            if self._dump != _OUT:
                self._flush_input()
            self._dump = _UBATCH
        elif kind == "seq_open":
            if self._dump == _INPUT:
                self._dump = _SEQS
        elif kind == "seq_pos":
            if self._dump == _SEQS:
                self._seqs.append((_i64(m["seq"]), _i64(m["pos_min"]), _i64(m["pos_max"])))
        elif kind == "seq_close" and self._dump == _SEQS:
            self._flush_input()
            self._dump = _OUT

    def _flush_input(self) -> None:
        """Write the rows of the input batch whose dump just ended (one per sequence in it)."""
        if self._dump not in (_INPUT, _SEQS):
            return
        self._dump = _OUT
        f = self._fields
        n_tokens = _int_or_na(f.get("n_tokens"))
        n_outputs = _int_or_na(f.get("n_outputs"))
        embd = -1 if "embd" not in f else int(f["embd"] not in _NIL and f["embd"].strip("0x") != "")
        seqs = self._seqs or [(NA, NA, NA)]
        ptr = f.get("pos", "")
        # keyed per request too: a freed batch's address can come back as the other context's buffer
        key = f"{ptr}@{self._requests}"
        buf = self.buffers.setdefault(key, len(self.buffers)) if ptr and ptr not in _NIL else NA
        if buf == len(self.buffer_request):
            self.buffer_request.append(self._requests)
        # a batch dumped right after a slot's prompt line is that slot's (the target's) prompt
        hint = 0
        if self._hint is not None and self._batch_line - self._hint[0] <= 3 and self._hint[1] == "target":
            hint = CONTEXT_CODES["target"]
        b = self.batches
        batch_no = self._n_batches
        self._n_batches += 1
        self._cur_rows = []
        self._cur_sizes = set()
        self._cur_found_slot = False
        for seq, lo, hi in seqs:
            self._cur_rows.append(len(b))
            b.batch.append(batch_no)
            b.line.append(self._batch_line)
            b.t.append(self._batch_t)
            b.seq_id.append(seq)
            b.n_tokens.append(n_tokens)
            b.pos_min.append(lo)
            b.pos_max.append(hi)
            b.n_outputs.append(n_outputs)
            b.embd.append(embd)
            b.ok.append(1)
            b.sig.append(-1)
            b.hint.append(hint)
            b.buf.append(buf)

    def _end_batch(self) -> None:
        if self._dump == _INPUT or self._dump == _SEQS:
            self._flush_input()
        if self._cur_rows and self._cur_sizes:
            key = frozenset(self._cur_sizes)
            sig = self._sigs.setdefault(key, len(self._sigs))
            for r in self._cur_rows:
                self.batches.sig[r] = sig
        self._cur_rows = []
        self._cur_sizes = set()

    # ------------------------------------------------------------------ LLAMA_KV_CACHE_DEBUG
    def _kv(self, kind: str, m: re.Match[str], no: int, line: str) -> None:
        if self._dump in (_INPUT, _SEQS):
            self._flush_input()
        if kind == "stream":
            self._kv_size = _i64(m["size"])
            self._cur_sizes.add(self._kv_size)
            self._cur_found_slot = True
            return
        kv = self.kv
        kv.line.append(no)
        # find_slot runs microseconds after its batch's dump: reuse that time rather than parse it again
        kv.t.append(self._batch_t if self._cur_rows else self._time(line)[0])
        kv.cache_size.append(self._kv_size)
        kv.stream.append(_i64(m["stream"]))
        kv.seq_id.append(_i64(m["seq"]))
        kv.pos_min.append(_i64(m["pos_min"]))
        kv.pos_max.append(_i64(m["pos_max"]))

    # ------------------------------------------------------------------ failures
    def _open_failure(self, no: int, line: str, kind: str, stage: int) -> Failure:
        self._close_failure()
        t, _ = self._time(line)
        f = Failure(line=no, t=t, kind=kind, stage=stage, last_line=no, keep_lines=len(self.failures) < KEEP_LINES_FOR)
        # a failure right after a batch dump (before find_slot placed it) is that batch's failure
        if self._cur_rows and not self._cur_found_slot or self._dump in (_INPUT, _SEQS):
            self._flush_input()
            f.batch = self.batches.batch[self._cur_rows[0]] if self._cur_rows else None
            for r in self._cur_rows:
                self.batches.ok[r] = 0
        self._failure = f
        return f

    def _block(self, p: Pattern, m: re.Match[str], no: int, line: str) -> bool:
        kind = p.kind
        f = self._failure
        live = f is not None and f.block_open and not f.block_closed
        if kind == "close":
            if not live:
                return False  # a closing line with nothing before it is prose quoting the error
            assert f is not None
            op = m.groupdict().get("op")
            f.variant = p.extra.get("variant") or ("mrope_le" if op and "=" in op else "mrope_lt")
            if op:
                self.meta["mrope"] = True
                if self.meta_lines is not None:
                    self.meta_lines.append((_MROPE, line))
            f.block_closed = True
            f.add_line(no, line)
            return True
        seq = int(m["seq"]) if m.groupdict().get("seq") is not None else None  # a header cut before its number
        if (kind == "header" and live and f is not None and f.line == no - 1 and f.seq_id == seq
                and f.last_pos is None and f.batch_start is None):
            f.add_line(no, line)  # the header read again whole, joined to its re-wrapped end: the same header
            return True
        if kind == "header" or not live or f is None or (
                kind == "x" and (f.last_pos is not None or f.batch_start is not None)) or (
                kind == "y" and f.batch_start is not None) or (f.seq_id is not None and f.seq_id != seq):
            f = self._open_failure(no, line, "inconsistent_positions", 0)
            f.has_block = True
            f.variant, f.words = "unclosed", failure_words(p, m, line)
            f.seq_id = seq
        assert f is not None
        f.block_open = True
        if kind == "x":
            f.last_pos = int(m["x"])
        elif kind == "y" and m["y"] is not None:
            f.batch_start = int(m["y"])
        f.add_line(no, line)
        return True

    def _fail(self, p: Pattern, m: re.Match[str], no: int, line: str) -> None:
        stage = int(p.extra.get("stage", "0"))
        g = m.groupdict()
        ret = _int(g.get("ret"))
        kind = "kv_slot" if ret == 1 else p.kind
        f = self._failure
        # each stage (validation, decode, llama_decode, caller, server) prints once per failure;
        # a stage seen again means a new failure (server retries, stage 4, repeat within one)
        if (f is None or stage == 0 or stage < f.stage or (stage == f.stage and stage < 4)
                or f.variant.startswith(CONCEPT_PREFIX)):  # llama.cpp's own line after a wrapper's: its own failure
            f = self._open_failure(no, line, kind, stage)
            f.variant, f.words = p.name, failure_words(p, m, line)
        elif SEVERITY.get(kind, 0) > SEVERITY.get(f.kind, 0):
            f.kind, f.variant = kind, p.name
        elif p.kind == "kv_slot" and f.kind == "decode_failed" and f.ret is None:
            # a line naming the missing memory slot (`failed to find a memory slot`) says why the batch before it
            # could not be placed (a split that failed): decode's ret = 1, the KV room's, not a position error
            f.kind, f.variant = kind, p.name
        f.stage = max(f.stage, stage)
        if ret is not None and (f.ret is None or f.ret == 0):
            f.ret = ret
        if f.seq_id is None and g.get("seq") is not None:
            f.seq_id = int(g["seq"])
        side = p.component if p.component != "unknown" else caller_side(line[: m.start()])
        if side == "unknown" and g.get("cond"):
            side = side_of(g["cond"])  # an assert whose condition or message names the draft side (MTP's head)
        if side != "unknown" and f.component == "unknown":
            f.component, f.evidence, f.evidence_line = side, message(line), no
        f.add_line(no, line)

    def _follow(self, p: Pattern, m: re.Match[str], no: int, line: str) -> None:
        f = self._failure
        if f is None or no - f.last_line > FAILURE_GAP:
            if p.name == "frame" and crash_frame(m["fn"]):  # a backtrace pasted without the line before it
                self._concept_failure(CRASH, None, no, line)
            elif kind := p.extra.get("alone"):  # a line that is a failure of its own where none is open
                f = self._open_failure(no, line, kind, 0)
                f.variant, f.words = p.name, failure_words(p, m, line)
                f.add_line(no, line)
            return
        side = frame_side(m["fn"]) if p.name == "frame" else p.component
        if f.proof == "prose":
            f.proof = "runtime"  # a frame or a caller's line after a sentence: the program's own output shows it
        if side != "unknown" and f.component == "unknown":
            f.component, f.evidence, f.evidence_line = side, message(line), no
        f.add_line(no, line)

    def _close_failure(self) -> None:
        f = self._failure
        if f is None:
            return
        self._failure = None
        if f.component == "unknown" and self._hint is not None:
            h_line, h_comp, h_text = self._hint
            # a draft context being loaded names the side of a start-up failure, not of a decode that fails
            startup = f.kind in _DECODE_KINDS and _DRAFT_INIT.search(h_text) is not None
            if 0 < f.line - h_line <= HINT_GAP and not startup:
                f.component, f.evidence, f.evidence_line = h_comp, message(h_text), h_line
        # a failure that names no sequence takes the one a warning named just before it (find_slot)
        if f.seq_id is None and self._seq_hint is not None and 0 <= f.line - self._seq_hint[0] <= HINT_GAP:
            f.seq_id = self._seq_hint[1]
        if f.batch is not None and f.component != "unknown":
            code = CONTEXT_CODES[f.component]
            for r in range(len(self.batches) - 1, -1, -1):
                if self.batches.batch[r] != f.batch:
                    break
                self.batches.hint[r] = code
        self.failures.append(f)

    # ------------------------------------------------------------------ events and meta
    def _event(self, p: Pattern, m: re.Match[str], no: int, line: str) -> None:
        if p.family == "hint" or p.extra.get("hint"):
            self._hint = (no, p.component, line)
        if p.family == "hint" and p.kind == "draft":
            self._mark_drafter()
            return
        g = {k: v for k, v in m.groupdict().items() if v is not None}
        if p.kind == "kv_warning":
            self._seq_hint = (no, int(g["seq"]))
        if p.kind == "draft_init":  # a draft context being made is speculative decoding, hint or not
            self.draft_seen = True
            if self.meta_lines is not None:
                self.meta_lines.append((p.name, line))
        if p.family == "hint" and p.kind in ("decode", "draft_start", "draft_init"):
            return
        if p.kind == "new_prompt":
            self._requests += 1
        if p.name == "dflash_kv":
            detail: dict[str, Any] = {"tag": g["tag"].strip()}
            detail.update(_KV_PAIR.findall(g["body"]))
        else:
            detail = {"pattern": p.name, **g}
        if p.name == "json_draft_n" and (r := _RESPONSE_ID.search(line)) is not None:
            detail["response"] = r["id"]  # a stream's chunks each carry the response's running totals
        s = _SLOT.search(line)
        if s is not None:
            detail["slot"] = int(s["slot"])
            detail["task"] = int(s["task"])
        seq = g.get("seq") or detail.get("seq")
        pos = g.get("pos") or g.get("pos_max") or detail.get("pos_max")
        try:
            seq_id = int(seq) if seq is not None else detail.get("slot")
        except ValueError:
            seq_id = None
        try:
            pos_i = int(pos) if pos is not None else None
        except ValueError:
            pos_i = None
        t, _ = self._time(line)
        # kept as JSON text at once: a dict per event would dominate memory on a big log
        text = readable(json.dumps(detail, sort_keys=True, ensure_ascii=False))
        accepted, generated = draft_counts(p.kind, p.name, detail)
        self.events.append(Event(no, t, p.kind, p.component, seq_id, pos_i, text, p.name,
                                 int_or_none(detail.get("slot")), int_or_none(detail.get("task")), accepted, generated))

    def _impl_called(self, impl: str, no: int, line: str) -> None:
        """A draft made by an n-gram implementation: where the log also runs a drafter (`--spec-type
        ngram-simple,draft-simple`: b11434 asks the n-gram one first), that step's draft is no drafter's, so its
        cycle is not the drafter's to be in step in (findings/cycles.py). Kept whatever the meta says so far: a
        piece of a log read in parallel (split.py) has not seen the start-up lines."""
        if not impl.startswith("ngram"):
            return
        t, _ = self._time(line)
        self.events.append(Event(no, t, NGRAM_DRAFT, "unknown", None, None,
                                 json.dumps({"pattern": "spec_impl_called", "impl": readable(impl)}),
                                 "spec_impl_called"))

    def _mark_drafter(self) -> None:
        # candidates are printed from the logits of the decode that just ran: that batch was the drafter's
        b = self.batches
        for r in self._cur_rows:
            if b.hint[r] == 0:
                b.hint[r] = _DRAFTER

    def replay_meta(self, lines: list[tuple[str, str]]) -> None:
        """Apply another walker's `meta_lines` to this walker's meta (and its layout and draft state), as if
        its lines had come here."""
        for name, line in lines:
            if name == _MROPE:
                self.meta["mrope"] = True
                continue
            p = BY_NAME[name]
            if p.kind == "draft_init":
                self.draft_seen = True
            elif (m := p.regex.search(line)) is not None:
                self._meta(p, m, line)

    def _meta(self, p: Pattern, m: re.Match[str], line: str) -> None:
        if self.meta_lines is not None:
            self.meta_lines.append((p.name, line))
        meta = self.meta
        g = {k: readable(v) for k, v in m.groupdict().items() if v is not None}
        kind = p.kind
        if kind == "version":
            if g not in meta["versions"]:
                meta["versions"].append(g)
        elif kind == "backend":
            name = g.get("backend") or p.extra.get("backend", "")
            if name and name not in meta["backends"]:
                meta["backends"].append(name)
            if "n" in g:
                meta.setdefault("n_devices", {})[name] = int(g["n"])
        elif kind == "gpu":
            idx = int(g.get("idx", len(meta["gpus"])))
            backend = p.extra.get("backend") or ("ROCm" if "arch" in g or "ROCm" in meta["backends"] else "CUDA")
            gpu: dict[str, Any] = {"index": idx, "name": g.get("name", "").strip(), "backend": backend,
                                   "device": backend if backend == "Metal" else f"{backend}{idx}"}
            if "cc" in g:
                gpu["compute_capability"] = g["cc"]
            if "mib" in g:
                gpu["memory_mib"] = int(g["mib"])
            add_device(meta["gpus"], gpu)
            if p.extra.get("backend") and backend not in meta["backends"]:
                meta["backends"].append(backend)
        elif kind in LAYOUT_KINDS:
            if kind in ("device", "use_device"):
                dev = g["device"]
                backend = backend_of(dev)
                digits = dev[len(backend):]
                add_device(meta["gpus"], {"index": int(digits) if digits.isdigit() else 0, "name": g["name"].strip(),
                                          "device": dev, "backend": backend, "memory_mib": _int(g.get("total")),
                                          "free_mib": _int(g.get("free"))})
                if backend not in meta["backends"]:
                    meta["backends"].append(backend)
            if kind != "device":
                self.layout.feed(kind, g, self.draft_seen)
        elif kind == "placement":
            meta["placement"] = {k: int(v) for k, v in g.items()}
        elif kind in ("context", "kv_cache"):
            size = int(g.get("n_ctx") or g["cells"])  # each pattern has one of the two
            meta["contexts"].append({"kind": kind, "size": size, "after_draft_marker": self.draft_seen})
        elif kind == "draft_marker":
            self.draft_seen = True
        elif kind == "spec_none":  # the speculative set-up added no implementation: nothing will draft
            meta["spec_none"] = True
        elif kind == "spec_impl":
            self.draft_seen = True
            if g["impl"] not in meta["spec_impls"]:
                meta["spec_impls"].append(g["impl"])
        elif kind == "rope":
            if g["rope"] not in meta["rope"]:
                meta["rope"].append(g["rope"])
        elif kind == "arch":
            if g["arch"] not in meta["arch"]:
                meta["arch"].append(g["arch"])
        elif kind == "flag":
            self.add_flags(line)

    def add_flags(self, text: str, *, only_new: bool = False, told: bool | None = None) -> None:
        """The command-line flags in `text` into meta["flags"]; `only_new` keeps what the log said itself.

        A flag named in a sentence (`I also tried --parallel 2.`) is a remark, not the command: it never
        overrides a command's value, loses the sentence's punctuation, and is listed in meta["told_flags"] so
        that nothing is rebuilt from it as if it were the command (the rerun line, the checklist). `told`: whether
        `text` is such a sentence, where the caller knows (a manifest's command line is not); else judged here."""
        flags = self.meta["flags"]
        told = remark(text) if told is None else told
        told_flags = self.meta["told_flags"]
        for fm in _FLAGS.finditer(text):
            flag = fm["flag"]
            if (only_new or told) and flag in flags:
                continue
            value = fm["value"]
            if value is not None and told:
                value = value.rstrip(".,;:!?)")
            flags[flag] = readable(value.strip('"')) if value else True
            if told:
                told_flags.append(flag)
            elif flag in told_flags:
                told_flags.remove(flag)  # a command shows it after all


def _skim_code(p: Pattern) -> int:
    """What the C accelerator may do with a line whose first entry is `p` (analyze/reader/_skim.c, CODE_*)."""
    if p.family == "generic":
        return 1  # only counted
    if p.family == "hint" and p.kind == "draft":
        return 2  # the drafter's hint (see _event)
    if p.family == "hint" and p.kind in ("decode", "draft_start"):
        return 3  # a hint and nothing else
    return 0  # the walker's


_TABLE = tuple((p.anchor, p.regex.search, p) for p in PATTERNS)  # unpacked once for the hot loop
_RESCAN = {"block", "failure", "follow"}
_REWRAP = {"block", "failure", "follow"}  # what a re-wrapped line joined back may be


def _first(line: str) -> tuple[Pattern, re.Match[str]] | None:
    """The first entry of the table that matches the line (its anchor first, then its regex).

    Which entry a line matches is remembered by its text with every digit masked: the same messages repeat
    on every cycle of a run with only their timestamps, ids, positions and probabilities changed, and
    walking the table is the costly part. No entry's regex or anchor tells one digit from another (checked
    when the table is loaded; lines holding the anchor of one that could are remembered by their exact
    text without llama.cpp's timestamp prefix), so the masked text picks the same entry."""
    # masked as bytes: one C table lookup per byte (a regex substitution costs ten times more)
    key: str | bytes = line.encode("utf-8", "surrogatepass").translate(_MASK_DIGITS)
    idx = _FIRST.get(key)
    if idx is None and any(a in line for a in _DIGIT_SENSITIVE):
        # those anchors hold no digit, so the masked text holds one exactly when the line does: remember it
        _FIRST[key] = idx = _EXACT
    if idx == _EXACT:
        key = line
        if line[:1].isdigit() and (pre := LLAMA_PREFIX.match(line)) is not None:
            key = line[pre.end() :]
        idx = _FIRST.get(key)
    if idx is not None:
        if idx < 0:
            return None
        p = PATTERNS[idx]
        m = p.regex.search(line)
        if m is not None:
            return p, m
    if len(_FIRST) > 20_000:
        _FIRST.clear()
    # a line nothing (or only the generic entry) reads may still need the walker (see _needs_walker): the C
    # accelerator skips what its memo says is no entry's or generic, so such a line is remembered by its text
    masked = isinstance(key, bytes)
    for i, (anchor, search, p) in enumerate(_TABLE):
        if anchor in line and (m := search(line)) is not None:
            _FIRST[key] = _EXACT if masked and p.family == "generic" and _needs_walker(line) else i
            return p, m
    _FIRST[key] = _EXACT if masked and _needs_walker(line) else -1
    return None


def _needs_walker(line: str) -> bool:
    """Whether a line no entry reads but the generic one means something to the walker: a re-wrapped line's
    possible start (`_unknown`), a failure the concept layer reads, or a draft acceptance told in prose (kept
    as an event every time it comes). Decided by its text alone, digits aside, so every line with the same
    masked text gets the same answer."""
    return ((len(line) <= WRAP_WIDTH and WRAP_CUE.search(line) is not None) or recognise(line) is not None
            or (("accept" in line or "draft" in line) and PROSE_ACCEPTANCE_WORDS.search(line) is not None))


def _digit_sensitive(p: Pattern) -> bool:
    """Whether an entry could tell one digit from another: a digit in its anchor or in its regex other
    than `\\d`, repeat counts and a character class holding all of `0-9` (`[0-9a-f]`) and no other digit."""
    rest = re.sub(r"\\d|\{\d+(?:,\d*)?\}", "", p.regex.pattern)
    rest = _CLASS.sub(lambda m: "" if not any(c.isdigit() for c in m[0].replace("0-9", "")) else m[0], rest)
    return any(c.isdigit() for c in rest + p.anchor)


_CLASS = re.compile(r"\[\^?\]?[^\]]*\]")  # a character class, as the table writes them (no nested brackets)


_FIRST: dict[str | bytes, int] = {}
_EXACT = -2  # a masked text whose lines are looked up by their exact text
_MASK_DIGITS = bytes.maketrans(b"123456789", b"000000000")
# lines holding one of these anchors are remembered by their own text
_DIGIT_SENSITIVE = tuple(sorted({p.anchor for p in PATTERNS if _digit_sensitive(p)}))
if any(c.isdigit() or not c.isascii() for a in _DIGIT_SENSITIVE for c in a):
    raise ImportError("a digit-sensitive anchor holds a digit: _first can no longer test it on the masked text")
_PREFIX_AT_START = LLAMA_PREFIX.match
_DRAFT_INIT = re.compile("|".join(p.regex.pattern for p in PATTERNS if p.family == "hint" and p.kind == "draft_init"))
_DECODE_KINDS = {"inconsistent_positions", "decode_failed", "kv_slot"}
_FIELD = BY_NAME["batch_field"].regex
_FLAGS_ENTRY = BY_NAME["flags"]
_FLAGS = _FLAGS_ENTRY.regex
_CANDIDATE = BY_NAME["draft_candidate"]
_MROPE = "(m-rope)"  # a meta line that is not a table entry's: a closing line naming the M-RoPE check
_DRAFTER = CONTEXT_CODES["drafter"]
_KV_SEQ, _KV_STREAM = BY_NAME["kv_seq"], BY_NAME["kv_stream"]
_INPUT_BATCH, _UBATCH_ADD = BY_NAME["batch_input"], BY_NAME["batch_ubatch"]
_SEQ_POS, _SEQ_OPEN, _SEQ_CLOSE = BY_NAME["batch_seq_pos"], BY_NAME["batch_seq_open"], BY_NAME["batch_seq_close"]
if _skim is not None:
    _skim.configure(_FIRST, bytes(_skim_code(p) for p in PATTERNS), tuple(p.component for p in PATTERNS), _DRAFTER)
