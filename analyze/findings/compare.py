"""Before/after: did a fix make the failure go away and bring the drafter back in step?

A side *fails* when its log has any failure row (position error, failed decode, no KV room, abort).
Verdicts: `fixed` (A fails, B does not), `regressed` (A does not, B does), `still_failing` (both) and
`unchanged` (neither).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from kvtrace.analyze.findings.signatures import match_signature

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult

VERDICTS = ("fixed", "regressed", "still_failing", "unchanged")
# Exit status per verdict: 0 when B is healthy and nothing got worse, 1 when B still fails or got worse.
EXIT_CODES = {"fixed": 0, "unchanged": 0, "regressed": 1, "still_failing": 1}


@dataclass(slots=True)
class Side:
    source: str
    kind: str
    signature: str
    failed: bool
    n_position_errors: int
    n_errors: int
    n_cycles: int
    drafter_in_step: bool | None
    in_step_fraction: float | None
    target_max: int | None  # the last stored max of each context in the kv table
    drafter_max: int | None
    acceptance_rate: float | None
    accepted: int | None
    generated: int | None
    mean_accepted_len: float | None
    n_verify_steps: int
    synthetic_acceptance: bool = False  # the server chose what was accepted (--spec-synth-len): not the drafter's


@dataclass(slots=True)
class Comparison:
    a: Side
    b: Side
    verdict: str
    changes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_dict(self) -> dict[str, Any]:
        return {"a": asdict(self.a), "b": asdict(self.b), "verdict": self.verdict, "changes": self.changes}


def _last_max(result: ParseResult, context: str) -> int | None:
    kv = result.kv
    rows = kv[kv["context"] == context]
    return int(rows["pos_max"].iloc[-1]) if len(rows) else None


def side(result: ParseResult, source: str) -> Side:
    v = result.verdict
    matched = match_signature(result)
    c = matched.cycles  # the signature rules read the cycle stats: they come with the match
    acc = v.acceptance or {}
    return Side(
        source=source, kind=v.kind, signature=matched.name, failed=len(result.errors) > 0,
        n_position_errors=int(v.n_position_errors), n_errors=len(result.errors), n_cycles=c.n_cycles,
        drafter_in_step=c.drafter_in_step, in_step_fraction=c.in_step_fraction,
        target_max=_last_max(result, "target"), drafter_max=_last_max(result, "drafter"),
        acceptance_rate=acc.get("rate"), accepted=acc.get("accepted"), generated=acc.get("generated"),
        mean_accepted_len=c.mean_accepted_len, n_verify_steps=c.n_verify_steps,
        synthetic_acceptance=bool(acc.get("synthetic")),
    )


def _verdict(a: Side, b: Side) -> str:
    if a.failed:
        return "still_failing" if b.failed else "fixed"
    return "regressed" if b.failed else "unchanged"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _changes(a: Side, b: Side) -> list[str]:
    out = [f"position errors: {a.n_position_errors} -> {b.n_position_errors}; "
           f"all failures: {a.n_errors} -> {b.n_errors}"]
    if a.signature != b.signature:
        out.append(f"signature: {a.signature} -> {b.signature}")
    steps = {True: "in step", False: "out of step", None: "not measurable"}
    if a.n_cycles or b.n_cycles:
        out.append(f"drafter: {steps[a.drafter_in_step]} ({_pct(a.in_step_fraction)} of {a.n_cycles} cycles) -> "
                   f"{steps[b.drafter_in_step]} ({_pct(b.in_step_fraction)} of {b.n_cycles} cycles)")
    if a.acceptance_rate is not None or b.acceptance_rate is not None:
        made_up = {True: " synthetic", False: ""}
        out.append(f"acceptance: {_pct(a.acceptance_rate)}{made_up[a.synthetic_acceptance]} "
                   f"({a.accepted}/{a.generated}) -> {_pct(b.acceptance_rate)}{made_up[b.synthetic_acceptance]} "
                   f"({b.accepted}/{b.generated})")
    if a.mean_accepted_len is not None or b.mean_accepted_len is not None:
        out.append(f"mean accepted length: {a.mean_accepted_len} -> {b.mean_accepted_len}")
    if a.n_verify_steps or b.n_verify_steps:
        out.append(f"verify steps: {a.n_verify_steps} -> {b.n_verify_steps}")
    return out


def compare(a: ParseResult, b: ParseResult, names: tuple[str, str] = ("A", "B")) -> Comparison:
    sa, sb = side(a, names[0]), side(b, names[1])
    return Comparison(sa, sb, _verdict(sa, sb), _changes(sa, sb))


HEADLINES = {
    "fixed": "fixed: A fails, B does not",
    "regressed": "regressed: A is clean, B fails",
    "still_failing": "still failing: both fail",
    "unchanged": "unchanged: neither fails",
}


def format_comparison(c: Comparison) -> str:
    lines = [f"A: {c.a.source}  ({c.a.signature})", f"B: {c.b.source}  ({c.b.signature})",
             f"verdict: {HEADLINES[c.verdict]}"]
    if c.b.drafter_in_step and c.a.drafter_in_step is False:
        lines.append("the drafter is back in step with the target in B")
    lines += [f"  {line}" for line in c.changes]
    return "\n".join(lines)
