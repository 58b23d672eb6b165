"""The pattern table (analyze/reader/patterns.py) against its own examples: every entry's anchor is in each line
it is written for, its regex matches the line, and the walker's own lookup (`walker._first`: anchor with
`in`, then the regex, in table order, through its memo) gives the line to that entry and no earlier one."""

from __future__ import annotations

import pytest

from kvtrace.analyze.reader import walker
from kvtrace.analyze.reader.patterns import BY_NAME, PATTERNS, Pattern

EXAMPLES = [pytest.param(p, line, id=f"{p.name}-{i}") for p in PATTERNS for i, line in enumerate(p.examples)]


def test_every_entry_has_examples_and_a_name_of_its_own() -> None:
    assert [p.name for p in PATTERNS if not p.examples] == []
    names = [p.name for p in PATTERNS]
    assert len(names) == len(set(names)) == len(BY_NAME)
    assert all(len(p.examples) == len(set(p.examples)) for p in PATTERNS)


@pytest.mark.parametrize(("entry", "line"), EXAMPLES)
def test_the_anchor_is_in_the_example(entry: Pattern, line: str) -> None:
    assert entry.anchor in line


@pytest.mark.parametrize(("entry", "line"), EXAMPLES)
def test_the_regex_matches_the_example(entry: Pattern, line: str) -> None:
    assert entry.regex.search(line) is not None


@pytest.mark.parametrize(("entry", "line"), EXAMPLES)
def test_the_walker_gives_the_example_to_its_entry(entry: Pattern, line: str) -> None:
    hit = walker._first(line)  # noqa: SLF001 - the lookup the walker itself uses
    assert hit is not None, "no entry reads it"
    assert hit[0].name == entry.name
    assert hit[1].group(0) == entry.regex.search(line).group(0)  # type: ignore[union-attr]


def test_the_lookup_gives_the_same_entry_the_second_time() -> None:
    """Its memo (keyed by the line with every digit masked) must not hand a line to another entry."""
    for p in PATTERNS:
        for line in p.examples:
            first, again = walker._first(line), walker._first(line)  # noqa: SLF001
            assert first is not None and again is not None and first[0] is again[0] is p, line
