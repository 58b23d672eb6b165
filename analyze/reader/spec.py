"""Which speculative type a log ran, and how that type keeps the drafter's KV cache.

"In step" and "divergence" depend on it (field measurements on a real llama-server b11434):
- mirror (DFlash, EAGLE3, MTP): the drafter's cache mirrors the target's: after each verification the
  drafter's stored max equals the target's (the DFlash invariant); while drafting it is ahead by one block;
- own (draft-simple, a standalone draft model): the drafter keeps its own cache. It runs ahead of the target
  by up to the draft size while drafting, and after a new request it keeps its old cache until its next
  draft trims it: neither is a divergence, so the two are compared only when the drafter decodes;
- none (n-gram self-speculation, or no type chosen at all): there is no drafter context that decodes; every
  batch is the target's and "in step" does not apply.
An unnamed type (a fork's log, a paste without the start-up lines) is judged as mirror: the invariant every
DFlash fork is held to.
"""

from __future__ import annotations

from kvtrace.analyze.reader.records import Meta

MIRROR, OWN, NONE = "mirror", "own", "none"

# the words that name a drafter, in a function's name, a line or a report (`common_speculative_impl_draft_eagle3`,
# `dflash: drafter decode failed`, `MTP active`): one list for every module that asks whether a text is the draft's
DRAFTER_NAMES: tuple[str, ...] = ("draft", "mtp", "eagle", "dflash", "dspark", "medusa")
# upstream names its drafter types `draft-*` (draft-simple, draft-dflash, draft-eagle3, draft-mtp); a fork names its
# own bare (beellama.cpp's `dflash`): the prefix tells upstream's implementation from a fork's
UPSTREAM_PREFIX = "draft-"

# llama.cpp's own names (`--spec-type`, common/speculative.cpp's name map) for the types forks and older builds
# spell their own way: beellama.cpp's `dflash`, an older upstream's `draft`; every output says a type by these, so
# a `GROUP BY spec_type` counts one type once
LLAMA_NAMES = {
    "dflash": "draft-dflash", "dspark": "draft-dspark", "eagle3": "draft-eagle3", "eagle": "draft-eagle3",
    "mtp": "draft-mtp", "draft": "draft-simple", "draft-model": "draft-simple",
}

# how each type keeps the drafter's KV (by llama.cpp's name)
_KEEPING = {
    "draft-simple": OWN, "draft-dflash": MIRROR, "draft-dspark": MIRROR, "draft-eagle3": MIRROR,
    "draft-mtp": MIRROR, "draft-mtp-adaptive": MIRROR,
}


NO_TYPE = "none"  # the server chose no speculative type (`no implementations specified ...`): nothing drafts


def logged_type(meta: Meta) -> str:
    """The speculative implementation the log names (its first), else `none` where the server said it chose none
    (whatever `--spec-type` asked: a drafter type without its draft context is skipped), else the `--spec-type`
    flag, else ""."""
    impls = [str(i) for i in meta.get("spec_impls") or []]
    if impls:  # several (`--spec-type draft-simple,ngram-mod`): the one with a drafter context decides
        return next((i for i in impls if not i.startswith("ngram")), impls[0])
    if meta.get("spec_none"):
        return NO_TYPE
    flag = (meta.get("flags") or {}).get("--spec-type")
    return str(flag) if isinstance(flag, str) else ""


def llama_name(spec: str) -> str:
    """A speculative type's name as llama.cpp spells it (`dflash` -> `draft-dflash`); unknown names as they are."""
    return LLAMA_NAMES.get(spec.strip().lower(), spec.strip())


def spec_type(meta: Meta, *, dflash_lines: bool = False) -> str:
    """The speculative type the log ran, in llama.cpp's names; "" where nothing names it, or `draft-dflash` when
    `dflash_lines` (a DFlash fork's own lines are in the log, and no start-up line named the type)."""
    return llama_name(logged_type(meta) or ("dflash" if dflash_lines else ""))


def upstream_drafter(meta: Meta) -> bool:
    """Whether the log ran one of upstream's drafter types (`draft-dflash`, not a fork's `dflash`): upstream
    injects the target's hidden states into the drafter as embedding batches and drafts token by token."""
    return logged_type(meta).startswith(UPSTREAM_PREFIX)


def drafter_kv(spec: str) -> str:
    """mirror, own or none (see the module's docstring); mirror when the type is not named."""
    if spec.startswith("ngram") or spec == NO_TYPE:
        return NONE
    return _KEEPING.get(llama_name(spec), MIRROR)


def keeping(meta: Meta) -> str:
    """How the drafter of this log keeps its KV: meta's own answer, else worked out from its lines."""
    value = meta.get("drafter_kv")
    return str(value) if value in (MIRROR, OWN, NONE) else drafter_kv(spec_type(meta))
