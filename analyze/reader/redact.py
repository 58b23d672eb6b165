"""Shareable logs: a llama.cpp log with the user's prompts and the model's answers taken out.

`RULES` is the table of the line shapes that carry text (request and response JSON, `Parsed message`, the
slot's prompt, token text and ids in batch dumps, draft candidates' pieces, grammars): each entry names what
it removes and keeps the rest of its line, so every position, sequence, batch size, error and statistic
stays and the redacted log reads to the same tables and verdict. Text is replaced by a fixed placeholder of
the same shape where the reader needs the shape (a token row stays one row with its columns; a piece cut
by a line break keeps its lines, so every line number stays too).

`Redactor` is fed bytes and gives bytes back, line by line, in bounded memory; it counts the lines each
entry changed, for the summary. Nothing here prints.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypedDict, Unpack

from kvtrace.analyze.reader.session import (
    KEY_PING_CONFIG,
    KEY_REDACTED,
    RAW_LOG,
    SHAREABLE,
    Session,
    log_of,
    now_iso,
    read_manifest,
)
from kvtrace.analyze.reader.source import MAX_LINE, Source, open_source

PLACEHOLDER = b"[redacted]"
PIECE_WIDTH = 16  # a batch dump prints a token's piece as %16s
ID_WIDTH = 6  # and its id as %6d, as the candidate lines do

# How a piece cut by a line break (a token whose text holds "\n") goes on over the next lines:
ROW = "row"  # a batch-dump token row: up to the line with `output = N` (as analyze/reader/walker.py reads it)
QUOTE = "quote"  # a quoted piece: up to the line that ends with the closing quote
TEXT = "text"  # free text (a grammar, a parser): up to the next log line
FOLLOW_MAX = {ROW: 64, QUOTE: 64, TEXT: 100_000}  # lines: a piece is short; a grammar can be long


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    what: str  # what it removes, in the summary's words
    anchor: bytes  # a literal every line it is for holds: tested before the regex
    regex: re.Pattern[bytes]
    replace: Callable[[re.Match[bytes]], bytes]  # the redacted text of a match
    follow: str = ""  # ROW, QUOTE or TEXT: the match opens a piece that goes on over the next lines
    every: bool = False  # every match on a line (JSON values), on lines no line shape took
    examples: tuple[tuple[str, str], ...] = ()  # (real lines, what they redact to); see RULES


class RuleOptions(TypedDict, total=False):
    """What a rule may set beyond its name, anchor, regex and replacement (`_r`)."""

    follow: str
    every: bool
    examples: tuple[tuple[str, str], ...]


def _id() -> bytes:
    return b" " + b"0".rjust(ID_WIDTH)


def _piece() -> bytes:
    return PLACEHOLDER.rjust(PIECE_WIDTH)


# A special token's piece (`<mask>`, `<s>`, `<|im_end|>`) is the model's, not the user's; DFlash's noise
# block is told by its `<mask>` rows (tools/scenario_health.py), so rows of special tokens are kept whole.
_SPECIAL = re.compile(rb"\s*<[^<>\s]{1,40}>")


def _token_row(m: re.Match[bytes]) -> bytes:
    if _SPECIAL.fullmatch(m["piece"]):
        return m[0]
    return m["head"] + _id() + b" (" + _piece() + (m.groupdict().get("tail") or b"")


def _candidate(m: re.Match[bytes]) -> bytes:
    return m["head"] + _id() + m["mid"] + b"'" + PLACEHOLDER + b"'"


def _zero(m: re.Match[bytes]) -> bytes:
    return m["head"] + b"0" + (m.groupdict().get("tail") or b"")


def _text(m: re.Match[bytes]) -> bytes:
    return m["head"] + (PLACEHOLDER if m["text"].strip() else m["text"])


def _json_string(m: re.Match[bytes]) -> bytes:
    if m["value"] in (b'""', b'"'):
        return m[0]
    return m["key"] + m["sep"] + b'"' + PLACEHOLDER + b'"'


def _json_array(m: re.Match[bytes]) -> bytes:
    if not m["items"].strip():
        return m[0]
    return m["key"] + m["sep"] + b"[]"


def _r(name: str, what: str, anchor: bytes, regex: bytes, replace: Callable[[re.Match[bytes]], bytes],
       **kw: Unpack[RuleOptions]) -> Rule:
    return Rule(name, what, anchor, re.compile(regex), replace, **kw)


_INT = rb"-?\d+"
_JSON_STRING = rb'"(?:[^"\\]|\\.)*(?:"|$)'  # a JSON string; one cut off at the end of the line too
# The JSON keys whose values are the user's or the model's text: messages and their parts, completions,
# deltas, the slot's prompt and what it generated so far, tool-call arguments, infill context, grammars,
# stop words, log-probability tokens, images and audio sent inline.
_TEXT_KEYS = (rb"content|reasoning_content|text|prompt|system_prompt|generated|stopping_word|arguments|input|"
              rb"instructions|input_prefix|input_suffix|input_extra|grammar|json_schema|token|tok_str|url|data")
_TOKEN_KEYS = rb"tokens|prompt_tokens|bytes|stop|input"

# Examples: real lines of llama-server b11434 (`make server`), from the scenario fixtures
# (tests/fixtures/scenarios) and from captures made with private prompts; shortened where a line's other
# fields are many (the JSON lines), never otherwise changed.
RULES: tuple[Rule, ...] = (
    # ---- LLAMA_BATCH_DEBUG=2 token rows (docs/llama-cpp-lines.md#batch-dumps): `%4d: id = %6d (%16s), pos = %4d, ...`
    _r("batch_token", "token text and id of a batch-dump row", b": id = ",
       rb"(?P<head>ubatch_print:\s+\d+: id =)\s*" + _INT +
       rb" \((?P<piece>.*)(?P<tail>\), pos =\s*" + _INT + rb", n_seq_id =.*output = " + _INT + rb".*)",
       _token_row,
       examples=(
           ("0.00.228.579 D ubatch_print:     1: id =    565 (             wr), pos =    1, n_seq_id =  1, "
            "seq_id = [0], output = 0",
            "0.00.228.579 D ubatch_print:     1: id =      0 (      [redacted]), pos =    1, n_seq_id =  1, "
            "seq_id = [0], output = 0"),
           # a special token is kept: it is the model's, and DFlash's noise block is told by it
           ("0.01.111.686 D ubatch_print:     1: id =      3 (          <mask>), pos =   25, n_seq_id =  1, "
            "seq_id = [0], output = 1",
            "0.01.111.686 D ubatch_print:     1: id =      3 (          <mask>), pos =   25, n_seq_id =  1, "
            "seq_id = [0], output = 1"),
       )),
    _r("batch_token_cut", "token text and id of a batch-dump row whose piece holds a line break", b": id = ",
       rb"(?P<head>ubatch_print:\s+\d+: id =)\s*" + _INT + rb" \((?P<piece>.*)", _token_row, follow=ROW,
       examples=(
           ("0.01.099.488 D ubatch_print:    13: id =     14 (               \n"
            "), pos =   13, n_seq_id =  1, seq_id = [0], output = 0",
            "0.01.099.488 D ubatch_print:    13: id =      0 (      [redacted]\n"
            "), pos =   13, n_seq_id =  1, seq_id = [0], output = 0"),
       )),
    # ---- draft candidates (docs/llama-cpp-lines.md#the-servers-lines):
    #      ` - seq_id %d, draft candidate %3d, pos %3d: %6d (%8.3f) '%s'`
    _r("draft_candidate", "a draft candidate's token text and id", b"draft candidate",
       rb"(?P<head>draft candidate\s+\d+, pos\s+\d+:)\s*" + _INT + rb"(?P<mid> \([^)]*\) )'(?P<piece>.*)'$",
       _candidate,
       examples=(
           ("0.01.112.170 D  - seq_id 0, draft candidate   0, pos   0:    568 (   0.689) ' write'",
            "0.01.112.170 D  - seq_id 0, draft candidate   0, pos   0:      0 (   0.689) '[redacted]'"),
       )),
    _r("draft_candidate_cut", "a draft candidate's token text (holding a line break) and id", b"draft candidate",
       rb"(?P<head>draft candidate\s+\d+, pos\s+\d+:)\s*" + _INT + rb"(?P<mid> \([^)]*\) )'(?P<piece>.*)$",
       _candidate, follow=QUOTE,
       examples=(
           ("0.02.158.158 D spec        draft:  - seq_id 0, draft candidate   1, pos   0:     14 (   0.052) '\n'",
            "0.02.158.158 D spec        draft:  - seq_id 0, draft candidate   1, pos   0:      0 (   0.052) "
            "'[redacted]'\n"),
       )),
    # ---- the slot's sampled tokens: `n_gen = %d, n_remaining = %d, next token: %5d '%s'` (older: n_decoded)
    _r("next_token", "a sampled token's text and id", b"next token: ",
       rb"(?P<head>next token:)\s*" + _INT + rb"(?P<mid> )'(?P<piece>.*)'$", _candidate,
       examples=(
           ("0.01.117.547 D slot process_toke: id  0 | task 0 | n_gen = 2, n_remaining = 22, next token:   568 "
            "' write'",
            "0.01.117.547 D slot process_toke: id  0 | task 0 | n_gen = 2, n_remaining = 22, next token:      0 "
            "'[redacted]'"),
       )),
    _r("next_token_cut", "a sampled token's text (holding a line break) and id", b"next token: ",
       rb"(?P<head>next token:)\s*" + _INT + rb"(?P<mid> )'(?P<piece>.*)$", _candidate, follow=QUOTE,
       examples=(
           ("0.04.113.161 D slot process_toke: id  0 | task 15 | n_gen = 13, n_remaining = 19, next token:    14 '\n'",
            "0.04.113.161 D slot process_toke: id  0 | task 15 | n_gen = 13, n_remaining = 19, next token:      0 "
            "'[redacted]'\n"),
       )),
    # ---- the generation prompt's tokens fed to the sampler: `prefill token: %d = %s`
    _r("prefill_token", "a prefilled token's text and id", b"prefill token: ",
       rb"(?P<head>prefill token: )" + _INT + rb" = (?P<text>.*)",
       lambda m: m["head"] + b"0 = " + PLACEHOLDER, follow=TEXT,
       examples=(
           ("0.01.099.113 D common_sampler_init: prefill token: 297 = s",
            "0.01.099.113 D common_sampler_init: prefill token: 0 = [redacted]"),
       )),
    # ---- token ids in the slot's per-token lines (a run of them spells the answer)
    _r("generate_draft_id", "the last sampled token's id", b"generate_draft: id=",
       rb"(?P<head>generate_draft: id=)" + _INT, _zero,
       examples=(
           ("0.01.112.483 D slot handle_last_: id  0 | task 0 | generate_draft: id=232, #tokens=24, #draft=3, "
            "pos_next=24",
            "0.01.112.483 D slot handle_last_: id  0 | task 0 | generate_draft: id=0, #tokens=24, #draft=3, "
            "pos_next=24"),
       )),
    _r("sampled_id", "the sampled token's id after a verification", b"sampled=",
       rb"(?P<head>add accepted tokens: sampled=)" + _INT, _zero,
       examples=(
           ("0.01.116.454 D slot   operator(): id  0 | task 0 | add accepted tokens: sampled=378, ids.size=2, "
            "n_draft=3",
            "0.01.116.454 D slot   operator(): id  0 | task 0 | add accepted tokens: sampled=0, ids.size=2, n_draft=3"),
       )),
    _r("decode_token_id", "the id of a token decoded alone", b"slot decode token, id=",
       rb"(?P<head>slot decode token, id=)" + _INT, _zero,
       examples=(
           ("0.01.171.806 D slot handle_last_: id  0 | task 0 | slot decode token, id=617, n_ctx = 512, n_tokens = 46, "
            "truncated = 0",
            "0.01.171.806 D slot handle_last_: id  0 | task 0 | slot decode token, id=0, n_ctx = 512, n_tokens = 46, "
            "truncated = 0"),
       )),
    # ---- grammars and parsers built from the request (a response format's schema, tools, a user grammar):
    # printed whole, over as many lines as they have
    _r("grammar", "a request's grammar", b"Grammar (", rb"(?P<head>Grammar \([^)]*\): )(?P<text>.*)", _text,
       follow=TEXT,
       examples=(
           ('0.01.078.110 D srv    operator(): Grammar (): root ::= "frob" x\nx ::= "nicatrix\\n" | " wibble"\n\n'
            "0.01.078.112 I srv    operator(): chat format: peg-native",
            "0.01.078.110 D srv    operator(): Grammar (): [redacted]\n\n\n"
            "0.01.078.112 I srv    operator(): chat format: peg-native"),
       )),
    _r("grammar_error", "the grammar a failed sampler printed", b"error initializing grammar sampler for grammar:",
       rb"(?P<head>error initializing grammar sampler for grammar:)(?P<text>.*)", _text, follow=TEXT,
       examples=(
           ('0.01.040.759 E common_sampler_init: error initializing grammar sampler for grammar:\n'
            'root ::= "assistant:" space space ("```json" space response-format space "```")\n\n\n'
            "Generation prompt:\n'assistant:'\n"
            "0.01.040.836 E srv    send_error: task id = 13, error: Failed to initialize samplers: std::exception",
            "0.01.040.759 E common_sampler_init: error initializing grammar sampler for grammar:\n\n\n\n\n\n"
            "0.01.040.836 E srv    send_error: task id = 13, error: Failed to initialize samplers: std::exception"),
       )),
    _r("converted_grammar", "a grammar converted from a request", b"Converted grammar: ",
       rb"(?P<head>Converted grammar: )(?P<text>.*)", _text, follow=TEXT,
       # examples: built to b11434's format string `srv  %12.*s: Converted grammar: %s`
       examples=(('srv    operator(): Converted grammar: root ::= "quokka"',
                  "srv    operator(): Converted grammar: [redacted]"),)),
    _r("json_schema", "a request's JSON schema", b"JSON schema: ", rb"(?P<head>JSON schema: )(?P<text>.*)", _text,
       follow=TEXT,
       # examples: built to b11434's format string `srv  %12.*s: JSON schema: %s`
       examples=(('srv    operator(): JSON schema: {"properties":{"wibblefrost":{"type":"string"}}}',
                  "srv    operator(): JSON schema: [redacted]"),)),
    _r("chat_parser", "the chat parser built for a request (its schema and tools)", b"generated parser:",
       rb"(?P<head>generated parser:)(?P<text>.*)", _text, follow=TEXT,
       examples=(
           ("0.01.038.593 D common_chat_templates_apply_jinja: generated parser:\n"
            "Sequence(Literal(assistant:), Space, Epsilon, Space, Choice(Sequence(Literal(```json), Space)))\n\n"
            "parser generation prompt: assistant:\n"
            "0.01.038.710 I srv  server_strea: conv_id= (empty=1)",
            "0.01.038.593 D common_chat_templates_apply_jinja: generated parser:\n\n\n\n"
            "0.01.038.710 I srv  server_strea: conv_id= (empty=1)"),
       )),
    # ---- JSON: request and response bodies, streamed chunks, `Parsed message`, the slot's launch JSON
    _r("json_text", "text in request and response JSON (messages, answers, prompts)", b'"',
       rb'(?P<key>"(?:' + _TEXT_KEYS + rb')")(?P<sep>\s*:\s*)(?P<value>' + _JSON_STRING + rb")", _json_string,
       every=True,
       examples=(
           ('0.04.116.850 D Parsed message: {"role":"assistant","content":"frobnicatrix\\n"}',
            '0.04.116.850 D Parsed message: {"role":"assistant","content":"[redacted]"}'),
           ('0.02.210.399 D srv    operator(): http: streamed chunk: data: {"choices":[{"finish_reason":null,"index":0,'
            '"delta":{"content":" not"}}],"created":1796163323,"object":"chat.completion.chunk"}',
            '0.02.210.399 D srv    operator(): http: streamed chunk: data: {"choices":[{"finish_reason":null,"index":0,'
            '"delta":{"content":"[redacted]"}}],"created":1796163323,"object":"chat.completion.chunk"}'),
           ('0.00.932.625 D slot launch_slot_: id  0 | task -1 | launching slot : {"id":0,"n_ctx":512,'
            '"n_prompt_tokens":82,"params":{"grammar":"","generation_prompt":"assistant:"},'
            '"prompt":"<s> user: Zorblaxian quokkafied marmalisation glimmerwhisk\\nassistant:","generated":""}',
            '0.00.932.625 D slot launch_slot_: id  0 | task -1 | launching slot : {"id":0,"n_ctx":512,'
            '"n_prompt_tokens":82,"params":{"grammar":"","generation_prompt":"assistant:"},'
            '"prompt":"[redacted]","generated":""}'),
       )),
    _r("json_tokens", "token ids and bytes in response JSON, and stop words", b'"',
       rb'(?P<key>"(?:' + _TOKEN_KEYS + rb')")(?P<sep>\s*:\s*)\[(?P<items>(?:[^\[\]"]|"(?:[^"\\]|\\.)*")*)\]',
       _json_array, every=True,
       examples=(
           ('0.04.546.509 D srv    operator(): http: streamed chunk: data: {"index":0,"content":" b","tokens":[264],'
            '"stop":false,"tokens_predicted":1,"completion_probabilities":[{"id":264,"token":" b","bytes":[32,98],'
            '"logprob":-0.6717595458030701}]}',
            '0.04.546.509 D srv    operator(): http: streamed chunk: data: {"index":0,"content":"[redacted]",'
            '"tokens":[],"stop":false,"tokens_predicted":1,"completion_probabilities":[{"id":0,"token":"[redacted]",'
            '"bytes":[],"logprob":-0.6717595458030701}]}'),
       )),
    _r("json_token_id", "token ids in log-probability JSON", b'"token"',
       rb'(?P<head>"id"\s*:\s*)' + _INT + rb'(?P<tail>\s*,\s*"token")', _zero, every=True,
       examples=(
           ('0.04.546.509 D srv    operator(): http: streamed chunk: data: {"top_logprobs":[{"id":115,"token":"o",'
            '"logprob":-2.5799720287323}]}',
            '0.04.546.509 D srv    operator(): http: streamed chunk: data: {"top_logprobs":[{"id":0,'
            '"token":"[redacted]","logprob":-2.5799720287323}]}'),
       )),
)
BY_NAME = {r.name: r for r in RULES}
_LINE_RULES = tuple(r for r in RULES if not r.every)
_EVERY_RULES = tuple(r for r in RULES if r.every)
# One search for every anchor: most lines of a debug log hold none, and skip the table at that cost
_ANY_ANCHOR = re.compile(b"|".join(re.escape(a) for a in sorted({r.anchor for r in RULES}, key=len, reverse=True)))

# Where free text that followed a message ends: the next log line (llama.cpp's prefix, a server component
# or a function name before its message, a date).
_LOG_LINE = re.compile(
    rb"(?:\x1b\[[0-9;]*[mK])*(?:\d+\.\d\d\.\d{3}\.\d{3} |[IWED] \S|(?:slot|srv|que|res|spec|cmn) +\S+: |"
    rb"[A-Za-z_]\w*: |\d{4}-\d\d-\d\d[ T]\d\d:\d\d)"
)


@dataclass(slots=True)
class RedactSummary:
    """What a redaction did: lines read, lines changed, and per rule the lines it changed."""

    lines: int = 0
    changed: int = 0
    cut: int = 0  # lines longer than the reader reads (MAX_LINE), cut there as the reader cuts them
    removed: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "lines": self.lines,
            "changed_lines": self.changed,
            "cut_lines": self.cut,
            "removed": {name: {"lines": n, "what": BY_NAME[name].what} for name, n in self.removed.items()},
        }


class Redactor:
    """Bytes in, bytes out: `feed` as often as you like, then `close`. Whole lines come out (the last one
    once `close` says the input ended); line breaks (LF, CRLF) and every line the rules leave are kept
    byte for byte."""

    def __init__(self) -> None:
        self.summary = RedactSummary()
        self._carry = b""
        self._overlong = False
        self._follow: Rule | None = None
        self._followed = 0

    def feed(self, data: bytes) -> bytes:
        cut = data.rfind(b"\n")
        if cut < 0:
            self._keep(data)
            return b""
        head, tail = data[: cut + 1], data[cut + 1 :]
        if self._overlong:
            head = head[head.find(b"\n") :]  # the rest of a cut line goes, its line break stays
            self._overlong = False
        block, self._carry = self._carry + head, b""
        out = self._block(block)
        self._keep(tail)
        return out

    def _block(self, block: bytes) -> bytes:
        """Whole lines: those holding no rule's anchor (most of a debug log) are copied as they are, in bulk."""
        out: list[bytes] = []
        pos, n = 0, len(block)
        while pos < n:
            if self._follow is None:
                m = _ANY_ANCHOR.search(block, pos)
                start = n if m is None else block.rfind(b"\n", pos, m.start()) + 1 or pos
                if start > pos:
                    self.summary.lines += block.count(b"\n", pos, start)
                    out.append(block[pos:start])
                    pos = start
                if m is None:
                    break
            end = block.index(b"\n", pos)
            out.append(self._line(block[pos:end]) + b"\n")
            pos = end + 1
        return b"".join(out)

    def close(self) -> bytes:
        """The last line, which had no line break."""
        if not self._carry:
            return b""
        line, self._carry = self._carry, b""
        return self._line(line)

    def _keep(self, data: bytes) -> None:
        if self._overlong:
            return
        self._carry += data
        if len(self._carry) > MAX_LINE:
            self._carry = self._carry[:MAX_LINE]
            self._overlong = True
            self.summary.cut += 1

    def _line(self, line: bytes) -> bytes:
        cr = line.endswith(b"\r")
        body = line[:-1] if cr else line
        out = self._redact(body)
        self.summary.lines += 1
        if out != body:
            self.summary.changed += 1
        return out + b"\r" if cr else out

    def _count(self, rule: Rule) -> None:
        self.summary.removed[rule.name] = self.summary.removed.get(rule.name, 0) + 1

    def _redact(self, body: bytes) -> bytes:
        rule = self._follow
        if rule is not None:
            out = self._continued(rule, body)
            if out is not None:
                if out != body:
                    self._count(rule)
                return out
        if _ANY_ANCHOR.search(body) is None:
            return body
        for rule in _LINE_RULES:
            if rule.anchor in body and (m := rule.regex.search(body)) is not None:
                out = body[: m.start()] + rule.replace(m) + body[m.end() :]
                if rule.follow:
                    self._follow, self._followed = rule, 0
                if out != body:
                    self._count(rule)
                return out
        for rule in _EVERY_RULES:
            if rule.anchor in body:
                out = rule.regex.sub(rule.replace, body)
                if out != body:
                    self._count(rule)
                    body = out
        return body

    def _continued(self, rule: Rule, body: bytes) -> bytes | None:
        """A line after one that opened a cut piece: its redacted text, or None when the piece has ended
        before it (the line is then redacted as any other)."""
        kind = rule.follow
        self._followed += 1
        if self._followed > FOLLOW_MAX[kind]:
            self._follow = None
            return None
        if kind == ROW:
            # as analyze/reader/walker.py reads a row: it ends at `output = `; a dump line is not part of it
            if b"output = " in body:
                self._follow = None
                at = body.rfind(b"), pos =")
                return body[at:] if at >= 0 else body
            if b"init:" in body or b"ubatch" in body:
                self._follow = None
                return None
            return b""
        if _LOG_LINE.match(body):
            self._follow = None
            return None
        if kind == QUOTE and body.endswith(b"'"):
            self._follow = None
        return b""


def redact_bytes(data: bytes) -> tuple[bytes, RedactSummary]:
    """A whole log at once (the tests' examples, small inputs)."""
    r = Redactor()
    return r.feed(data) + r.close(), r.summary


def redacted_chunks(source: Source, redactor: Redactor, chunk_size: int = 1 << 20) -> Iterator[bytes]:
    """The redacted bytes of a log (a path, `-`, a session folder, a .gz), chunk by chunk; InputError when
    it cannot be read."""
    opened = open_source(source)
    try:
        while data := opened.stream.read(chunk_size):
            if out := redactor.feed(data):
                yield out
        if out := redactor.close():
            yield out
    finally:
        opened.stream.close()


def redact_to(source: Source, out: IO[bytes]) -> RedactSummary:
    """Redact a log into an open binary stream (stdout, say)."""
    r = Redactor()
    for chunk in redacted_chunks(source, r):
        out.write(chunk)
    return r.summary


def redact_file(source: Source, dest: Path) -> RedactSummary:
    """Redact a log into `dest`, which appears whole or not at all (written beside it, then renamed)."""
    dest = Path(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            summary = redact_to(source, f)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return summary


def redact_session(folder: Path) -> RedactSummary:
    """A session's raw.log redacted into SHAREABLE beside it (raw.log is never changed); the manifest says
    which file is shareable and what was removed, and loses --ping's prompt, which is the user's text too."""
    session = Session(Path(folder))
    dest = session.path / SHAREABLE
    summary = redact_file(log_of(session.path), dest)
    record: dict[str, object] = {"log": SHAREABLE, "from": RAW_LOG, "at": now_iso(), **summary.to_dict()}
    update: dict[str, object] = {KEY_REDACTED: record}
    ping = read_manifest(session.path).get(KEY_PING_CONFIG)
    if isinstance(ping, dict) and ping.get("prompt"):
        update[KEY_PING_CONFIG] = {**ping, "prompt": PLACEHOLDER.decode()}
        record["manifest"] = [f"{KEY_PING_CONFIG}.prompt"]
    session.write_manifest(update)
    return summary


__all__ = ["PLACEHOLDER", "RULES", "RedactSummary", "Redactor", "Rule", "redact_bytes", "redact_file",
           "redact_session", "redact_to"]
