"""No alternative of a failure concept (analyze/reader/concepts.py) is shadowed by a pattern table entry: the walker
asks the concepts only about lines no table entry read, so an alternative whose every line the table reads first
could never match. Each alternative must reach at least one line of its own: a string built from its own parse
tree, or one of its concept's examples."""

from __future__ import annotations

import pytest

from kvtrace.analyze.reader import walker
from kvtrace.analyze.reader.concepts import CONCEPTS, Concept
from tests.analyze.regex_samples import branches, samples, source

ALTERNATIVES = [pytest.param(c, i, id=f"{c.name}-{i}") for c in CONCEPTS for i in range(len(branches(c.regex)))]


def _table_reads(line: str) -> bool:
    hit = walker._first(line)  # noqa: SLF001 - the walker's own lookup, the one that runs before the concepts
    return hit is not None and hit[0].family != "generic"


@pytest.mark.parametrize(("concept", "index"), ALTERNATIVES)
def test_every_concept_alternative_reaches_a_line_the_table_leaves_to_it(concept: Concept, index: int) -> None:
    tree = branches(concept.regex)[index]
    alone = source(tree, concept.regex.flags)
    lines = [s for s in samples(tree) + list(concept.examples) if alone.search(s)]
    assert lines, "neither its samples nor its concept's examples reach this alternative: add an example"
    assert not all(_table_reads(s) for s in lines), f"shadowed: the table reads every line it matches ({lines})"
