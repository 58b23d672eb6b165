"""The module that knows speculative types (analyze/reader/spec.py) is the one home of the drafter's names and of
upstream's `draft-` prefix rule: the modules that ask "is this the draft side?" read them from there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kvtrace.analyze.reader import attribution, concepts, prose, spec

ROOT = Path(__file__).resolve().parents[3]
# the modules that held a list of their own (issue 35): the walker, the concepts, the attribution, the tables,
# the positions, and the prose regexes that left the walker
READERS = ["analyze/reader/walker.py", "analyze/reader/concepts.py", "analyze/reader/attribution.py",
           "analyze/reader/tables.py", "analyze/findings/positions.py", "analyze/reader/prose.py"]
NAMES = [n for n in spec.DRAFTER_NAMES if n != "draft"]  # `draft` alone is a common word


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module's code (docstrings left out), and its literal lists of strings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.FunctionDef | ast.ClassDef) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = [(n.lineno, n.value) for n in ast.walk(tree)
           if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]
    # a tuple, list or set of words is one list: `("draft", "dflash", "_mtp")` (not a tuple of example sentences)
    out += [(n.lineno, "|".join(e.value for e in n.elts)) for n in ast.walk(tree)
            if isinstance(n, ast.Tuple | ast.List | ast.Set) and n.elts
            and all(isinstance(e, ast.Constant) and isinstance(e.value, str) and " " not in e.value for e in n.elts)]
    return out


@pytest.mark.parametrize("module", READERS)
def test_no_other_module_spells_the_drafter_names_or_the_prefix(module: str) -> None:
    found = []
    for line, text in _code_strings(ROOT / module):
        named = {n for n in NAMES if re.search(rf"(?i)\b{n}", text)}
        if len(named) >= 2 or text == spec.UPSTREAM_PREFIX:
            found.append((line, text))
    assert found == []


def test_the_readers_take_the_list_from_spec() -> None:
    assert set(spec.DRAFTER_NAMES) <= set(attribution.DRAFTER_FRAMES)
    for name in spec.DRAFTER_NAMES:
        assert attribution.frame_side(f"common_{name}_step") == "drafter"
        assert concepts.side_of(f"Error: {name.upper()} decode failed") == "drafter"
    for name in NAMES:
        assert prose.DRAFTER_NAMED.search(f"{name} active, 10/20 accepted") is not None


@pytest.mark.parametrize(("meta", "upstream"), [
    ({"spec_impls": ["draft-dflash"]}, True),
    ({"spec_impls": ["dflash"]}, False),  # beellama.cpp's own DFlash
    ({"spec_impls": ["draft-simple", "ngram-mod"]}, True),
    ({"flags": {"--spec-type": "draft-eagle3"}}, True),
    ({"flags": {"--spec-type": "mtp"}}, False),
    ({}, False),
])
def test_the_prefix_rule_tells_upstream_s_drafter_from_a_fork_s(meta: dict[str, object], upstream: bool) -> None:
    assert spec.upstream_drafter(meta) is upstream
