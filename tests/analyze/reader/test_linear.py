"""Every regex the reader runs over a stranger's text is linear (issue 36, item 5): each one, searched over a 1 MB
line of repeats of its own openings (derived from its parse tree, tests/analyze/regex_samples.py, so a new rule is
covered without a test of its own), takes under a second. A 16 KB run first tells a superlinear one without
waiting minutes for it. And a whole triage of such a line (every regex of the reader together, the concept layer's
included) grows with the line as a linear reader does (the families fixed: docs/llama-cpp-lines.md#linear-time-on-any-line)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvtrace.analyze.views.triage import triage_row
from tests.analyze.regex_samples import openings, project_regexes

MB = 1 << 20
LIMIT_S = 1.0
REGEXES = {k.removeprefix("kvtrace.analyze.reader."): v for k, v in project_regexes("kvtrace.analyze.reader").items()}


def _search_s(name: str, opening: str, n: int) -> float:
    line = (opening * (n // len(opening) + 1))[:n]
    start = time.perf_counter()
    REGEXES[name].search(line)
    return time.perf_counter() - start


@pytest.mark.parametrize("name", sorted(REGEXES))
def test_a_megabyte_of_a_regex_s_own_openings_takes_under_a_second(name: str) -> None:
    for opening in openings(REGEXES[name]):
        small = _search_s(name, opening, MB // 64)
        # far over the bound at 16 KB already: superlinear (a quadratic one would take minutes at 1 MB)
        assert small * 64 < 4 * LIMIT_S, f"{opening[:40]!r} * 16 KB took {small:.3f} s: superlinear"
        big = min(_search_s(name, opening, MB) for _ in range(2))  # the better of two: a shared machine's noise
        assert big < LIMIT_S, f"{opening[:40]!r} * 1 MB took {big:.2f} s"


# One opening per family of the causes fixed (a paste of each, 1 MB on one line, was quadratic or worse somewhere in
# the reader): the line, an assert's closing glued before it, a table rule's gap that a repeated word ends
# (`.*?` bounded), a C function's name tail (`\w*`), a stem's tail, a run of digits (a count, llama.cpp's minutes), a
# name run (a service column, a key), the concept layer's stems and its many alternatives, a line-start shape (a
# command's assignments), quoted words, brackets (a list value), a lazy tag, a markdown quote, a source file's place.
FAMILY_OPENINGS = ("GGML_ASSERT(", ") failed" + "GGML_ASSERT(", "GGML_ABORT(", "failed rc=",
                   "llama_kv_cache: size = (", "restor", "1", "x", "exceedx ", "process crashex ", "x= ", "\u201c",
                   "[", "DFLASH_DBG ", "> ", "x.c")
GROWTH_MAX = 64  # 1 MB against 64 KB: a linear reader takes 16 times as long, a quadratic one 256 times


def triage_s(folder: Path, opening: str, n: int, run: int) -> float:
    """Seconds a whole triage takes of one line of `n` characters of `opening` repeated. The line ends in a word of
    its own per `run` (letters: the reader remembers lines by their text with digits masked), so no memo of an
    earlier run's line answers this one."""
    tail = " " + "".join(chr(ord("a") + int(d)) for d in str(run))
    line = (opening * (n // len(opening) + 1))[: n - len(tail)] + tail
    path = folder / "paste.log"
    path.write_text(line + "\n", encoding="utf-8")
    start = time.perf_counter()
    row = triage_row(str(path))
    took = time.perf_counter() - start
    assert not row.error
    return took


@pytest.mark.timeout(600)
@pytest.mark.parametrize("opening", FAMILY_OPENINGS)
def test_a_whole_triage_of_a_pasted_megabyte_of_one_opening_grows_linearly(tmp_path: Path, opening: str) -> None:
    """The case the issue measured: `GGML_ASSERT(` repeated took 36 s for 240 KB in the pattern table, and
    960 KB ran past 100 s; after the table's fix the concept layer still took about 12 s of a 1 MB line. The
    bound is on growth, not on seconds: 16 times the line costs a linear reader 16 times the time."""
    small = min(triage_s(tmp_path, opening, MB // 16, run) for run in range(2))  # the better of two: noise
    big = triage_s(tmp_path, opening, MB, 2)
    assert big / small < GROWTH_MAX, f"{opening!r}: 64 KB took {small:.2f} s, 1 MB {big:.2f} s"
