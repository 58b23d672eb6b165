"""`kvtrace replay --shrink`: the smallest part of a recording that still fails the same way.

Delta debugging (Zeller's ddmin): first the read-only requests dropped at once (a client's polls), then over the
requests (drop halves, then quarters, ... of them, keeping a smaller set whenever it still fails), then over each
remaining conversation's earlier turns (a request's messages cut by whole turns: the system messages and the last
turn stay). Whether a candidate still fails is the caller's test, run on a real server (kvtrace.analyze.cli.replay:
a replay under capture, then the failure's signature); each test is one server run, and `max_runs` bounds them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from kvtrace.capture.recording import RecordedRequest

T = TypeVar("T")
READ_ONLY = frozenset({"GET", "HEAD", "OPTIONS"})
Test = Callable[[list[RecordedRequest]], bool]


class OutOfRuns(Exception):
    """`max_runs` server runs were used: the smallest failing sequence found so far is the answer."""


@dataclass(slots=True)
class ShrinkResult:
    records: list[RecordedRequest]
    runs: int
    complete: bool  # False: max_runs ran out before nothing more could be dropped


def ddmin(items: Sequence[T], fails: Callable[[list[T]], bool]) -> list[T]:
    """The smallest sublist (1-minimal: dropping any one item more passes) for which `fails` holds, given that
    it holds for `items`. Order is kept."""
    current = list(items)
    n = 2
    while len(current) >= 2:
        size = -(-len(current) // n)
        chunks = [current[i:i + size] for i in range(0, len(current), size)]
        for chunk in chunks:
            if fails(chunk):
                current, n = chunk, 2
                break
        else:
            for i in range(len(chunks)):
                rest = [x for j, c in enumerate(chunks) if j != i for x in c]
                if fails(rest):
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(current):
                    break
                n = min(n * 2, len(current))
    return current


def turns(body: Any) -> tuple[list[int], list[list[int]]]:
    """A chat body's messages as (the leading system messages, the turns): each turn starts at a user message
    and holds what follows it up to the next one."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return [], []
    head: list[int] = []
    found: list[list[int]] = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":
            found.append([i])
        elif found:
            found[-1].append(i)
        else:
            head.append(i)
    return head, found


def with_turns(rec: RecordedRequest, keep: list[int]) -> RecordedRequest:
    """The request with only the turns `keep` (indexes into turns()) and its system messages."""
    head, all_turns = turns(rec.body)
    kept = set(head) | {i for t in keep for i in all_turns[t]}
    messages = [m for i, m in enumerate(rec.body["messages"]) if i in kept]
    shape = rec.shape
    if shape and shape.get("links"):  # a shape's links name message indexes: renumbered
        order = {old: new for new, old in enumerate(sorted(kept))}
        shape = {**shape, "links": [[order[link[0]], *link[1:]] for link in shape["links"] if link[0] in order]}
    return replace(rec, body={**rec.body, "messages": messages}, shape=shape)


def candidate_key(records: list[RecordedRequest]) -> tuple[tuple[int, int], ...]:
    """What tells two candidates apart: which requests, each with how many messages."""
    return tuple((r.id, len(r.body.get("messages") or []) if isinstance(r.body, dict) else 0) for r in records)


def shrink(records: list[RecordedRequest], fails: Test, max_runs: int) -> ShrinkResult:
    """Requests first, then turns. `fails` is never asked twice about the same candidate; the full recording is
    asked first (a recording that does not fail gives itself back, complete=True, with runs=1)."""
    runs = 0
    seen: dict[tuple[tuple[int, int], ...], bool] = {}

    def test(cands: list[RecordedRequest]) -> bool:
        nonlocal runs
        k = candidate_key(cands)
        if k not in seen:
            if runs >= max_runs:
                raise OutOfRuns
            runs += 1
            seen[k] = fails(cands)
        return seen[k]

    best = list(records)
    try:
        if not test(best):
            return ShrinkResult(best, runs, True)
        # a GET (a client's /health or /v1/models polls) changes nothing on the server: tried without them at once
        changing = [r for r in best if r.method.upper() not in READ_ONLY]
        if changing and len(changing) < len(best) and test(changing):
            best = changing

        def requests_fail(subset: list[RecordedRequest]) -> bool:
            nonlocal best
            ok = test(subset)
            if ok and len(subset) < len(best):
                best = subset
            return ok

        best = ddmin(best, requests_fail)
        for pos in range(len(best)):
            _, all_turns = turns(best[pos].body)
            if len(all_turns) < 2:
                continue
            earlier = list(range(len(all_turns) - 1))
            last = len(all_turns) - 1
            original = best[pos]

            def turns_fail(kept: list[int], pos: int = pos, original: RecordedRequest = original,
                           last: int = last) -> bool:
                nonlocal best
                cand = [*best[:pos], with_turns(original, [*kept, last]), *best[pos + 1:]]
                ok = test(cand)
                if ok:
                    best = cand
                return ok

            if turns_fail([]):
                continue
            ddmin(earlier, turns_fail)
    except OutOfRuns:
        return ShrinkResult(best, runs, False)
    return ShrinkResult(best, runs, True)


__all__ = ["OutOfRuns", "ShrinkResult", "candidate_key", "ddmin", "shrink", "turns", "with_turns"]
