"""The rules of the signature catalogue: each reads the reader's ParseResult and returns a `Match` (the numbers
and the log lines that prove it) or None; and the environment the next steps are filled from (`Env`).

Text taken from a log never goes into a statement as prose: values from the log (spec type, build) are reduced to
a safe alphabet, and log lines travel as evidence, which every view shows as text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from kvtrace.analyze.findings.cycles import CycleStats
from kvtrace.analyze.findings.health import health
from kvtrace.analyze.reader.concepts import CONCEPT_PREFIX
from kvtrace.analyze.reader.definitions import stale_drafter
from kvtrace.analyze.reader.devices import devices_holding
from kvtrace.analyze.reader.patterns import BY_NAME
from kvtrace.analyze.reader.records import detail_of, lines_of, opt_int
from kvtrace.analyze.reader.spec import logged_type, spec_type
from kvtrace.analyze.reader.verdict import failing_side

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult
    from kvtrace.analyze.reader.verdict import Verdict

_SAFE = re.compile(r"[^A-Za-z0-9._+-]")


def _safe(value: object, limit: int = 40) -> str:
    return _SAFE.sub("", str(value))[:limit]


@dataclass(slots=True, frozen=True)
class Env:
    """What the log says about the setup; every string is already reduced to [A-Za-z0-9._+-]."""

    build: str = ""
    backends: tuple[str, ...] = ()
    n_gpus: int = 0
    spec_type: str = ""
    mrope: bool = False
    parallel: int | None = None
    kv_unified: bool = False
    split_mode: str = ""
    devices: tuple[str, ...] = ()  # every non-CPU device the log lists (`RPC0`, `CUDA1`)
    drafter_devices: tuple[str, ...] = ()  # the devices that hold the drafter's layers
    target_devices: tuple[str, ...] = ()
    dflash: bool = False
    batch_debug: bool = False
    kv_cache_debug: bool = False
    stale_kv_clear: bool = False  # the log shows beellama.cpp v0.3.0's clear running
    speculative: bool = False
    # the build family where the log tells it (docs/llama-cpp-lines.md#versions-forks-and-their-debug-switches):
    # "beellama>=0.4" (no GGML_DFLASH_DEBUG),
    # "ik_llama" (no batch or KV debug lines, no position check), "" for llama.cpp and the rest
    fork: str = ""

    @property
    def debug_missing(self) -> bool:
        return not (self.batch_debug and self.kv_cache_debug)

    @property
    def debug_env(self) -> str:
        """The debug switches that print something on this build."""
        if self.fork == "beellama>=0.4":
            return "LLAMA_BATCH_DEBUG=1 LLAMA_KV_CACHE_DEBUG=1"
        return "LLAMA_BATCH_DEBUG=1 LLAMA_KV_CACHE_DEBUG=1 GGML_DFLASH_DEBUG=1"

    def fields(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__} | {"debug_env": self.debug_env} | {
            "backend": "/".join(self.backends) or "unknown backend",
            "device_list": ", ".join(self.devices) or f"{self.n_gpus}",
            "drafter_on": f"; the drafter's layers are on {', '.join(self.drafter_devices)}"
            if self.drafter_devices else ""}

    def lines(self) -> list[str]:
        """`key: value` lines for a report's environment block (only what the log said)."""
        out = []
        for key, value in (("build", self.build), ("backends", ", ".join(self.backends)),
                           ("GPUs", self.n_gpus or ""), ("devices", ", ".join(self.devices)),
                           ("target on", ", ".join(self.target_devices)),
                           ("drafter on", ", ".join(self.drafter_devices)), ("spec type", self.spec_type),
                           ("M-RoPE", "yes" if self.mrope else ""),
                           ("--parallel", "" if self.parallel is None else self.parallel),
                           ("--kv-unified", "on" if self.kv_unified else ""), ("split mode", self.split_mode),
                           ("debug lines", ", ".join(n for n, on in (("batch", self.batch_debug),
                                                                     ("kv", self.kv_cache_debug)) if on))):
            if value not in ("", None):
                out.append(f"{key}: {value}")
        return out


def _flag(flags: Mapping[str, str | bool], *names: str) -> str | bool | None:
    for name in names:
        if name in flags:
            return flags[name]
    return None


def env_of(result: ParseResult) -> Env:
    meta = result.meta or {}
    flags = meta.get("flags") or {}
    versions = meta.get("versions") or []
    build = next((f"{v['build']} ({v.get('commit', '')})" for v in versions if v.get("build")), "")
    given = _flag(flags, "--parallel", "-np")
    try:
        parallel = int(given) if given is not None and given is not True else None
    except ValueError:
        parallel = None
    kvu = _flag(flags, "--kv-unified", "-kvu")
    ev, err = result.events, result.errors
    patterns = set(ev["pattern"].dropna()) if len(ev) else set()
    dflash = ("dflash" in logged_type(meta).lower() or bool((ev["kind"] == "dflash").any())
              or bool(err["evidence"].fillna("").str.contains("dflash", case=False).any())
              or bool(patterns & {"dflash_clear_stale", "dflash_clear_seq", "dflash_histogram"}))
    spec = spec_type(meta, dflash_lines=dflash)
    return Env(
        build=_safe(build.replace(" (", "-").rstrip(")")),
        backends=tuple(_safe(b) for b in meta.get("backends") or ()),
        n_gpus=int(meta.get("n_gpus") or 0),
        spec_type=_safe(spec),
        mrope=bool(meta.get("mrope")),
        parallel=parallel,
        kv_unified=kvu is not None and str(kvu).lower() not in ("0", "false", "off"),
        split_mode=_safe(_flag(flags, "--split-mode", "-sm") or ""),
        devices=tuple(_safe(g.get("device") or g.get("name", "")) for g in meta.get("gpus") or ()),
        target_devices=tuple(_safe(d) for d in devices_holding(meta.get("placement") or {}, "target")),
        drafter_devices=tuple(_safe(d) for d in devices_holding(meta.get("placement") or {}, "drafter")),
        dflash=dflash,
        batch_debug=bool(meta.get("batch_debug")),
        kv_cache_debug=bool(meta.get("kv_cache_debug")),
        stale_kv_clear=bool(patterns & {"dflash_clear_stale", "dflash_clear_seq"}),
        speculative=bool(meta.get("speculative")),
        fork=fork_of(patterns),
    )


def fork_of(patterns: set[str]) -> str:
    """The build family the log's own lines tell, "" where they do not
    (docs/llama-cpp-lines.md#versions-forks-and-their-debug-switches)."""
    if "beellama_dflash_depth" in patterns:
        return "beellama>=0.4"
    if "pos_accept" in patterns:  # ik_llama.cpp's `statistics ... pos_accept=[...]`
        return "ik_llama"
    return ""


@dataclass(slots=True, frozen=True)
class Match:
    """Why a rule fired: a one-line statement with the numbers, and the log lines that show it."""

    detail: str
    evidence: tuple[tuple[int, str], ...] = ()
    facts: Mapping[str, object] = field(default_factory=dict)
    key: str = ""  # what separates reports of this signature into finer clusters (variant, spec type)
    # the failure's own words where they tell one bug from another (an assert's condition, a CUDA error, a load
    # error), numbers and paths left out: triage clusters on it too, so two different asserts are two clusters
    identity: str = ""


# ---- helpers over the tables -------------------------------------------------------------------------

def _positions(result: ParseResult) -> pd.DataFrame:
    e = result.errors
    return e[e["kind"] == "inconsistent_positions"]


def _xy_lines(row: pd.Series) -> list[tuple[int, str]]:
    """The X and Y lines of one failure block (and its caller line), from the reader's kept lines."""
    keep = []
    for n, text in lines_of(row["lines"]):
        if "is X =" in text or "starting position of Y" in text or "M-RoPE" in text or "consecutive" in text:
            keep.append((int(n), text.strip()))
    ev_line = opt_int(row["evidence_line"])
    if ev_line is not None and row["evidence"] and all(n != ev_line for n, _ in keep):
        keep.append((ev_line, str(row["evidence"]).strip()))
    return keep


def _identity(row: pd.Series) -> str:
    """A failure's identity for clustering: its words, read when its line matched (the reader's
    `failure_words`), or the concept that read a runtime's words (a report's prose is no identity)."""
    return str(row["words"]) if pd.notna(row["words"]) and row["words"] else str(row["variant"])


def _block_lines(row: pd.Series, limit: int = 4) -> list[tuple[int, str]]:
    return [(int(n), t.strip()) for n, t in lines_of(row["lines"])[:limit]]


def _first_error(result: ParseResult,
                 where: Callable[[pd.DataFrame], pd.Series]) -> tuple[pd.DataFrame, pd.Series] | None:
    """The error rows `where(errors)` selects and the first of them; None when it selects none."""
    err = result.errors
    rows = err[where(err)]
    if rows.empty:
        return None
    return rows, rows.iloc[0]


def _complete(pos: pd.DataFrame) -> pd.DataFrame:
    return pos[pos["last_pos"].notna() & pos["batch_start"].notna()]


def _slots(result: ParseResult) -> list[tuple[int, int]]:
    """(line, slot id) of every server slot line the reader kept (events detail `slot`)."""
    out = []
    ev = result.events
    ev = ev[ev["slot"].notna()]
    for line, slot in zip(ev["line"], ev["slot"], strict=True):
        out.append((int(line), int(slot)))
    return out


# ---- rules --------------------------------------------------------------------------------------------

def rule_stale_drafter(result: ParseResult, _c: CycleStats) -> Match | None:
    pos = _positions(result)
    if not stale_drafter(pos):
        return None
    d = pos[pos["component"] == "drafter"]
    c = _complete(d)
    first, last = c.iloc[0], c.iloc[-1]
    x = int(first["last_pos"])
    ys = d["batch_start"].dropna().astype("int64")
    evidence = _xy_lines(first) + ([] if len(c) == 1 else _xy_lines(last))
    return Match(
        f"{len(d)} drafter batches refused: the drafter's cache stayed at X = {x} while the draft batches "
        f"arrived at the target's positions, Y = {int(ys.min())} to {int(ys.max())} "
        f"(the first one {int(first['batch_start']) - x - 1} positions past the cache).",
        tuple(evidence), {"x": x, "y_min": int(ys.min()), "y_max": int(ys.max()), "n": len(d)},
        key=str(first["variant"]))


def rule_mrope(result: ParseResult, _c: CycleStats) -> Match | None:
    pos = _positions(result)
    m = pos[pos["variant"].isin(["mrope_lt", "mrope_le"])]
    if m.empty:
        return None
    c = _complete(m)
    row = c.iloc[0] if len(c) else m.iloc[0]
    op = "<" if row["variant"] == "mrope_lt" else "<="
    x, y = opt_int(row["last_pos"]), opt_int(row["batch_start"])
    where = f"X = {x}, Y = {y}" if x is not None and y is not None else "X/Y cut off"
    return Match(
        f"{len(m)} {row['component']} batch{'es' if len(m) != 1 else ''} refused by the M-RoPE rule X {op} Y "
        f"({where}).", tuple(_xy_lines(row)),
        {"op": op, "x": x, "y": y, "n": len(m), "component": str(row["component"])}, key=str(row["variant"]))


def rule_not_rolled_back(result: ParseResult, _c: CycleStats) -> Match | None:
    d = _complete(_positions(result))
    d = d[(d["component"] == "drafter") & (d["last_pos"] >= d["batch_start"])]
    if d.empty:
        return None
    row = d.iloc[0]
    x, y = int(row["last_pos"]), int(row["batch_start"])
    return Match(
        f"{len(d)} drafter batch{'es' if len(d) != 1 else ''} refused with the drafter's cache ahead of the batch: "
        f"X = {x} >= Y = {y} ({x - y + 1} rejected position{'s' if x - y + 1 != 1 else ''} still stored).",
        tuple(_xy_lines(row)), {"x": x, "y": y, "n": len(d)}, key=str(row["variant"]))


def rule_parallel_slot(result: ParseResult, _c: CycleStats) -> Match | None:
    err = result.errors
    failing = err[err["seq_id"].notna() & err["kind"].isin(["inconsistent_positions", "decode_failed"])]
    slots = _slots(result)
    if failing.empty or not slots:
        return None
    row = failing.iloc[0]
    seq, line = int(row["seq_id"]), int(row["line"])
    before = [s for n, s in slots if n < line]
    # llama-server gives slot N the sequence id N: a failing sequence that is not the slot at work is
    # another slot's state leaking in (or slots sharing one stream under --kv-unified).
    mismatch = bool(before) and before[-1] != seq
    after = sorted({s for n, s in slots if n > line})
    many = len(after) >= 2
    if not (mismatch or (many and seq not in after)):
        return None
    lines = _block_lines(row, 2)
    around = sorted(set(before[-1:] + after))
    detail = (f"sequence {seq} failed while the slot lines around it are for slot"
              f"{'s' if len(around) > 1 else ''} {', '.join(map(str, around))}"
              + (f"; {len(after)} slots stopped right after it" if many else "") + ".")
    facts = {"seq_id": seq, "slot_before": before[-1] if before else None, "slots_after": after}
    return Match(detail, tuple(lines + _slot_lines(row)), facts, key="seq!=slot")


def _slot_lines(row: pd.Series) -> list[tuple[int, str]]:
    return [(int(n), t.strip()) for n, t in lines_of(row["lines"]) if "send_error" in t][:3]


NOT_CONTINUOUS = ("not_continuous", "decreasing", "diverged", "incompatible_sets", "coupled_split")


def rule_not_continuous(result: ParseResult, _c: CycleStats) -> Match | None:
    if (found := _first_error(result, lambda e: e["variant"].isin(NOT_CONTINUOUS))) is None:
        return None
    rows, row = found
    return Match(f"{len(rows)} batch{'es' if len(rows) != 1 else ''} refused: sequence {opt_int(row['seq_id'])} "
                 f"{str(row['variant']).replace('_', ' ')} inside one batch ({row['component']}).",
                 tuple(_block_lines(row)), {"n": len(rows), "variant": str(row["variant"])}, key=str(row["variant"]))


def rule_spec_assert(result: ParseResult, _c: CycleStats) -> Match | None:
    err = result.errors
    rows = err[err["kind"] == "assert"]
    if rows.empty:
        return None
    drafter = rows[rows["component"] == "drafter"]
    if drafter.empty and not result.meta.get("speculative"):
        return None
    row = drafter.iloc[0] if len(drafter) else rows.iloc[0]
    return Match(f"llama.cpp aborted in the speculative path ({row['variant']}, {row['component']} side); "
                 f"{len(rows)} abort{'s' if len(rows) != 1 else ''} in the log.",
                 tuple(_block_lines(row)), {"n": len(rows), "variant": str(row["variant"])}, key=str(row["variant"]),
                 identity=_identity(row))


def rule_kv_full(result: ParseResult, _c: CycleStats) -> Match | None:
    if (found := _first_error(result, lambda e: e["kind"] == "kv_slot")) is None:
        return None
    rows, row = found
    ev = result.events
    shifts = [int(n) for n in ev.loc[ev["pattern"] == "context_shift", "line"]]
    return Match(f"the {row['component']} KV cache had no room ({row['variant']}"
                 f"{', ret = ' + str(opt_int(row['ret'])) if opt_int(row['ret']) is not None else ''}); "
                 f"{len(rows)} such failure{'s' if len(rows) != 1 else ''}, {len(shifts)} context shift"
                 f"{'s' if len(shifts) != 1 else ''}.",
                 tuple(_block_lines(row)), {"n": len(rows), "context_shifts": len(shifts)}, key=str(row["variant"]))


# ---- rules for the families seen in real reports beyond speculation (issue 15) -------------------------

def _side(result: ParseResult, row: pd.Series) -> str:
    """The failing side of one error row, by the verdict's rules (a log without speculation: the target)."""
    return failing_side(row, str(row["component"]), bool(result.meta.get("speculative")), not result.truncated)[0]


def _before(result: ParseResult, line: int, kinds: tuple[str, ...]) -> bool:
    """Whether an event of one of these kinds comes before a log line (a request was being served)."""
    ev = result.events
    return bool(((ev["line"] < line) & ev["kind"].isin(kinds)).any())


MM_WINDOW = 30  # lines around a failure in which an image chunk or a find_slot hole counts as its cause
REQUEST_EVENTS = ("new_prompt", "prompt_done", "accepted", "draft_stats", "stop")


def rule_multimodal(result: ParseResult, _c: CycleStats) -> Match | None:
    err = result.errors
    fails = err[err["kind"].isin(["inconsistent_positions", "decode_failed"])]
    ev = result.events
    mm = ev[ev["kind"].isin(["mm", "kv_warning"])]
    if fails.empty or mm.empty:
        return None
    for _, row in fails.iterrows():
        line = int(row["line"])
        near = mm[(mm["line"] > line - MM_WINDOW) & (mm["line"] < line + MM_WINDOW)]
        if near.empty:
            continue
        holes = near[near["kind"] == "kv_warning"]
        cause = "find_slot position holes" if len(holes) else "an image chunk"
        first = int(near.iloc[0]["line"])
        return Match(f"a {_side(result, row)} batch failed ({row['variant']}) next to {cause} (line {first}): "
                     "the multimodal chunk's positions left a hole or an overlap in the sequence.",
                     tuple(_block_lines(row)), {"mm_line": first, "n": len(fails)},
                     key="find_slot" if len(holes) else "image")
    return None


def rule_target_positions(result: ParseResult, _c: CycleStats) -> Match | None:
    err = result.errors
    pos = err[(err["kind"] == "inconsistent_positions") | (err["variant"] == "seq_not_from_last")]
    for _, row in pos.iterrows():
        if _side(result, row) == "target":
            x = opt_int(row["last_pos"])
            return Match(f"the target refused its own batch for sequence {opt_int(row['seq_id'])} "
                         f"({RULE_NAMES.get(str(row['variant']), row['variant'])}, X = {x}): the server's idea of "
                         "the slot's positions and the target's KV cache disagree.",
                         tuple(_xy_lines(row)), {"x": x, "y": opt_int(row["batch_start"])}, key=str(row["variant"]))
    return None


RULE_NAMES = {"consecutive": "Y = X + 1", "unclosed": "closing line cut off",
              "seq_not_from_last": "does not start from the last position stored"}
SPEC_INIT = BY_NAME["spec_init"].regex  # the reader's hint: a speculative implementation creating its draft context


def rule_draft_load(result: ParseResult, _c: CycleStats) -> Match | None:
    err = result.errors
    rows = err[err["kind"] == "load"]
    rows = rows[[_side(result, r) == "drafter" for _, r in rows.iterrows()]] if len(rows) else rows
    if rows.empty:
        # an abort decided by the speculative implementation's init lines, before any request
        a = err[(err["kind"] == "assert") & (err["component"] == "drafter")]
        keep = [bool(SPEC_INIT.search(str(t))) and not str(t).lstrip().startswith("#")
                and not _before(result, int(n), REQUEST_EVENTS) for t, n in zip(a["evidence"], a["line"], strict=True)]
        rows = a[pd.Series(keep, index=a.index, dtype=bool)]
    if rows.empty:
        return None
    row = rows.iloc[0]
    ev_line = opt_int(row["evidence_line"])
    evidence = _block_lines(row) + ([(ev_line, str(row["evidence"]).strip())] if ev_line is not None else [])
    return Match(f"the draft context failed to load or initialise ({row['variant']}); "
                 f"{len(rows)} such line{'s' if len(rows) != 1 else ''} before the server served a request.",
                 tuple(dict.fromkeys(evidence)), {"n": len(rows), "variant": str(row["variant"])},
                 key=str(row["variant"]))


DEVICE_LOST = ("rpc_lost", "rpc_io", "rpc_connect", "device_lost")


def rule_device_lost(result: ParseResult, _c: CycleStats) -> Match | None:
    """A device went away under llama.cpp: an RPC server that stopped answering, a GPU lost (llama.cpp's own
    lines, or a runtime's wording of it where the table read no failure)."""
    found = _first_error(result, lambda e: e["variant"].isin(DEVICE_LOST)) or _first_concept(result, "device_lost")
    if found is None:
        return None
    rows, row = found
    rpc = bool(rows["variant"].str.startswith("rpc").any())
    what = "an RPC server stopped answering" if rpc else "the GPU was lost"
    return Match(f"a device went away mid-run: {what} ({row['variant']}); llama.cpp stopped.",
                 tuple(_block_lines(row)), {"variant": str(row["variant"]), "rpc": rpc},
                 key="rpc" if rpc else "gpu")


def rule_model_load(result: ParseResult, _c: CycleStats) -> Match | None:
    """llama.cpp could not load a model at start-up (`llama_model_load: error loading model: ...`, or a runtime's
    wording of it)."""
    found = (_first_error(result, lambda e: (e["kind"] == "load") & (e["variant"] == "model_load_error"))
             or _first_concept(result, "load_failed"))
    if found is None:
        return None
    _, row = found
    concept = str(row["variant"]).startswith(CONCEPT_PREFIX)
    lines = lines_of(row["lines"])
    # the load error's own words (the table read its message), or the runtime's line that told it
    what = lines[0][1].strip()[:160] if concept and lines else _identity(row)
    return Match(f"a start-up failure: the model did not load ({what}); the server stopped before serving.",
                 tuple(_block_lines(row)), {"what": what}, key="split_buffers" if "split buffers" in what else "load",
                 identity=_identity(row))


HIDDEN_ALWAYS = ("t_layer_inp", "layer input tensor")  # EAGLE3's hooks on the target's layers
HIDDEN_SPEC = ("n_embd", "hidden", "embd")  # size checks that only point at target/drafter in a speculative run
EMBD_VARIANTS = ("embd_mismatch", "embd_differs")  # the table's entries for a target/drafter embedding-size check


def rule_hidden_state(result: ParseResult, _c: CycleStats) -> Match | None:
    err = result.errors
    rows = err[err["kind"].isin(["assert", "load", "decode_failed"])]
    spec = bool(result.meta.get("speculative"))
    for _, row in rows.iterrows():
        text = " ".join(t for _, t in lines_of(row["lines"])[:3])
        if row["variant"] in EMBD_VARIANTS or any(k in text for k in HIDDEN_ALWAYS) or (
                spec and any(k in text for k in HIDDEN_SPEC)):
            return Match("an assert on the hidden states or embeddings the drafter reads from the target: the two "
                         "models disagree on a size or the target's graph does not expose the layers the drafter "
                         "needs.", tuple(_block_lines(row)), {"variant": str(row["variant"])}, key="hidden_state")
    return None


def rule_abort_outside_spec(result: ParseResult, _c: CycleStats) -> Match | None:
    if result.meta.get("speculative"):
        return None
    if (found := _first_error(result, lambda e: e["kind"] == "assert")) is None:
        return None
    rows, row = found
    return Match(f"llama.cpp aborted ({row['variant']}) in a run without speculative decoding; "
                 f"{len(rows)} abort{'s' if len(rows) != 1 else ''} in the log.",
                 tuple(_block_lines(row)), {"n": len(rows), "variant": str(row["variant"])}, key=str(row["variant"]),
                 identity=_identity(row))


def rule_draft_kv_full(result: ParseResult, _c: CycleStats) -> Match | None:
    if (found := _first_error(result, lambda e: (e["kind"] == "kv_slot") & (e["component"] == "drafter"))) is None:
        return None
    rows, row = found
    return Match(f"the draft context's KV cache had no room ({row['variant']}); {len(rows)} such failure"
                 f"{'s' if len(rows) != 1 else ''}: the drafter's context is smaller than the target's prompt.",
                 tuple(_block_lines(row)) + ((int(row["evidence_line"]), str(row["evidence"]).strip()),),
                 {"n": len(rows)}, key=str(row["variant"]))


def rule_encoder_decode(result: ParseResult, _c: CycleStats) -> Match | None:
    if (found := _first_error(result, lambda e: e["variant"] == "cannot_decode_encoder")) is None:
        return None
    rows, row = found
    return Match(f"an encoder-only (embedding/reranking) model was called with llama_decode; {len(rows)} batch"
                 f"{'es' if len(rows) != 1 else ''} refused.", tuple(_block_lines(row, 2)),
                 {"n": len(rows)}, key="encoder")


COMPUTE_VARIANTS = ("prepare_ubatch_failed", "compute_error", CONCEPT_PREFIX + "compute_failed")


def rule_decode_compute(result: ParseResult, _c: CycleStats) -> Match | None:
    found = _first_error(result, lambda e: (e["kind"] == "decode_failed")
                         & (e["variant"].isin(COMPUTE_VARIANTS) | e["ret"].isin([-2, -3])))
    if found is None:
        return None
    rows, row = found
    ret = opt_int(row["ret"])
    return Match(f"llama_decode could not prepare or compute the batch ({row['variant']}"
                 f"{', ret = ' + str(ret) if ret is not None else ''}): not a position or cache-room problem.",
                 tuple(_block_lines(row)), {"n": len(rows), "ret": ret}, key="compute")


def rule_decode_invalid_batch(result: ParseResult, _c: CycleStats) -> Match | None:
    """llama_decode returned -1 with no position block in the text: llama.cpp refused the batch as invalid
    (`failed to decode, ret = -1`, a runtime's `llama_decode returned -1`)."""
    found = _first_error(result, lambda e: (e["kind"] == "decode_failed") & (e["ret"] == -1))
    if found is None:
        return None
    rows, row = found
    return Match(f"llama_decode refused a batch as invalid (ret = -1, {row['variant']}); {len(rows)} such failure"
                 f"{'s' if len(rows) != 1 else ''}, and no position block in the text that says which check.",
                 tuple(_block_lines(row)), {"n": len(rows)}, key="invalid_batch")


# ---- rules for failures a runtime words its own way (the concept layer, analyze/reader/concepts.py) --------------

def _by_wording(result: ParseResult) -> pd.DataFrame:
    """The failures only the concept layer read, where the table read none (the ones the verdict then uses)."""
    e = result.errors
    concept = e["variant"].fillna("").str.startswith(CONCEPT_PREFIX)
    return e[concept] if bool(concept.all()) else e.iloc[:0]


def _first_concept(result: ParseResult, *names: str) -> tuple[pd.DataFrame, pd.Series] | None:
    rows = _by_wording(result)
    rows = rows[rows["variant"].isin([CONCEPT_PREFIX + n for n in names])]
    return (rows, rows.iloc[0]) if len(rows) else None


def rule_invalid_logits(result: ParseResult, _c: CycleStats) -> Match | None:
    """The caller asked for the logits of a batch position that produced none (`invalid logits id N`)."""
    err = result.errors
    for _, row in err.iterrows():
        lines = [(int(n), t.strip()) for n, t in lines_of(row["lines"]) if "invalid logits id" in t]
        if lines:
            return Match(f"logits were asked for a batch position that produced none ({len(lines)} line"
                         f"{'s' if len(lines) != 1 else ''}, first at line {lines[0][0]}).", tuple(lines[:3]),
                         {"n": len(lines)}, key="invalid_logits")
    return None


# the table's own allocation failures (ggml's 2023 memory pools), named as the concept layer's out_of_memory is
OOM_VARIANTS = ("memory_pool",)


def rule_out_of_memory(result: ParseResult, _c: CycleStats) -> Match | None:
    """An allocation that failed: a line the table reads as one (`not enough space in the context's memory
    pool`), one told only in words the table does not know, or one just before a start-up failure the table read
    whose own words give no reason (`cudaMalloc failed: out of memory` then `failed to initialize the context:
    failed to allocate buffer for kv cache`)."""
    found = _first_concept(result, "out_of_memory")
    pools = result.errors[result.errors["variant"].isin(OOM_VARIANTS)]
    if not pools.empty:
        found = pools, pools.iloc[0]
    elif found is None:
        e = result.errors
        oom = e[e["variant"] == CONCEPT_PREFIX + "out_of_memory"]
        by_table = e[~e["variant"].fillna("").str.startswith(CONCEPT_PREFIX)]
        if oom.empty or by_table.empty or not bool((by_table["kind"] == "load").all()):
            return None
        found = oom, oom.iloc[0]
    rows, row = found
    return Match(f"a device or host allocation failed (out of memory); {len(rows)} such failure"
                 f"{'s' if len(rows) != 1 else ''}.", tuple(_block_lines(row)), {"n": len(rows)}, key="oom")


def rule_server_error(result: ParseResult, _c: CycleStats) -> Match | None:
    if (found := _first_concept(result, "server_error")) is None:
        return None
    rows, row = found
    return Match(f"the server answered a request with an internal error (HTTP 500); {len(rows)} such answer"
                 f"{'s' if len(rows) != 1 else ''} in the text, and no llama.cpp failure line that says why.",
                 tuple(_block_lines(row, 2)), {"n": len(rows)}, key="http_500")


def rule_wrapper_failure(result: ParseResult, _c: CycleStats) -> Match | None:
    """A decode, KV or crash failure told only in a runtime's words (an enum, an exception, a panic)."""
    rows = _by_wording(result)
    rows = rows[rows["kind"].isin(["decode_failed", "kv_slot", "assert"])]
    if rows.empty:
        return None
    row = rows.iloc[0]
    ret = opt_int(row["ret"])
    what = str(row["variant"]).removeprefix(CONCEPT_PREFIX).replace("_", " ")
    return Match(f"the failure is told only in the runtime's words ({what}"
                 f"{', code ' + str(ret) if ret is not None else ''}); llama.cpp's own log is not in the text.",
                 tuple(_block_lines(row, 3)), {"variant": str(row["variant"]), "ret": ret}, key=what)


def rule_told_in_prose(result: ParseResult, _c: CycleStats) -> Match | None:
    """A verdict that only a sentence of the report stands on (`proof: prose`): a failure or an acceptance told
    in the reporter's words, with no log line behind it. It comes first: no other rule may read a side or a
    cause into a sentence."""
    v = result.verdict
    if v.proof != "prose":
        return None
    what = "a failure" if v.n_errors else "the draft acceptance"
    return Match(f"the report tells of {what} only in a sentence; no log line shows it.",
                 tuple((int(e["line"]), str(e["text"])) for e in v.evidence[:3]), {"kind": v.kind}, key=v.kind)


def rule_healthy(result: ParseResult, c: CycleStats) -> Match | None:
    v = result.verdict
    if len(result.errors) or (v.kind != "draft_stats_only" and not (c.n_cycles and c.drafter_in_step)):
        return None
    acc = v.acceptance or {}
    parts = []
    if acc:
        rate = acc.get("rate")
        parts.append(("synthetic acceptance, chosen by the server: " if acc.get("synthetic") else "")
                     + f"{acc.get('accepted', 0)} of {acc.get('generated', 0)} drafted tokens accepted"
                     + (f" ({rate:.1%})" if rate is not None else ""))
    if c.mean_accepted_len is not None:
        parts.append(f"mean accepted length {c.mean_accepted_len:g}")
    if c.accepted_per_position:
        parts.append("per position " + ", ".join(f"{p:.2f}" for p in c.accepted_per_position))
    if c.n_cycles:
        parts.append(f"drafter in step in {c.in_step} of {c.n_cycles} cycles")
    return Match("no failure; " + ("; ".join(parts) or "draft statistics only") + ".", (),
                 {"acceptance": acc, "mean_accepted_len": c.mean_accepted_len,
                  "accepted_per_position": c.accepted_per_position}, key="")


def plain_summary(verdict: Verdict) -> str:
    """The verdict's summary where it is the tool's own words; an abort's summary quotes the log (its
    assert line), so that one is restated without the quote."""
    if verdict.kind != "other" or not verdict.n_errors or verdict.proof == "prose":  # a sentence's: no quote
        return str(verdict.summary or "")
    side = f" ({verdict.component} side)" if verdict.component != "unknown" else ""
    low = (" Read from a runtime's own words, not llama.cpp's lines (lower confidence): see the evidence line."
           if verdict.confidence == "low" else "")  # what `triage` says, kept in the report and the comment
    return f"llama.cpp aborted{side}; the evidence lines show where.{low}"


def rule_fallback(result: ParseResult, _c: CycleStats) -> Match | None:
    v = result.verdict
    return Match(plain_summary(v), tuple((int(e["line"]), str(e["text"])) for e in v.evidence[:6]),
                 {"kind": v.kind}, key=v.kind)


# ---- a drafter that cannot roll back, and the health findings -----------------------------------------------

def rule_recurrent_drafter(result: ParseResult, _c: CycleStats) -> Match | None:
    """b11434's slot memory aborted because a context could not remove part of a sequence (`failed to remove
    sequence`), in a speculative run: its draft context is created with n_rs_seq = 0, so a recurrent or hybrid
    drafter cannot roll back a rejected draft."""
    if (found := _first_error(result, lambda e: e["variant"] == "seq_rm_failed")) is None:
        return None
    rows, row = found
    if not result.meta.get("speculative"):
        return None
    ev = result.events
    said = ev[(ev["pattern"] == "partial_seq_rm")] if len(ev) else ev
    cannot = [(int(n), str(detail_of(d).get("support", ""))) for n, d in zip(said["line"], said["detail"], strict=True)]
    no_partial = [line for line, support in cannot if support == "does not support"]
    evidence = tuple(_block_lines(row))
    if no_partial:
        evidence = ((no_partial[-1], "the context does not support partial sequence removal"),) + evidence
    p0 = opt_int(row.get("last_pos"))
    detail = ("llama.cpp aborted removing part of a sequence"
              + (f" (from position {p0})" if p0 is not None else "")
              + " in a speculative run"
              + (f"; line {no_partial[-1]} says a context does not support partial sequence removal"
                 if no_partial else "") + ".")
    return Match(detail, evidence, {"n": len(rows), "no_partial_removal_line": no_partial[-1] if no_partial else None},
                 key="seq_rm_failed", identity=_identity(row))


def _health_rule(name: str) -> Callable[[ParseResult, CycleStats], Match | None]:
    def rule(result: ParseResult, _c: CycleStats) -> Match | None:
        if len(result.errors):
            return None  # a refusal or an abort is the run's story; its health findings are listed beside it
        found = [f for f in health(result) if f.finding == name]
        if not found:
            return None
        f = found[0]
        where = f"slot {f.slot}" if f.slot is not None else "the run"
        return Match(f"{where} from line {f.onset_line}: {f.evidence}.", (),
                     {"findings": [g.to_dict() for g in found]}, key=name)

    rule.__name__ = f"rule_{name}"
    return rule


rule_acceptance_collapse = _health_rule("acceptance_collapse")
rule_slot_skew = _health_rule("slot_skew")
rule_drafting_stopped = _health_rule("drafting_stopped")
rule_drafter_stale = _health_rule("drafter_stale")
