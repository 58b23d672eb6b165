"""The C accelerator of the walker (analyze/reader/_skim.c) against `Walker.feed`, the definition it stands in for:
the same records, counts and state after every chunk, on real captures, the corpus, lines built to the log
formats at the edges of the shapes it reads (signs, long numbers, Latin-1 whitespace, fragments, failures
open, HTML escapes) and mutated real logs."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtrace.analyze.reader import walker
from kvtrace.analyze.reader.normalize import clean_chunk, decode
from kvtrace.analyze.reader.walker import Walker

ROOT = Path(__file__).resolve().parents[3]
CAPTURES = sorted((ROOT / "tests" / "fixtures" / "scenarios").glob("*.log.gz")) + [
    ROOT / "tests" / "fixtures" / "server" / "b11434-draft-simple-2slots-head.log.gz"]
CORPUS = sorted((ROOT / "tests" / "fixtures" / "corpus").glob("*.log"))
SAMPLES = sorted((ROOT / "samples").glob("*/raw.log"))
ACCELERATOR = walker._skim  # noqa: SLF001


def _text(path: Path) -> str:
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return clean_chunk(decode(data))


@contextlib.contextmanager
def _pure() -> Iterator[None]:
    """The walker without its accelerator: every line through `feed`."""
    walker._skim = None  # noqa: SLF001
    try:
        yield
    finally:
        walker._skim = ACCELERATOR  # noqa: SLF001


def _plain(value: Any) -> Any:
    """NaN as a string (NaN != NaN) and sets sorted, so equal states compare equal."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, set | frozenset):
        return sorted(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _state(w: Walker) -> dict[str, Any]:
    """Everything a walker holds, in a form two walkers compare by."""
    out: dict[str, Any] = {}
    for name in ("batches", "kv"):
        cols = getattr(w, name)
        out[name] = {f.name: getattr(cols, f.name).tolist() for f in dataclasses.fields(cols)}
    out["failures"] = [dataclasses.asdict(f) for f in w.failures]
    out["events"] = [dataclasses.asdict(e) for e in w.events]
    out["meta"] = json.dumps(w.meta, sort_keys=True, default=repr)
    for name in ("n_lines", "n_recognised", "_dump", "_fragment", "_fields", "_seqs", "_kv_size", "_cur_rows",
                 "_cur_sizes", "_cur_found_slot", "_hint", "_seq_hint", "_batch_t", "_batch_line", "buffers",
                 "layout", "draft_seen", "_fence", "_source"):
        out[name] = getattr(w, name)
    out["_failure"] = None if w._failure is None else dataclasses.asdict(w._failure)  # noqa: SLF001
    return _plain(out)


def _walk(chunks: list[str], *, accelerated: bool) -> list[dict[str, Any]]:
    """The walker's state after each chunk, then after closing."""
    ctx = contextlib.nullcontext() if accelerated else _pure()
    with ctx:
        w = Walker()
        states = []
        for chunk in chunks:
            w.feed_text(chunk)
            states.append(_state(w))
        w.close()
        states.append(_state(w))
    return states


def _chunks(text: str, every: int) -> list[str]:
    """`text` cut into chunks of whole lines, about `every` characters each (the last may lack its break)."""
    out, start = [], 0
    while start < len(text):
        cut = text.find("\n", start + every)
        end = len(text) if cut < 0 else cut + 1
        out.append(text[start:end])
        start = end
    return out


def assert_same_walk(text: str, every: int = 1 << 16) -> None:
    assert ACCELERATOR is not None, "kvtrace.analyze.reader._skim is not built: `make setup` (pip install -e .) builds it"
    chunks = _chunks(text, every)
    fast = _walk(chunks, accelerated=True)
    slow = _walk(chunks, accelerated=False)
    for i, (a, b) in enumerate(zip(fast, slow, strict=True)):
        for key in a:
            assert a[key] == b[key], f"{key} differs after chunk {i}"


# Skipped only on a user's machine without a C compiler (the walker then reads every line itself); where there
# is a compiler, and always in CI (CI set), a missing build fails.
needs_accelerator = pytest.mark.skipif(
    ACCELERATOR is None and not (shutil.which("cc") or shutil.which("gcc")) and not os.environ.get("CI"),
    reason="no C compiler on this machine, so kvtrace.analyze.reader._skim is not built")


@needs_accelerator
def test_the_accelerator_is_built() -> None:
    assert ACCELERATOR is not None, "kvtrace.analyze.reader._skim was not built: `make setup` (pip install -e .) builds it"


@needs_accelerator
@pytest.mark.parametrize("path", CAPTURES + SAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_captures_walk_the_same(path: Path) -> None:
    assert_same_walk(_text(path))


@needs_accelerator
def test_corpus_walks_the_same() -> None:
    for path in CORPUS:
        assert_same_walk(_text(path), every=2_000)


@needs_accelerator
def test_fenced_pastes_walk_the_same() -> None:
    """Fences a paste opens and closes, quoted C/C++ source (skipped to its end, the hot lines in it too) and
    statements: the accelerator hands every fence line to the walker and reads nothing of quoted code."""
    capture = _text(CAPTURES[0]).splitlines(keepends=True)[:400]
    text = ("The server aborts here:\n\n```cpp\nGGML_ASSERT(n_tokens_all <= cparams.n_batch);\n"
            + "".join(capture[:60]) + "```\n\n> GGML_ASSERT(dist_tgt.sorted);\n\nThe log:\n```\n"
            + "".join(capture) + "Exception in thread: Decode Error -1\n```\n~~~c++\nabort();\n~~~\n"
            + "```b ash\nno pattern knows this line\n```\n")  # a fence no anchor of the table is in
    for every in (200, 2_000, 1 << 16):
        assert_same_walk(text, every)


@needs_accelerator
def test_the_accelerator_reads_most_lines_of_a_server_capture() -> None:
    """On a real capture the walker sees only the lines the accelerator leaves it (the point of it)."""
    text = _text(CAPTURES[-1])
    seen = 0
    feed = Walker.feed

    def counting(self: Walker, lines: list[str]) -> None:
        nonlocal seen
        seen += len(lines)
        feed(self, lines)

    w = Walker()
    w.feed = counting.__get__(w)  # type: ignore[method-assign]
    w.feed_text(text)
    assert w.n_lines == text.count("\n")
    assert 0 < seen < w.n_lines // 5


# lines built to docs/llama-cpp-lines.md#batch-dumps and #kv-cache-lines, at the edges of each shape
P = "0.03.079.897 D "
EDGES = [
    f"{P}init: input batch info:",
    f"{P}ubatch_print:   n_tokens     = 14",
    f"{P}ubatch_print:   n_outputs  = 2\xa0x",  # Latin-1 no-break space ends the value, as `\S` does in `re`
    f"{P}ubatch_print:   embd       = (nil)",
    f"{P}ubatch_print:   pos        = 0x55bb438e9eb0",
    f"{P}ubatch_print:\x85n_tokens = 3",  # NEL is whitespace to `re`
    f"{P}ubatch_print:   n_tokensX= 3",  # no match: the walker keeps the earlier value
    f"{P}ubatch_print:   token     = [",
    f"{P}ubatch_print:     0: id =    188 (   a\nb), pos =  132, n_seq_id =  1, seq_id = [0.], output = 1",
    f"{P}ubatch_print:     1: id =    167 (   \n",
    "continued token piece",
    "), pos =  133, n_seq_id =  1, seq_id = [0.], output = 1",
    f"{P}ubatch_print:     2: id =    1 (x", "init: not a fragment end", f"{P}ubatch_print:   ]",
    f"{P}init:   seq       = [",
    f"{P}init:     0: pos = [ -1,  138], cpl = -",
    f"{P}init:     1: pos = [ 108,  1234567890123456789012], cpl = -",  # too long for C: the walker reads it
    f"{P}init:\t2: pos = [5,6]",
    f"{P}init:   ]",
    f"{P}ubatch_add: added ubatch to split:",
    f"{P}ubatch_print:   n_tokens     = 99",
    f"{P}find_slot: stream[0], n =   132, used =   132, head =   132, size =  2048, n_swa =     0",
    f"{P}find_slot: stream[0] min[0] =     -5, max[0] =   131",
    f"{P}find_slot: stream[1] min[1] =\xa0\xa07, max[1] = 9",
    f"{P}find_slot: stream[1] min[1] = 7, max[1] =",  # cut short: not a row
    "x find_slot: stream[ find_slot: stream[2] min[0] = 1, max[0] = 2",  # the second occurrence matches
    f"{P}spec        draft:  - seq_id 1, draft candidate   0, pos   0:    233 (   0.154) '\xe9'",
    f"{P}slot handle_last_: id  1 | task 0 | generate_draft: id=18, #tokens=43, #draft=6, pos_next=43",
    f"{P}que  process_new_: processing task, id = 64",
    f"{P}que  process_new_: processing task, id = 64 &amp; more",
    "plain prose with &lt; an escape",
    "init: the tokens of sequence 0 in the input batch have inconsistent sequence positions:",
    " - the last position stored in the memory module of the context (i.e. the KV cache) for sequence 0 is X = 259",
    f"{P}find_slot: stream[0] min[0] =     0, max[0] =   259",
    f"{P}spec        draft:  - seq_id 0, draft candidate   1, pos   0:    117 (   0.125) 'r'",
    f"{P}ubatch_print:   n_tokens     = 1",
    " - the tokens for sequence 0 in the input batch have a starting position of Y = 1361",
    " it is required that the sequence positions remain consecutive: Y = X + 1",
    "decode: failed to initialize batch",
    "llama_decode: failed to decode, ret = -1",
    f"{P}que  process_new_: processing task, id = 65",
    "",
    f"{P}find_slot: stream[0] min[0] =     0, max[0] =   260",  # no batch before it: its own time
]


@needs_accelerator
@pytest.mark.parametrize("every", [1, 200, 1 << 20])
def test_lines_at_the_edges_of_each_shape(every: int) -> None:
    text = "\n".join(EDGES * 3) + "\n"
    assert_same_walk(text, every)
    assert_same_walk(text.rstrip("\n"), every)  # the last line without its break


@needs_accelerator
def test_text_outside_latin1_is_read_by_the_walker() -> None:
    """Text not from `decode` (a wider string) goes through the walker whole."""
    assert ACCELERATOR is not None
    assert ACCELERATOR.skim(Walker(), "ubatch_print: \u20ac\n", 0) == -1
    assert_same_walk("\n".join(EDGES) + "\n\u20ac ubatch_print:   n_tokens = 3\n")


def _line_pool() -> list[str]:
    lines = set(EDGES)
    for path in CAPTURES[:3] + CORPUS:
        lines.update(_text(path).split("\n")[:400])
    return sorted(lines)


POOL = _line_pool()


@st.composite
def mutated_lines(draw: st.DrawFn) -> str:
    """Runs of real and built lines, with digits, whitespace, signs and cuts changed where the C code reads."""
    out = []
    for _ in range(draw(st.integers(1, 60))):
        line = draw(st.sampled_from(POOL))
        op = draw(st.sampled_from(["keep", "keep", "digit", "space", "sign", "cut", "amp", "glue"]))
        i = draw(st.integers(0, len(line)))
        if op == "digit":
            line = line[:i] + draw(st.sampled_from(["9", "0", "12345678901234567890", ""])) + line[i + 1:]
        elif op == "space":
            line = line[:i] + draw(st.sampled_from([" ", "\t", "\xa0", "\x85", "\x1c", "  "])) + line[i:]
        elif op == "sign":
            line = line[:i] + "-" + line[i:]
        elif op == "cut":
            line = line[:i]
        elif op == "amp":
            line = line[:i] + "&amp;" + line[i:]
        elif op == "glue":
            line = line + draw(st.sampled_from(POOL))
        out.append(line)
    return "\n".join(out) + "\n"


@needs_accelerator
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_lines(), st.integers(1, 3000))
def test_mutated_lines_walk_the_same(text: str, every: int) -> None:
    assert_same_walk(text, every)
