"""The table builders: walker records -> the pandas DataFrames that everything else reads.

Columns (issue "Log reader"):
- batches: batch, line, t, context, context_confidence, seq_id, n_tokens, pos_min, pos_max, n_outputs, embd, ok
  (one row per input batch and sequence in it: almost always one row per batch)
- kv: line, t, context, cache_size, stream, seq_id, pos_min, pos_max
- errors: line, t, kind, variant, words, seq_id, last_pos, batch_start, ret, component, evidence (+ evidence_line,
  batch)
- events: line, t, kind, context, seq_id, pos, pattern, slot, task, accepted, generated, detail (JSON text: every
  field of the line, for export; what consumers read has its own column)
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from typing import TypedDict

import numpy as np
import pandas as pd

from kvtrace.analyze.reader.attribution import (
    NO_DRAFTER_HOW,
    SizeMap,
    attribute_batches,
    kv_through_batches,
    map_sizes,
    no_drafter,
)
from kvtrace.analyze.reader.devices import placement
from kvtrace.analyze.reader.jsonl import text_meta
from kvtrace.analyze.reader.mirror import mirrored_sequences
from kvtrace.analyze.reader.normalize import readable
from kvtrace.analyze.reader.records import NA, Event, Failure, Meta
from kvtrace.analyze.reader.spec import MIRROR, NO_TYPE, NONE, drafter_kv, spec_type, upstream_drafter
from kvtrace.analyze.reader.startup import split_notices
from kvtrace.analyze.reader.walker import Walker

BATCH_COLUMNS = ["batch", "line", "t", "context", "context_confidence", "seq_id", "n_tokens", "pos_min",
                 "pos_max", "n_outputs", "embd", "ok"]
KV_COLUMNS = ["line", "t", "context", "cache_size", "stream", "seq_id", "pos_min", "pos_max"]
ERROR_COLUMNS = ["line", "t", "kind", "variant", "words", "seq_id", "last_pos", "batch_start", "ret",
                 "component", "evidence", "evidence_line", "batch", "lines", "proof"]
EVENT_COLUMNS = ["line", "t", "kind", "context", "seq_id", "pos", "pattern", "slot", "task", "accepted", "generated",
                 "detail"]
CONTEXT_DTYPE = pd.CategoricalDtype(["target", "drafter", "unknown"])


def _ints(a: array[int], nullable: bool = True) -> pd.Series:
    values = np.frombuffer(a, dtype=np.int64) if len(a) else np.zeros(0, dtype=np.int64)
    if not nullable:
        return pd.Series(values.copy(), dtype="int64")
    mask = values == NA
    return pd.Series(pd.arrays.IntegerArray(values.copy(), mask))


def _floats(a: array[float]) -> pd.Series:
    return pd.Series(np.frombuffer(a, dtype=np.float64).copy() if len(a) else np.zeros(0), dtype="float64")


def is_speculative(w: Walker) -> bool:
    meta = w.meta
    return bool(w.draft_seen or meta["spec_impls"]) or any(
        e.kind in ("draft_stats", "accepted", "dflash") for e in w.events[:1000]
    ) or any(f.component == "drafter" for f in w.failures) or any(flag in meta["flags"] for flag in SPEC_FLAGS)


# a command line in the paste that asks for speculative decoding (a draft model or a speculative type)
SPEC_FLAGS = ("--spec-type", "--model-draft", "--spec-draft-model", "-md")


def build_kv(w: Walker, sizes: SizeMap) -> pd.DataFrame:
    kv = w.kv
    size = _ints(kv.cache_size, nullable=False)
    lookup = {s: sizes.lookup(s)[0] for s in set(size.tolist())}
    df = pd.DataFrame({
        "line": _ints(kv.line, nullable=False),
        "t": _floats(kv.t),
        "context": pd.Categorical(size.map(lookup).fillna("unknown"), dtype=CONTEXT_DTYPE),
        "cache_size": size,
        "stream": _ints(kv.stream, nullable=False),
        "seq_id": _ints(kv.seq_id, nullable=False),
        "pos_min": _ints(kv.pos_min, nullable=False),
        "pos_max": _ints(kv.pos_max, nullable=False),
    })
    return df


def build_batches(w: Walker, sizes: SizeMap, speculative: bool) -> pd.DataFrame:
    b = w.batches
    sig = np.frombuffer(b.sig, dtype=np.int64) if len(b) else np.zeros(0, dtype=np.int64)
    hint = np.frombuffer(b.hint, dtype=np.int8) if len(b) else np.zeros(0, dtype=np.int8)
    buf = np.frombuffer(b.buf, dtype=np.int64) if len(b) else np.zeros(0, dtype=np.int64)
    by_sig = {idx: sizes.lookup(max(group)) for group, idx in w._sigs.items()}  # noqa: SLF001
    by_sig = {idx: v for idx, v in by_sig.items() if v[1] > 0}  # sizes that do not tell are no evidence
    context, confidence = attribute_batches(sig, hint, buf, w.buffer_request, by_sig, speculative)
    embd = np.frombuffer(b.embd, dtype=np.int8) if len(b) else np.zeros(0, dtype=np.int8)
    return pd.DataFrame({
        "batch": _ints(b.batch, nullable=False),
        "line": _ints(b.line, nullable=False),
        "t": _floats(b.t),
        "context": pd.Categorical(context, dtype=CONTEXT_DTYPE),
        "context_confidence": confidence,
        "seq_id": _ints(b.seq_id),
        "n_tokens": _ints(b.n_tokens),
        "pos_min": _ints(b.pos_min),
        "pos_max": _ints(b.pos_max),
        "n_outputs": _ints(b.n_outputs),
        "embd": pd.array([None if e < 0 else bool(e) for e in embd], dtype="boolean"),
        "ok": (np.frombuffer(b.ok, dtype=np.int8) == 1) if len(b) else np.zeros(0, dtype=bool),
    })


def infer_components(w: Walker, batches: pd.DataFrame, kv: pd.DataFrame) -> None:
    """A failure no caller line explains: X is the stored max of the context being decoded, so if it
    matches what exactly one context held just before, that is the side that failed."""
    if kv.empty and batches.empty:
        return
    for f in w.failures:
        if f.component != "unknown" or f.last_pos is None:
            continue
        matches: dict[str, str] = {}
        for ctx in ("target", "drafter"):
            k = kv[(kv.context == ctx) & (kv.line < f.line)]
            ok = batches[(batches.context == ctx) & (batches.line < f.line) & batches.ok]
            if f.seq_id is not None:
                k = k[k.seq_id == f.seq_id]
                ok = ok[ok.seq_id == f.seq_id]
            if not k.empty and int(k.pos_max.iloc[-1]) == f.last_pos:
                matches[ctx] = f"find_slot line {int(k.line.iloc[-1])}: the {ctx} cache held up to X = {f.last_pos}"
            elif not ok.empty and int(ok.pos_max.iloc[-1]) == f.last_pos:
                matches[ctx] = f"batch at line {int(ok.line.iloc[-1])}: the {ctx} last wrote up to X = {f.last_pos}"
        if len(matches) == 1:
            (ctx, why), = matches.items()
            f.component, f.evidence = ctx, why


def _column(values: Sequence[object], dtype: str) -> pd.Series:
    return pd.Series(values, dtype=dtype)


def build_errors(fs: list[Failure]) -> pd.DataFrame:
    return pd.DataFrame({
        "line": _column([f.line for f in fs], "Int64"),
        "t": _column([f.t for f in fs], "float64"),
        "kind": _column([f.kind for f in fs], "string"),
        "variant": _column([f.variant for f in fs], "string"),
        "words": _column([f.words for f in fs], "string"),
        "seq_id": _column([f.seq_id for f in fs], "Int64"),
        "last_pos": _column([f.last_pos for f in fs], "Int64"),
        "batch_start": _column([f.batch_start for f in fs], "Int64"),
        "ret": _column([f.ret for f in fs], "Int64"),
        "component": _column([f.component for f in fs], "string"),
        "evidence": _column([f.evidence for f in fs], "string"),
        "evidence_line": _column([f.evidence_line for f in fs], "Int64"),
        "batch": _column([f.batch for f in fs], "Int64"),
        "lines": _column([readable(json.dumps(f.lines, ensure_ascii=False)) if f.lines else "[]" for f in fs],
                         "string"),
        "proof": _column([f.proof for f in fs], "string"),
    }, columns=ERROR_COLUMNS)


def kv_drops(kv: pd.DataFrame) -> pd.DataFrame:
    """A stored max that goes down: the cache was cleared or rolled back (seq_rm logs nothing)."""
    if kv.empty:
        return pd.DataFrame(columns=EVENT_COLUMNS)
    prev = kv.groupby(["cache_size", "stream", "seq_id"], sort=False).pos_max.shift()
    # speculative rollback drops by a few positions on every rejection; a clear goes to -1
    drop = kv[(prev.notna()) & (kv.pos_max < prev) & ((kv.pos_max < 0) | (prev - kv.pos_max > 64))]
    before = prev[drop.index]
    return pd.DataFrame({
        "line": drop.line.values,
        "t": drop.t.values,
        "kind": "kv_drop",
        "context": drop.context.astype(str).values,
        "seq_id": drop.seq_id.values,
        "pos": drop.pos_max.values,
        "pattern": "kv_drop",
        "slot": None,
        "task": None,
        "accepted": None,
        "generated": None,
        "detail": [json.dumps({"from": int(a), "to": int(b), "cache_size": int(c)})
                   for a, b, c in zip(before.values, drop.pos_max.values, drop.cache_size.values, strict=True)],
    }, columns=EVENT_COLUMNS)


def build_events(es: list[Event], kv: pd.DataFrame) -> pd.DataFrame:
    df = pd.DataFrame({
        "line": _column([e.line for e in es], "Int64"),
        "t": _column([e.t for e in es], "float64"),
        "kind": _column([e.kind for e in es], "string"),
        "context": pd.Categorical([e.context for e in es], dtype=CONTEXT_DTYPE),
        "seq_id": _column([e.seq_id for e in es], "Int64"),
        "pos": _column([e.pos for e in es], "Int64"),
        "pattern": _column([e.pattern for e in es], "string"),
        "slot": _column([e.slot for e in es], "Int64"),
        "task": _column([e.task for e in es], "Int64"),
        "accepted": _column([e.accepted for e in es], "Int64"),
        "generated": _column([e.generated for e in es], "Int64"),
        "detail": _column([e.detail for e in es], "string"),
    }, columns=EVENT_COLUMNS)
    drops = kv_drops(kv)
    if not drops.empty:
        drops = drops.astype({"line": "Int64", "seq_id": "Int64", "pos": "Int64", "kind": "string", "pattern": "string",
                              "slot": "Int64", "task": "Int64", "accepted": "Int64", "generated": "Int64",
                              "detail": "string"})
        drops["context"] = pd.Categorical(drops["context"], dtype=CONTEXT_DTYPE)
        df = pd.concat([df, drops], ignore_index=True).sort_values("line", kind="stable", ignore_index=True)
    return df


def build_meta(w: Walker, sizes: SizeMap, speculative: bool, name: str, n_bytes: int,
               warnings: list[str]) -> Meta:
    meta = w.meta.copy()
    meta.update({
        "source": name,
        "bytes": n_bytes,
        "lines": w.n_lines,
        "recognised_lines": w.n_recognised,
        "speculative": speculative,
        "spec_type": spec_type(w.meta),
        "drafter_kv": drafter_kv(spec_type(w.meta)),
        "context_sizes": {str(k): v for k, v in sizes.contexts.items()},
        "context_attribution": sizes.how,
        "n_gpus": len({g.get("device") or g["index"] for g in w.meta["gpus"]})
        or max(w.meta.get("n_devices", {}).values(), default=0),
        "placement": placement(w.layout, w.meta["flags"], w.meta["placement"], w.meta["gpus"]),
        "batch_debug": len(w.batches) > 0,
        "kv_cache_debug": len(w.kv) > 0,
        "warnings": warnings,
    })
    # the log's format (llama.cpp's JSON log or text), its object counts and typed events
    fmt = w.jsonl.meta() if w.jsonl is not None else text_meta()
    meta["log_format"], meta["log_jsonl"], meta["fit_memory_breakdown"] = (
        str(fmt["log_format"]), dict(fmt["log_jsonl"]), list(fmt["fit_memory_breakdown"]))
    return meta


class Built(TypedDict):
    """A walk's tables and meta (`build_all`), before the verdict."""

    batches: pd.DataFrame
    kv: pd.DataFrame
    errors: pd.DataFrame
    events: pd.DataFrame
    meta: Meta


def build_all(w: Walker, name: str, n_bytes: int, warnings: list[str]) -> Built:
    speculative = is_speculative(w)
    spec = spec_type(w.meta)
    keep = drafter_kv(spec)
    why = NO_DRAFTER_HOW["none" if spec == NO_TYPE else "ngram"] if speculative and keep == NONE else None
    sizes = map_sizes(w._sigs, w.meta, speculative, why)  # noqa: SLF001
    kv = build_kv(w, sizes)
    batches = build_batches(w, sizes, speculative)
    if keep == NONE and len(batches):  # n-gram drafting has no drafter context
        ctx, conf = no_drafter(len(batches))
        batches["context"] = pd.Categorical(ctx, dtype=CONTEXT_DTYPE)
        batches["context_confidence"] = conf
    elif keep == MIRROR and upstream_drafter(w.meta) and len(batches):
        # upstream DFlash/EAGLE3 inject the target's hidden states into the drafter as embedding batches
        fill = (batches["context"] == "unknown") & batches["embd"].fillna(False).astype(bool)
        if fill.any():
            batches.loc[fill, "context"] = "drafter"
            batches.loc[fill, "context_confidence"] = 0.9
        # with several slots, EAGLE3's copy of a target batch is tagged sequence 0 whichever slots it carries
        batches = mirrored_sequences(batches)
    if len(kv) and (kv["context"] == "unknown").any():
        kv["context"] = pd.Categorical(kv_through_batches(
            kv["line"].to_numpy(np.int64), kv["context"].astype(str).to_numpy(dtype=object),
            batches["line"].to_numpy(np.int64), batches["context"].astype(str).to_numpy(dtype=object),
        ), dtype=CONTEXT_DTYPE)
    infer_components(w, batches, kv)
    failures, notices = split_notices(w.failures, w.events)
    events = sorted(w.events + notices, key=lambda e: e.line) if notices else w.events
    return {
        "batches": batches,
        "kv": kv,
        "errors": build_errors(failures),
        "events": build_events(events, kv),
        "meta": build_meta(w, sizes, speculative, name, n_bytes, warnings),
    }
