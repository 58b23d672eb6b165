"""Which context, target or drafter, a batch belongs to.

The batch dump never says. The strongest signal is the KV cache size that `find_slot` prints right after
the dump (target and drafter caches usually differ in size); the order in which contexts were created
(the target is loaded first, the drafter after a draft-model line) and which cache is larger say which size
is which. A failing batch never reaches find_slot: its caller line (`dflash: drafter decode failed`)
names the side instead. Where nothing tells, the answer is `unknown`, never a guess shown as a fact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class SizeMap:
    """Cache size -> (context, confidence), and how that was decided."""

    contexts: dict[int, str] = field(default_factory=dict)
    confidence: dict[int, float] = field(default_factory=dict)
    how: str = "no find_slot lines (LLAMA_KV_CACHE_DEBUG off)"

    def lookup(self, size: int) -> tuple[str, float]:
        return self.contexts.get(size, "unknown"), self.confidence.get(size, 0.0)


def map_sizes(sigs: dict[frozenset[int], int], meta: dict[str, Any], speculative: bool) -> SizeMap:
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
