"""Strings derived from a regex's own parse tree: a short line it matches (`sample`), and the openings a stranger's
paste can repeat to make it slow (`openings`). The tests build their inputs from the rule tables with these, so a
rule added tomorrow is covered without a test written for it."""

from __future__ import annotations

import importlib
import pkgutil
import re
import re._constants as C  # noqa: PLC2701 - the parse tree's opcodes
import re._parser as P  # noqa: PLC2701 - the parse tree itself
from dataclasses import fields, is_dataclass
from typing import Any

_CANDIDATES = " xa1_-.:(/=,'\"AZ0#"


def _one(item: tuple[Any, Any]) -> str:
    """One character the single-character item (`IN`, `ANY`, `NOT_LITERAL`, `CATEGORY`) matches."""
    sub = P.SubPattern(P.State(), [item])
    rx = re.compile(_source_of(sub))
    return next((c for c in _CANDIDATES if rx.fullmatch(c)), "x")


def _source_of(sub: P.SubPattern) -> str:
    """A tiny regex for one single-character item, to test candidates against (the parse tree has no printer)."""
    op, av = sub.data[0]
    if op is C.ANY:
        return "."
    if op is C.NOT_LITERAL:
        return f"[^{re.escape(chr(av))}]"
    if op is C.CATEGORY:
        return _CATEGORY.get(av, ".")
    parts, neg = [], False
    for o, a in av:
        if o is C.NEGATE:
            neg = True
        elif o is C.LITERAL:
            parts.append(re.escape(chr(a)))
        elif o is C.RANGE:
            parts.append(f"{re.escape(chr(a[0]))}-{re.escape(chr(a[1]))}")
        elif o is C.CATEGORY:
            parts.append(_CATEGORY.get(a, ""))
    return f"[{'^' if neg else ''}{''.join(parts)}]"


_CATEGORY = {C.CATEGORY_DIGIT: r"\d", C.CATEGORY_NOT_DIGIT: r"\D", C.CATEGORY_SPACE: r"\s",
             C.CATEGORY_NOT_SPACE: r"\S", C.CATEGORY_WORD: r"\w", C.CATEGORY_NOT_WORD: r"\W"}
_REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT)


def _gen(items: Any, branch: int = 0) -> str:
    out = []
    for op, av in items:
        if op is C.LITERAL:
            out.append(chr(av))
        elif op in (C.ANY, C.NOT_LITERAL, C.IN, C.CATEGORY):
            out.append(_one((op, av)))
        elif op in _REPEATS:
            lo, _, sub = av
            out.append(_gen(sub, branch) * lo)
        elif op is C.SUBPATTERN:
            out.append(_gen(av[3], branch))
        elif op is C.ATOMIC_GROUP:
            out.append(_gen(av, branch))
        elif op is C.BRANCH:
            alts = av[1]
            out.append(_gen(alts[min(branch, len(alts) - 1)], branch))
        # AT (anchors), ASSERT, ASSERT_NOT, GROUPREF: no characters
    return "".join(out)


def _tree(rx: re.Pattern[str]) -> Any:
    return P.parse(rx.pattern, rx.flags & ~re.UNICODE)


def branches(rx: re.Pattern[str]) -> list[Any]:
    """The top-level alternatives of a regex (itself alone when it has none), each a parse (sub)tree; an
    alternative wrapped in a non-capturing group (`(?:a)|(?:b)`) is unwrapped."""
    items = list(_tree(rx))
    alts = items[0][1][1] if len(items) == 1 and items[0][0] is C.BRANCH else [items]
    out = []
    for alt in alts:
        alt = list(alt)
        while len(alt) == 1 and alt[0][0] is C.SUBPATTERN and alt[0][1][0] is None:
            alt = list(alt[0][1][3])
        out.append(alt)
    return out


def samples(items: Any) -> list[str]:
    """Short strings the (sub)tree may match, taking the first, second, ... alternative of each choice (the
    generator does not honour look-arounds or word boundaries: a caller checks what it got)."""
    return list(dict.fromkeys(_gen(items, b) for b in range(4)))


def source(items: Any, flags: int) -> re.Pattern[str]:
    """A parse (sub)tree compiled back into a regex of its own."""
    return re.compile(_print(items), flags)


def _print(items: Any) -> str:
    out = []
    for op, av in items:
        if op is C.LITERAL:
            out.append(re.escape(chr(av)))
        elif op in (C.ANY, C.NOT_LITERAL, C.IN, C.CATEGORY):
            out.append(_source_of(P.SubPattern(P.State(), [(op, av)])))
        elif op in _REPEATS:
            lo, hi, sub = av
            q = {C.MAX_REPEAT: "", C.MIN_REPEAT: "?", C.POSSESSIVE_REPEAT: "+"}[op]
            out.append(f"(?:{_print(sub)}){{{lo},{'' if hi is C.MAXREPEAT else hi}}}{q}")
        elif op is C.SUBPATTERN:
            out.append(f"(?:{_print(av[3])})")
        elif op is C.ATOMIC_GROUP:
            out.append(f"(?>{_print(av)})")
        elif op is C.BRANCH:
            out.append("(?:" + "|".join(_print(a) for a in av[1]) + ")")
        elif op is C.AT:
            out.append({C.AT_BEGINNING: "^", C.AT_END: "$", C.AT_BOUNDARY: r"\b",
                        C.AT_NON_BOUNDARY: r"\B", C.AT_BEGINNING_STRING: r"\A", C.AT_END_STRING: r"\Z"}.get(av, ""))
        elif op in (C.ASSERT, C.ASSERT_NOT):
            direction, sub = av
            out.append(f"(?{'<' if direction < 0 else ''}{'=' if op is C.ASSERT else '!'}{_print(sub)})")
    return "".join(out)


def openings(rx: re.Pattern[str]) -> list[str]:
    """The starts a paste can repeat to make a searched regex slow, for each top-level alternative: its text up to
    its first unbounded repetition, that with one repeated character more, and its whole sample less its last
    character."""
    found: list[str] = []
    for alt in branches(rx):
        head: list[Any] = []
        for op, av in alt:
            if op in _REPEATS and av[1] is C.MAXREPEAT:
                found += [_gen(head), _gen(head) + _gen(av[2])]
                break
            if op in (C.SUBPATTERN, C.BRANCH) and _unbounded(av):
                found += [_gen(head), _gen(head) + _gen([(op, av)])]
                break
            head.append((op, av))
        whole = _gen(alt)
        found.append(whole[:-1])
    return [o for o in dict.fromkeys(found) if o.strip()]


def _unbounded(av: Any) -> bool:
    return "MAXREPEAT" in repr(av)  # a group that holds an unbounded repetition somewhere inside


def project_regexes(*packages: str) -> dict[str, re.Pattern[str]]:
    """Every compiled regex the project's modules hold, by where: module globals, and inside their tuples, lists,
    dicts and dataclass records (the rule tables)."""
    found: dict[str, re.Pattern[str]] = {}

    def walk(name: str, value: Any, depth: int) -> None:
        if isinstance(value, re.Pattern):
            if isinstance(value.pattern, str):
                found.setdefault(name, value)
        elif depth > 4:
            return
        elif isinstance(value, tuple | list):
            for i, v in enumerate(value):
                walk(f"{name}[{getattr(v, 'name', i)}]", v, depth + 1)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{name}[{k}]", v, depth + 1)
        elif is_dataclass(value) and not isinstance(value, type):
            for f in fields(value):
                walk(f"{name}.{f.name}", getattr(value, f.name), depth + 1)

    for package in packages:
        pkg = importlib.import_module(package)
        for info in pkgutil.walk_packages(pkg.__path__, package + "."):
            if info.name.rsplit(".", 1)[-1] in ("app", "__main__") or ".dashboard" in info.name:
                continue  # pages run on import; the dashboard's own regexes are below it in the reader
            mod = importlib.import_module(info.name)
            for attr, value in vars(mod).items():
                walk(f"{info.name}.{attr}", value, 0)
    seen: set[int] = set()
    return {k: v for k, v in found.items() if not (id(v) in seen or seen.add(id(v)))}  # type: ignore[func-returns-value]
