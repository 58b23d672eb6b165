"""What the triage bot (samples/github/kvtrace-triage.yml) does on a thread: post its one comment, edit it, or
nothing, and the comment's text.

The rule a maintainer can keep switched on:
- a verdict is posted only when a log proves it (`proof` "log" or "runtime"); a thread without one gets only
  what it is missing, once;
- kvtrace's comment is edited only when a newer log changes the verdict (its kind, signature or side): a
  later comment that changes nothing (a `--version` paste, a question) leaves the good comment as it is.

The verdict a comment stands for is written into it on a hidden line (`STATE_PREFIX`), so the next run compares
without triaging anything twice. Only a comment of the bot's own login counts as its comment.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from kvtrace.analyze.findings.signatures import match_signature
from kvtrace.analyze.views.report import (
    GITHUB_LIMIT,
    GITHUB_MARKER,
    gh_text,
    github_comment,
    linked_blocks,
    missing_blocks,
)

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult
    from kvtrace.analyze.reader.thread import Part

STATE_PREFIX = "<!-- kvtrace:state "
PROVED = frozenset({"log", "runtime"})  # the proofs a verdict is posted on
_STATE = re.compile(r"^<!-- kvtrace:state (?P<fields>[\w=. -]*) -->$", re.MULTILINE)
_UNSAFE = re.compile(r"[^\w.-]")
COMPARED = ("kind", "signature", "side")  # what "the verdict changed" means


@dataclass(slots=True)
class Reply:
    action: str  # "post", "edit" or "none"
    comment_id: int | None  # the comment to edit (action "edit"), or kvtrace's comment already there
    reason: str  # one sentence: why this action
    kind: str
    signature: str
    side: str
    proof: str | None
    body: str  # the comment to post or edit to ("" for "none")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "body"}


def _token(value: object) -> str:
    return _UNSAFE.sub("_", str(value)) or "none"


def state_line(state: dict[str, str]) -> str:
    return STATE_PREFIX + " ".join(f"{k}={_token(v)}" for k, v in state.items()) + " -->"


def read_state(body: str) -> dict[str, str] | None:
    """The verdict an earlier comment of kvtrace's stands for, or None (a comment from before it said so)."""
    m = _STATE.search(body.replace("\r\n", "\n"))
    if m is None:
        return None
    return dict(f.split("=", 1) for f in m["fields"].split() if "=" in f)


def _with_state(comment: str, state: dict[str, str]) -> str:
    """The marker first (how the bot finds its comment), the state line right after it."""
    rest = comment.removeprefix(GITHUB_MARKER).lstrip("\n")
    return f"{GITHUB_MARKER}\n{state_line(state)}\n\n{rest}"


def missing_comment(result: ParseResult) -> str:
    """The comment for a thread no log proves anything in: what it is missing, no verdict, no side, no advice."""
    v = result.verdict
    sig = match_signature(result)
    proof = v.proof
    if proof == "prose":
        why = ("The report tells of a failure only in its own words: no log line shows it, so kvtrace gives no "
               "verdict, no side and no advice yet.")
    elif v.kind == "no_log":
        why = "There is no llama.cpp log in this thread yet, so kvtrace gives no verdict."
    else:
        why = "No llama.cpp line in this thread shows a failure, so kvtrace gives no verdict yet."
    out = [GITHUB_MARKER, "### kvtrace triage: waiting for a log", gh_text(why)]
    out += missing_blocks(result, sig)
    out += linked_blocks(result)
    out.append("<sub>kvtrace comments again only when a log in the thread changes its verdict.</sub>")
    text = "\n\n".join(out) + "\n"
    return text if len(text) <= GITHUB_LIMIT else "\n\n".join(out[:3]) + "\n"


def own_comment(result: ParseResult, bot: str) -> Part | None:
    """kvtrace's comment on the thread: the first one with its marker written by the bot's login."""
    thread = result.thread
    if thread is None:
        return None
    return next((p for p in thread.own if p.author == bot and p.comment_id is not None), None)


def reply(result: ParseResult, bot: str) -> Reply:
    """What the bot does on this thread, given the comment it may have posted before (`bot`: its login)."""
    v = result.verdict
    sig = match_signature(result)
    proof = v.proof
    side = (v.component or "unknown") if len(result.errors) else "none"
    state = {"kind": v.kind, "signature": sig.name, "side": side, "proof": proof or "none"}
    mine = own_comment(result, bot)
    proved = proof in PROVED

    def make(action: str, reason: str, body: str = "") -> Reply:
        return Reply(action, mine.comment_id if mine is not None else None, reason, v.kind, sig.name, side, proof,
                     body)

    if mine is None:
        if proved:
            return make("post", "a log proves the verdict: posted", _with_state(github_comment(result), state))
        return make("post", "no log proves a verdict: posted what the report is missing, once",
                    _with_state(missing_comment(result), state))
    before = read_state(mine.text) or {}
    if not proved:
        return make("none", "no log proves a verdict: kvtrace's comment stays as it is")
    if all(before.get(k) == _token(state[k]) for k in COMPARED) and before.get("proof") in PROVED:
        return make("none", "the verdict is unchanged: kvtrace's comment stays as it is")
    return make("edit", "a log changed the verdict: kvtrace's comment edited",
                _with_state(github_comment(result), state))
