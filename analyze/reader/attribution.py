"""Which context, target or drafter, a batch belongs to.

The batch dump never says. The strongest signal is the KV cache size that `find_slot` prints right after
the dump (target and drafter caches usually differ in size); the order in which contexts were created
(the target is loaded first, the drafter after a draft-model line) and which cache is larger say which size
is which. A failing batch never reaches find_slot: its caller line (`dflash: drafter decode failed`)
names the side instead. Where nothing tells, the answer is `unknown`, never a guess shown as a fact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvtrace.analyze.reader.records import CONTEXT_NAMES, Meta


@dataclass(slots=True)
class SizeMap:
    """Cache size -> (context, confidence), and how that was decided."""

    contexts: dict[int, str] = field(default_factory=dict)
    confidence: dict[int, float] = field(default_factory=dict)
    how: str = "no find_slot lines (LLAMA_KV_CACHE_DEBUG off)"

    def lookup(self, size: int) -> tuple[str, float]:
        return self.contexts.get(size, "unknown"), self.confidence.get(size, 0.0)


def map_sizes(sigs: dict[frozenset[int], int], meta: Meta, speculative: bool) -> SizeMap:
    """Decide which find_slot cache sizes belong to the target and which to the drafter."""
    out = SizeMap()
    if not sigs:
        return out
    groups = sorted(sigs, key=lambda s: sigs[s])  # in order of first appearance
    if len(groups) == 1:
        (group,) = groups
        if speculative:
            out.how = "one cache size for every batch although a drafter is in use: sizes cannot tell them apart"
            return out
        for size in group:
            out.contexts[size], out.confidence[size] = "target", 0.95
        out.how = "a single context (no speculative decoding seen)"
        return out
    # the target's cache is the largest; check against the order in which caches were created
    by_size = sorted(groups, key=lambda g: max(g), reverse=True)
    target = by_size[0]
    created = [c["size"] for c in meta.get("contexts", []) if c["kind"] == "kv_cache"] or [
        c["size"] for c in meta.get("contexts", []) if c["kind"] == "context"
    ]
    first = next((g for size in created for g in groups if size in g), None)
    if first is None:
        conf, out.how = 0.9, "the largest KV cache is the target's (no context-creation lines to confirm)"
    elif first == target:
        conf, out.how = 0.99, "the largest KV cache is the target's, and it was created first"
    else:
        target, conf = first, 0.75
        out.how = "the first KV cache created is the target's, although it is not the largest"
    for g in groups:
        ctx = "target" if g == target else "drafter"
        for size in g:
            if size not in out.contexts:
                out.contexts[size], out.confidence[size] = ctx, conf
    return out


def attribute_batches(
    sig: np.ndarray, hint: np.ndarray, buf: np.ndarray, buf_request: list[int],
    sig_context: dict[int, tuple[str, float]], speculative: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Context and confidence for every batch row.

    1. find_slot's cache size, where the batch reached find_slot;
    2. the caller's batch buffer: each caller reuses its own llama_batch, so batches that share the input
       batch's `pos` pointer share a context; a buffer takes the context its sized batches agree on;
    3. without find_slot at all, a buffer is named by the caller and slot lines around its batches (a failing
       draft's `dflash: drafter decode failed`, a slot's new prompt), and, within one request, the one other
       buffer of a speculative run by elimination.
    """
    n = len(sig)
    context = np.full(n, "unknown", dtype=object)
    confidence = np.zeros(n)
    for idx, (ctx, conf) in sig_context.items():
        sel = sig == idx
        context[sel] = ctx
        confidence[sel] = conf
    named: dict[int, tuple[str, float]] = {}
    for b in np.unique(buf[buf >= 0]):
        rows = (buf == b) & (confidence > 0)
        if rows.any():
            values, counts = np.unique(context[rows], return_counts=True)
            share = counts.max() / counts.sum()
            if share >= 0.95:
                named[int(b)] = (str(values[counts.argmax()]), float(confidence[rows].min()) * 0.95 * share)
    if not sig_context:
        for b in np.unique(buf[buf >= 0]):
            hints = hint[(buf == b) & (hint > 0)]
            if len(hints) and (hints == hints[0]).all():
                named[int(b)] = (CONTEXT_NAMES[int(hints[0])], 0.8)
        by_request: dict[int, list[int]] = {}
        for b in np.unique(buf[buf >= 0]):
            by_request.setdefault(buf_request[int(b)], []).append(int(b))
        for buffers in by_request.values():
            unnamed = [b for b in buffers if b not in named]
            sides = {named[b][0] for b in buffers if b in named}
            if speculative and len(unnamed) == 1 and len(sides) == 1:
                # two contexts in this request and one side named: the other buffer is the other side
                named[unnamed[0]] = ("drafter" if sides == {"target"} else "target", 0.7)
    todo = confidence == 0
    for b, (ctx, conf) in named.items():
        sel = todo & (buf == b)
        context[sel] = ctx
        confidence[sel] = conf
    # what is still unknown: a caller line named the side of this very batch
    left = (confidence == 0) & (hint > 0)
    if left.any():
        context[left] = [CONTEXT_NAMES[int(h)] for h in hint[left]]
        confidence[left] = 0.9
    return context, confidence


def no_drafter(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n-gram self-speculation: there is no drafter context, so every one of the n batches is the target's."""
    return np.full(n, "target", dtype=object), np.full(n, 0.99)


def kv_through_batches(kv_line: np.ndarray, kv_context: np.ndarray, batch_line: np.ndarray,
                       batch_context: np.ndarray) -> np.ndarray:
    """A find_slot row whose cache size does not tell takes the context of the batch it places.

    llama.cpp prints find_slot while placing the ubatches of the input batch dumped just before it, so the
    latest batch dump above a find_slot line is the batch it places (every ubatch of a split prompt too).
    """
    out = kv_context.copy()
    todo = np.flatnonzero(out == "unknown")
    if not todo.size or not batch_line.size:
        return out
    order = np.argsort(batch_line, kind="stable")
    lines, ctx = batch_line[order], batch_context[order]
    at = np.searchsorted(lines, kv_line[todo], side="right") - 1
    ok = at >= 0
    out[todo[ok]] = ctx[at[ok]]
    return out


# A backtrace frame in one of these functions puts an abort on the draft side: the speculative code and the
# draft context's own entry points (the rule: an assert whose backtrace runs through them).
DRAFTER_FRAMES = ("common_speculative", "speculative_impl", "draft", "dflash", "_mtp", "eagle")


def frame_side(fn: str) -> str:
    """`drafter` when a backtrace frame's function is on the speculative/draft path, else `unknown`."""
    low = fn.lower()
    return "drafter" if any(k in low for k in DRAFTER_FRAMES) else "unknown"


def caller_side(prefix: str) -> str:
    """The side named by the function that printed a failure line: the last `name:` before the message
    (`common_speculative_impl_draft_eagle3: draft n_embd ... does not match ...` is the draft side)."""
    for token in reversed(prefix.split()):
        if token.endswith(":") and len(token) > 1:
            return frame_side(token[:-1])
    return "unknown"
