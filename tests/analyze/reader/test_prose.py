"""Each prose regex against its own examples and counter-examples (analyze/reader/prose.py)."""

from __future__ import annotations

import re

import pytest

from kvtrace.analyze.reader import prose

CASES = [(name, text, True) for name, texts in prose.EXAMPLES.items() for text in texts]
CASES += [(name, text, False) for name, texts in prose.COUNTER_EXAMPLES.items() for text in texts]


@pytest.mark.parametrize(("name", "text", "found"), CASES)
def test_each_prose_regex_finds_its_examples_and_leaves_its_counter_examples(name: str, text: str, found: bool) -> None:
    regex = getattr(prose, name)
    assert isinstance(regex, re.Pattern)
    assert (regex.search(text) is not None) is found


def test_every_prose_regex_has_examples_and_counter_examples() -> None:
    names = {n for n, v in vars(prose).items() if isinstance(v, re.Pattern)}
    assert names == set(prose.EXAMPLES) == set(prose.COUNTER_EXAMPLES)
    assert all(prose.EXAMPLES[n] and prose.COUNTER_EXAMPLES[n] for n in names)
