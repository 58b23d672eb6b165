"""Which speculative type a log ran, and how that type keeps the drafter's KV cache.

"In step" and "divergence" depend on it (field measurements on a real llama-server b11434):
- mirror (DFlash, EAGLE3, MTP): the drafter's cache mirrors the target's: after each verification the
  drafter's stored max equals the target's (the DFlash invariant); while drafting it is ahead by one block;
- own (draft-simple, a standalone draft model): the drafter keeps its own cache. It runs ahead of the target
  by up to the draft size while drafting, and after a new request it keeps its old cache until its next
  draft trims it: neither is a divergence, so the two are compared only when the drafter decodes;
- none (n-gram self-speculation): there is no drafter context; every batch is the target's and "in step"
  does not apply.
An unnamed type (a fork's log, a paste without the start-up lines) is judged as mirror: the invariant every
DFlash fork is held to.
"""

from __future__ import annotations

from kvtrace.analyze.reader.records import Meta

MIRROR, OWN, NONE = "mirror", "own", "none"

# implementation names (`adding speculative implementation '...'`, `called impl ...`, `--spec-type`)
_KEEPING = {
    "draft-simple": OWN, "draft": OWN, "draft-model": OWN,
    "draft-dflash": MIRROR, "dflash": MIRROR, "draft-dspark": MIRROR, "draft-eagle3": MIRROR, "eagle3": MIRROR,
    "draft-mtp": MIRROR, "mtp": MIRROR, "draft-mtp-adaptive": MIRROR,
}


def spec_type(meta: Meta) -> str:
    """The speculative implementation the log names (its first), else the `--spec-type` flag, else ""."""
    impls = [str(i) for i in meta.get("spec_impls") or []]
    if impls:  # several (`--spec-type draft-simple,ngram-mod`): the one with a drafter context decides
        return next((i for i in impls if not i.startswith("ngram")), impls[0])
    flag = (meta.get("flags") or {}).get("--spec-type")
    return str(flag) if isinstance(flag, str) else ""


def drafter_kv(spec: str) -> str:
    """mirror, own or none (see the module's docstring); mirror when the type is not named."""
    if spec.startswith("ngram"):
        return NONE
    return _KEEPING.get(spec, MIRROR)


def keeping(meta: Meta) -> str:
    """How the drafter of this log keeps its KV: meta's own answer, else worked out from its lines."""
    value = meta.get("drafter_kv")
    return str(value) if value in (MIRROR, OWN, NONE) else drafter_kv(spec_type(meta))
