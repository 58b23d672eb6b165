"""What a verdict stands on: a llama.cpp line (`log`), a runtime's or wrapper's own log words (`runtime`), a
sentence of the report (`prose`), or nothing (None).

The pattern table reads llama.cpp's own lines, so a failure it read is proved by the log. The concept layer
(analyze/reader/concepts.py) also reads failures told in other words: a runtime's exception or panic, which is a
log of its own, and a reporter's sentence ("The model crashes after a few requests."), which shows nothing. A line
is a sentence when it has no log shape (no prefix, no `Label:` opening, no llama.cpp function) and reads as words;
words quoted in it (a code span, quotation marks) are the program's, and count as its log.

Quoted source code is no log at all: the walker skips a C/C++ fence (```cpp ... ```) and a statement that ends in
`;` (`GGML_ASSERT(n_tokens_all <= cparams.n_batch);`), with the functions below. Each shape has its examples,
which tests/analyze/reader/test_proof.py holds it to.

The shapes below that a line opens with are anchored at its start (`\\A`) though they are only `match`ed: a
search of one over a stranger's 1 MB line then fails at each character at once instead of rescanning the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from kvtrace.analyze.reader.concepts import recognise
from kvtrace.analyze.reader.normalize import LLAMA_PREFIX, parse_prefix

PROOFS = ("log", "runtime", "prose")  # strongest first; a verdict with no failure and no log has None
RANK = {p: i for i, p in enumerate(PROOFS)}

# ---- quoted source code ------------------------------------------------------------------------------
# C and C++ as fences name them (GitHub's linguist names and their usual aliases)
SOURCE_LANGS = frozenset({"c", "cpp", "c++", "cc", "cxx", "h", "hpp", "hxx", "cu", "cuh", "cuda", "objc",
                          "objective-c", "metal"})
_FENCE = re.compile(r"\A[ \t]{0,3}(?:>[ \t]?)*[ \t]{0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\s`]*)")
FENCE_EXAMPLES = ("```cpp", "> ```c", "~~~c++", "   ```cpp   ", "````cuda")
FENCE_COUNTER_EXAMPLES = ("```", "```console", "```text", "``` cpp-ish words", "use ```cpp fences")


def fence_of(line: str) -> tuple[tuple[str, int], str, bool] | None:
    """A Markdown fence at a line's start: (its character, its length), its info word in lower case (`cpp`, ""),
    and whether the line holds nothing else (a paste can glue log text onto a fence); None for any other line."""
    m = _FENCE.match(line)
    if m is None:
        return None
    return (m["fence"][0], len(m["fence"])), m["info"].lower(), not line[m.end():].strip()


def source_fence(line: str) -> tuple[str, int] | None:
    """The fence a line opens when it starts a C/C++ block (its character and length), else None."""
    found = fence_of(line)
    return found[0] if found is not None and found[1] in SOURCE_LANGS and found[2] else None


def closes_fence(line: str, fence: tuple[str, int]) -> bool:
    """Whether `line` closes a block opened by `fence` (the same character, at least as many, nothing after)."""
    found = fence_of(line)
    return found is not None and not found[1] and found[2] and found[0][0] == fence[0] and found[0][1] >= fence[1]


# a call (`GGML_ASSERT(`, `ctx->decode(`, `llama::abort(`) at a statement's start, behind quote and code marks
_CALL = re.compile(r"\A[\s>`*]*(?:return\s+|throw\s+)?(?:[A-Za-z_][\w:]*(?:\.|->))*[A-Za-z_][\w:]*\s*\(")
STATEMENT_MAX = 500  # characters: a quoted statement is one line of code, and a longer line is not looked into
STATEMENT_EXAMPLES = ("GGML_ASSERT(n_tokens_all <= cparams.n_batch);", "> GGML_ASSERT(dist_tgt.sorted);",
                      "`GGML_ABORT(\"fatal error\");`", "    ctx->decode(batch);  // the draft batch",
                      "return llama_decode(ctx, batch);")
STATEMENT_COUNTER_EXAMPLES = (
    "llama.cpp/src/llama-context.cpp:1010: GGML_ASSERT(n_tokens_all <= cparams.n_batch) failed",
    "decode: failed to decode, ret = -1", "GGML_ASSERT(x) failed; aborting", "0.01.002.003 E init: failed;")


def source_statement(line: str) -> bool:
    """Whether a line is a statement of quoted source code: a call that ends in `;` (a comment after it allowed)."""
    if len(line) > STATEMENT_MAX:
        return False
    text = line.rstrip().rstrip("`").rstrip()
    if not text.endswith(";"):
        cut = text.rfind("//")  # a comment after the statement
        text = text[:cut].rstrip() if cut >= 0 else ""
    return text.endswith(";") and _CALL.match(text) is not None


# ---- log, runtime or prose ---------------------------------------------------------------------------
# llama.cpp's own shape: a C function's name, then a colon (`ggml_backend_cuda_buffer_type_alloc_buffer: `)
_LLAMA_FUNC = re.compile(r"\A[a-z][a-z0-9]*_[a-z0-9_]*: ")
# a log line's opening: a label and a colon in its first two words (`Error:`, `Exception code:`, `panic:`), a
# level in brackets (`[ERROR]`), `key=value`, a stack frame (`#3 0x...`, `at Foo.Bar(`)
_LOG_OPENING = re.compile(r"\A(?:(?:\S+\s){0,2}\S*[A-Za-z)\]]:(?:\s|$)|\[[A-Za-z]+\]|\w+=\S|#\d+\s|at\s\S+\("
                          r"|(?:[A-Z][a-z]{2}\s+\d{1,2}\s+)?\d{1,2}:\d\d"  # or a time first (`9:01PM ERR`)
                          r"|\S*\.\w{1,4}:\d+:)")  # or a source file's place (`llama.cpp:18430: `)
# an error or exception class with its message anywhere in a line (`ValueError: `, `API Error: 400 {...`)
_ERROR_LABEL = re.compile(r"\b[A-Za-z]*(?:Error|Exception)(?: \d{3})?: ")
_LEAD = re.compile(r"[\s>*_~]*(?:[-+*]\s+|\d+[.)]\s+)?(?:\*\*|__)?")  # quote marks, a bullet, emphasis
_WORD = re.compile(r"\A[(\"'“]*(?P<w>[A-Za-z][a-z'’-]*)[.,;:!?)\"'”]*")
_QUOTED = re.compile(r"`[^`]*`|\"[^\"]*\"|“[^“”]*”")  # a quote stops at the next opening
PROOF_WIDTH = 2000  # characters of a line looked at: its shape is in its start, and a pasted line can be 1 MB
SENTENCE_MIN_WORDS = 4
PLAIN_SHARE = 0.7  # at least this share of a sentence's tokens are plain words
PROSE_EXAMPLES = ("The model crashes after a few requests.",
                  "Server crashes with the drafter, log attached: [server.log](https://example.org/server.log)",
                  "it crashes with no error.", "Works but randomly crashes during inference with error",
                  "- From time to time llama-server crashes during prompt-eval.")
RUNTIME_EXAMPLES = ("Error: llama runner process has terminated: signal: aborted (core dumped)",
                    "Exception code: 0xc0000005 (Access Violation)", "Process exited with code 1",
                    "ValueError: Requested tokens (516) exceed context window of 512",
                    "The specific error you're encountering is `llama_decode returned -1`.",
                    'In version 2.8.3 I am receiving "could not find a KV slot for the batch" error',
                    "panic: runtime error: invalid memory address or nil pointer dereference",
                    'llama-server crashed with a message "llama.cpp:18430: Deepseek2 does not support K-shift"',
                    '❯ Hi   ⎿  API Error: 400 {"error":"The number of tokens to keep is greater than the context')
LOG_EXAMPLES = ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 0: cudaMalloc failed: "
                "out of memory", "3.02.199.202 E llama_kv_cache_update_impl: failed to allocate compute buffers")


def line_proof(line: str) -> str:
    """`log`, `runtime` or `prose`: what one line of a failure is (see the module's doc)."""
    line = line[:PROOF_WIDTH]
    pre = parse_prefix(line)
    if pre.start > 0:  # a timestamp, a level, a journald or docker-compose column: a program's log line
        return "log" if LLAMA_PREFIX.search(line[: pre.start]) is not None else "runtime"
    text = line[_LEAD.match(line).end():].replace("**", "")  # type: ignore[union-attr]  # _LEAD matches ""
    if _LLAMA_FUNC.match(text) is not None:
        return "log"
    if _LOG_OPENING.match(text) is not None:
        return "runtime"
    if _ERROR_LABEL.search(text) is not None:
        return "runtime"
    found = recognise(text)
    for q in _QUOTED.finditer(text):
        inner = q.group(0)[1:-1].strip()
        # the failure's words quoted from the program (a code span, quotation marks), or a log line quoted whole
        if found is not None and q.start() <= found[1].start() < q.end() or (
                _LLAMA_FUNC.match(inner) is not None or _LOG_OPENING.match(inner) is not None):
            return "runtime"
    return "prose" if sentence(text) else "runtime"


def sentence(text: str) -> bool:
    """Whether a line reads as a sentence: a few words, most of them plain (not codes, numbers or identifiers),
    ending as a sentence ends or long enough to be one."""
    tokens = text.split()
    if len(tokens) < SENTENCE_MIN_WORDS:
        return False
    plain = sum(1 for t in tokens if (m := _WORD.fullmatch(t)) is not None and not _camel(m["w"]))
    ends = text.rstrip().endswith((".", "?", "!"))
    return plain >= PLAIN_SHARE * len(tokens) and (ends or len(tokens) >= 6)


# ---- a flag in a sentence ----------------------------------------------------------------------------
# a command-line flag with its value (the shape the pattern table's `flags` entry reads, any flag)
_ANY_FLAG = re.compile(r"(?<!\S)--?[A-Za-z][\w-]*(?:[ =](?:\"[^\"]*\"|[^\s\"-][^\s\"]*))?")
REMARK_MIN_WORDS = 3
REMARK_EXAMPLES = ("I also tried --parallel 2.", "llama-server crashes when I use --parallel 2.",
                   "The rerun line takes --parallel 2 from a remark in prose.",
                   "- Same with `--spec-type dflash` and a smaller --ctx-size, no change.")
REMARK_COUNTER_EXAMPLES = (
    "kvtrace capture engine --spec-type draft-dflash --fault none --requests 3 -ngl 0",
    "$ CUDA_VISIBLE_DEVICES=0 llama-server --model my model --spec-type dflash --parallel 2",
    "llama-server -m target.gguf -md draft.gguf --spec-type draft-simple --spec-synth-len 2",
    "      --spec-type dflash", "CUDA_VISIBLE_DEVICES=0 ./llama-server -m x.gguf --parallel 1 \\",
    "$ ./build/bin/llama-server --model /models/q.gguf --port 8080 --parallel 4 --kv-unified",
    "srv  main: llama-server -m t.gguf -md d.gguf --spec-type draft-simple -np 2 --kv-unified -ngl 99")


# a command's opening: a shell prompt, environment assignments, then a program (a path, or a name of the tools
# that run llama.cpp), behind at most two words of a log line's prefix (`srv  main: llama-server -m ...`)
_COMMAND = re.compile(r"\A(?:\S+\s+){0,2}?(?:[$#>]\s+)?(?:\w+=\S*\s+)*"
                      r"(?:\S*/\S*|\S*(?:llama|server|kvtrace|python|ollama)\S*)(?:\s|$)", re.IGNORECASE)


def remark(line: str) -> bool:
    """Whether the flags in a line are named in a sentence rather than given as a command: it does not open as
    a command does, and with every flag and its value taken out, what is left still reads as words (at least
    three plain ones, most of what is left)."""
    text = _LEAD.sub("", line[:PROOF_WIDTH], count=1).replace("`", " ")
    if _COMMAND.match(text.lstrip()) is not None and not text.rstrip().endswith((".", "!", "?")):
        return False  # a command (one that ends as a sentence ends is a sentence that names the program first)
    rest = _ANY_FLAG.sub(" ", text).split()
    plain = sum(1 for t in rest if (m := _WORD.fullmatch(t)) is not None and not _camel(m["w"]))
    return plain >= REMARK_MIN_WORDS and plain * 2 > len(rest)


def _camel(word: str) -> bool:
    """An identifier's word (`NoKvSlot`, `InteractiveExecutor`): capitals after its first letter."""
    return any(c.isupper() for c in word[1:])


def strongest(proofs: Iterable[str]) -> str | None:
    """The strongest of several proofs (a log line beats a runtime's words beats a sentence); None for none."""
    return min(proofs, key=RANK.__getitem__, default=None)


# ---- what each output says first ---------------------------------------------------------------------
# The one sentence every output (the text, `report`, `--format github`, the dashboard) opens with when a verdict
# stands on a sentence of the report: nothing a log printed shows the side, the cause or a fix.
PROSE_HEADLINE = "Told in prose only: no log line shows it"
PROSE_NOTE = ("Only a sentence of the report tells of this: no log line shows it, so kvtrace gives no side, no "
              "cause and no fix. Attach the server's whole log (start-up to the failure) to have it read.")


def headline_of(proof: str | None) -> str | None:
    """The words an output opens with for a verdict of this proof; None where a log shows the verdict."""
    return PROSE_HEADLINE if proof == "prose" else None
