"""Named failure signatures: which known bug a log shows, why, and what to do next.

The catalogue is data: one `Signature` per bug family, tried in order (most specific first), each with a
rule over the reader's ParseResult that returns a `Match` (the numbers and the log lines that prove it)
or None. Next steps are templates filled from the log's own environment (build, GPUs, flags, spec type),
and a step can say when it applies, so the advice fits the reporter's setup.

Text taken from a log never goes into explanations or steps as prose: values from the log (spec type,
build) are reduced to a safe alphabet and shown inside code spans.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from kvtrace.analyze.findings.cycles import CycleStats, cycle_stats
from kvtrace.analyze.reader.concepts import CONCEPT_PREFIX
from kvtrace.analyze.reader.definitions import stale_drafter
from kvtrace.analyze.reader.devices import devices_holding
from kvtrace.analyze.reader.normalize import message
from kvtrace.analyze.reader.records import lines_of, opt_int
from kvtrace.analyze.reader.verdict import failing_side

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult
    from kvtrace.analyze.reader.verdict import Verdict

DEBUG_ENV = "LLAMA_BATCH_DEBUG=1 LLAMA_KV_CACHE_DEBUG=1 GGML_DFLASH_DEBUG=1"
_SAFE = re.compile(r"[^A-Za-z0-9._+-]")


def _safe(value: Any, limit: int = 40) -> str:
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

    @property
    def debug_missing(self) -> bool:
        return not (self.batch_debug and self.kv_cache_debug)

    def fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__} | {
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


def _flag(flags: dict[str, Any], *names: str) -> Any:
    for name in names:
        if name in flags:
            return flags[name]
    return None


def env_of(result: ParseResult) -> Env:
    meta = result.meta or {}
    flags = meta.get("flags") or {}
    versions = meta.get("versions") or []
    build = next((f"{v['build']} ({v.get('commit', '')})" for v in versions if v.get("build")), "")
    spec = _flag(flags, "--spec-type") or next(iter(meta.get("spec_impls") or []), "")
    parallel = _flag(flags, "--parallel", "-np")
    try:
        parallel = int(parallel) if parallel not in (None, True) else None
    except ValueError:
        parallel = None
    kvu = _flag(flags, "--kv-unified", "-kvu")
    ev, err = result.events, result.errors
    patterns = set(ev["pattern"].dropna()) if len(ev) else set()
    dflash = ("dflash" in str(spec).lower() or bool((ev["kind"] == "dflash").any())
              or bool(err["evidence"].fillna("").str.contains("dflash", case=False).any())
              or bool(patterns & {"dflash_clear_stale", "dflash_clear_seq", "dflash_histogram"}))
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
    )


@dataclass(slots=True, frozen=True)
class Step:
    """One next step: a template over Env.fields(), shown when `when(env)` holds (always if None)."""

    text: str
    when: Callable[[Env], bool] | None = None

    def render(self, env: Env) -> str | None:
        if self.when is not None and not self.when(env):
            return None
        return self.text.format(**env.fields())


@dataclass(slots=True, frozen=True)
class Match:
    """Why a rule fired: a one-line statement with the numbers, and the log lines that show it."""

    detail: str
    evidence: tuple[tuple[int, str], ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)
    key: str = ""  # what separates reports of this signature into finer clusters (variant, spec type)
    # the failure's own words where they tell one bug from another (an assert's condition, a CUDA error, a load
    # error), numbers and paths left out: triage clusters on it too, so two different asserts are two clusters
    identity: str = ""


@dataclass(slots=True, frozen=True)
class Signature:
    name: str
    title: str
    rule: Callable[[Any, CycleStats], Match | None]
    explanation: str
    next_steps: tuple[Step, ...]
    failure: bool = True  # False for the healthy signature


@dataclass(slots=True)
class SignatureMatch:
    signature: Signature
    match: Match
    env: Env
    steps: list[str]
    cycles: CycleStats

    @property
    def name(self) -> str:
        return self.signature.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "signature": self.signature.name, "title": self.signature.title, "failure": self.signature.failure,
            "detail": self.match.detail, "key": self.match.key, "facts": self.match.facts,
            "evidence": [{"line": n, "text": t} for n, t in self.match.evidence],
            "explanation": self.signature.explanation, "next_steps": self.steps,
            "cycles": self.cycles.to_dict(),
        }


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


# the failure's own words, as builds and runtimes vary them: an assert's condition in either of GGML_ASSERT's forms
# (2023's `GGML_ASSERT: ggml.c:4000: cond`) or libc's; a GPU backend's error from its name on (a runtime's words
# before it left out); paths cut to their file name; line numbers, addresses and other numbers left out
_ASSERTED = re.compile(r"GGML_ASSERT\((?P<cond>.*?)\)\s*failed|GGML_ASSERT: [^:\s]+:\d+: (?P<old>.+)"
                       r"|Assertion [`'\"](?P<libc>.+?)[`'\"] failed|Assertion failed: (?P<msvc>.+?), file ")
_BACKEND_ERROR = re.compile(r"(?:CUDA|HIP|ROCm|SYCL|MUSA|CANN|Metal|Vulkan|OpenCL) error\b.*")
_PATH = re.compile(r"(?:[A-Za-z]:)?[\\/]?(?:[\w.~@+=-]+[\\/])+(?P<base>[\w.+=-]+)")
_LINE_NO = re.compile(r"(\.\w{1,4}):\d+(?::\d+)?")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?!\w)")


# llama.cpp's load error, nested as it re-raises it (`error loading model: error loading model architecture: ...`)
_LOAD_ERROR = re.compile(r"error loading model(?: architecture)?:")


def failure_words(line: str) -> str:
    """What a failure line says, in the words that tell one bug from another: `GGML_ASSERT(cond)`, `CUDA error:
    out of memory`, a load error's message, without the paths, line numbers and sizes that differ between runs."""
    text = message(line)[:2000]  # the words are at a line's start; a pasted line can be 1 MB, and these scan it
    if (m := _ASSERTED.search(text)) is not None:
        ggml = m["cond"] if m["cond"] is not None else m["old"]
        return f"GGML_ASSERT({ggml.strip()})" if ggml is not None else f"assert({(m['libc'] or m['msvc']).strip()})"
    if (b := _BACKEND_ERROR.search(text)) is not None:
        text = b.group(0)
    text = text[:400]  # 120 characters are kept
    text = _NUMBER.sub("N", _HEX.sub("0x…", _LINE_NO.sub(r"\1", _PATH.sub(lambda p: p["base"], text))))
    return " ".join(text.split())[:120]


def _identity(row: pd.Series) -> str:
    """A failure's identity for clustering: its words (`failure_words`), or the concept that read a runtime's
    words (a report's prose is no identity)."""
    variant = str(row["variant"])
    if variant.startswith(CONCEPT_PREFIX):
        return variant
    lines = lines_of(row["lines"])
    return failure_words(lines[0][1]) if lines else variant


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
SPEC_INIT = re.compile(r"common_speculative_(?:impl_\w+|init\w*):|ctx_dft=")


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
    lines = lines_of(row["lines"])
    what = _LOAD_ERROR.split(lines[0][1] if lines else "")[-1].strip()[:160]
    return Match(f"a start-up failure: the model did not load ({what}); the server stopped before serving.",
                 tuple(_block_lines(row)), {"what": what}, key="split_buffers" if "split buffers" in what else "load",
                 identity=failure_words(what) if what and not str(row["variant"]).startswith(CONCEPT_PREFIX)
                 else _identity(row))


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
    if verdict.kind != "other" or not verdict.n_errors:
        return str(verdict.summary or "")
    side = f" ({verdict.component} side)" if verdict.component != "unknown" else ""
    return f"llama.cpp aborted{side}; the evidence lines show where."


def rule_fallback(result: ParseResult, _c: CycleStats) -> Match | None:
    v = result.verdict
    return Match(plain_summary(v), tuple((int(e["line"]), str(e["text"])) for e in v.evidence[:6]),
                 {"kind": v.kind}, key=v.kind)


# ---- the catalogue ------------------------------------------------------------------------------------

def _no_debug(e: Env) -> bool:
    return e.debug_missing


RERUN_DEBUG = Step(f"Rerun with `{DEBUG_ENV}` and `-v` (or `kvtrace capture run -- llama-server ...`) so every "
                   "batch and every stored KV position is in the log.", _no_debug)
SINGLE_GPU = Step("Try a single GPU (`--split-mode none`, or `CUDA_VISIBLE_DEVICES=0`): the log shows {n_gpus} "
                  "devices ({device_list}){drafter_on}, and a failure that goes away on one device points at the "
                  "split.", lambda e: e.n_gpus > 1)
NO_KVU = Step("Rerun without `--kv-unified`: with one shared KV stream, slots and the drafter see each "
              "other's positions.", lambda e: e.kv_unified)
PARALLEL_1 = Step("Rerun with `--parallel 1`: the log runs {parallel} slots; if one slot works, the bug is in "
                  "how slots map to sequences.", lambda e: (e.parallel or 0) > 1)
REPORT_BUILD = Step("Quote the build (`{build}`) when reporting, and retest on the newest release first.",
                    lambda e: bool(e.build))

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "stale_drafter_kv", "Stale drafter KV cache", rule_stale_drafter,
        "The drafter's KV cache kept positions from an earlier request or cycle: its stored max (X) stays "
        "fixed while every new draft batch arrives at the target's current position (Y), so llama.cpp refuses "
        "each one. The target was rewound or cleared (new prompt, prefix reuse, context shift) and the drafter "
        "was not, which is the DFlash bug this tool was built for.",
        (
            Step("Known fix: beellama.cpp v0.3.0 clears stale drafter KV before drafting (it logs "
                 "`dflash: clearing stale drafter KV for seq=...`); upgrade and retest.",
                 lambda e: e.dflash and not e.stale_kv_clear),
            Step("The log already shows the v0.3.0 stale-KV clear running, yet the drafter is still stale: this is "
                 "a path the fix does not cover; report it with this log.", lambda e: e.stale_kv_clear),
            Step("Clear the drafter's sequence whenever the target's is cleared or truncated "
                 "(`llama_memory_seq_rm` on both contexts with the same range).", lambda e: not e.dflash),
            RERUN_DEBUG, SINGLE_GPU, NO_KVU, PARALLEL_1, REPORT_BUILD,
        ),
    ),
    Signature(
        "multimodal_positions", "Multimodal chunk left a position hole", rule_multimodal,
        "A batch failed right next to an image (or other media) chunk or find_slot's `non-consecutive token "
        "position` warnings: the chunk's tokens were placed at positions that leave a hole or overlap what the "
        "cache holds (M-RoPE models count image positions differently from text), so the next text batch does "
        "not continue the sequence.",
        (Step("Rerun the same request with a text-only prompt: if it passes, the image chunk's positions are the "
              "cause."),
         Step("Try a smaller image (fewer chunks) or one image per request, and note the model's vision projector."),
         Step("Disable speculative decoding for image requests: a draft context must place the same image "
              "positions as the target.", lambda e: e.speculative),
         RERUN_DEBUG, REPORT_BUILD),
    ),
    Signature(
        "mrope_position_order", "M-RoPE position order", rule_mrope,
        "The model uses M-RoPE (multimodal rotary positions), where llama.cpp only requires positions to "
        "grow (X < Y upstream, X <= Y in forks and older builds) instead of Y = X + 1. A batch arrived at a "
        "position at or below what the cache already holds: usually a draft context (MTP/EAGLE) that was not "
        "trimmed after a rejection, or image tokens whose positions were counted differently by the two sides.",
        (
            Step("Check whether the failing side's cache is trimmed after rejected drafts (the batch's Y is below "
                 "the stored X)."),
            PARALLEL_1, NO_KVU,
            Step("Rerun with a text-only prompt: if the failure needs an image, the vision positions are the cause."),
            RERUN_DEBUG, SINGLE_GPU, REPORT_BUILD,
        ),
    ),
    Signature(
        "drafter_not_rolled_back", "Drafter not rolled back", rule_not_rolled_back,
        "The drafter's cache is ahead of the batch (X >= Y): positions of rejected draft tokens were kept "
        "instead of being removed after verification, so the next draft overlaps them.",
        (
            Step("Make sure rejected draft positions are removed from the drafter "
                 "(`llama_memory_seq_rm(drafter, seq, n_accepted_pos, -1)`) after every verification."),
            Step("Known fix: beellama.cpp v0.3.0 clears stale drafter KV before drafting; upgrade and retest.",
                 lambda e: e.dflash and not e.stale_kv_clear),
            RERUN_DEBUG, PARALLEL_1, NO_KVU, SINGLE_GPU, REPORT_BUILD,
        ),
    ),
    Signature(
        "parallel_slot_mismatch", "Parallel-slot sequence mismatch", rule_parallel_slot,
        "The failing sequence id is not the slot the server was working on, or several slots fail at once: "
        "llama-server maps slot N to sequence N, so one slot's batch met another slot's cache state (slots "
        "sharing a unified KV stream, or a slot reused without clearing its sequence).",
        (PARALLEL_1, NO_KVU, RERUN_DEBUG,
         Step("Note which requests were in flight (the `task` ids) when it failed; a reproducer with two "
              "concurrent requests is what maintainers need."),
         SINGLE_GPU, REPORT_BUILD),
    ),
    Signature(
        "positions_not_continuous", "Positions not continuous inside one batch", rule_not_continuous,
        "llama.cpp refused a batch whose own positions for one sequence skip, go backwards, or disagree with a "
        "coupled sequence: the caller built the batch wrong, before any KV state was involved.",
        (Step("Look at the caller that builds this batch (draft block or verify batch): positions must be "
              "consecutive per sequence."), RERUN_DEBUG, PARALLEL_1, REPORT_BUILD),
    ),
    Signature(
        "target_position_mismatch", "Target cache and slot positions disagree", rule_target_positions,
        "The target refused a batch the server built for one of its own slots: the server's count of the slot's "
        "tokens and the target's KV cache disagree (a prompt-cache or checkpoint restore, a context shift, or a "
        "speculative rollback that removed the wrong positions).",
        (Step("Rerun with `--cache-ram 0` and without `--cache-reuse` to rule out the prompt cache and reuse."),
         Step("Turn speculative decoding off once (`--spec-type none` or no `-md`): if it passes, the rollback "
              "after rejected drafts is the cause.", lambda e: e.speculative),
         PARALLEL_1, NO_KVU, RERUN_DEBUG, REPORT_BUILD),
    ),
    Signature(
        "hidden_state_mismatch", "Hidden-state or embedding mismatch between target and drafter", rule_hidden_state,
        "An assert on the tensors the drafter reads from the target: EAGLE3 and MTP drafters take the target's "
        "hidden states (layer inputs, embeddings). The target's architecture does not expose those layers yet, or "
        "the two models disagree on the embedding size.",
        (Step("Check that the drafter was converted for this exact target (same hidden size, same layer ids); a "
              "drafter for a sibling model does not fit."),
         Step("Check whether this target architecture supports the drafter's hooks in your build; retest on the "
              "newest release."),
         REPORT_BUILD),
    ),
    Signature(
        "device_lost", "A device went away", rule_device_lost,
        "llama.cpp lost one of its devices while running: an RPC server (`--rpc`) that exited, was killed or "
        "became unreachable (ggml-rpc aborts with `Remote RPC server crashed or returned malformed response`), "
        "or a GPU the driver reset. The failure is the device's, not the draft/verify bookkeeping's.",
        (Step("Check the RPC server's own output (it ran on one of {device_list}) and that it is still up; "
              "restart it and rerun.", lambda e: any(d.startswith("RPC") for d in e.devices)),
         Step("Check the driver's log (`dmesg`) for a reset GPU, and its memory and temperature.",
              lambda e: not any(d.startswith("RPC") for d in e.devices)),
         SINGLE_GPU, REPORT_BUILD),
    ),
    Signature(
        "draft_context_failed", "Draft/MTP context failed to load or initialise", rule_draft_load,
        "The draft side (a draft model, an MTP head, an EAGLE3 or DFlash drafter) could not be loaded or its "
        "context could not be created: the file does not fit the requested speculative type, its vocabulary or "
        "architecture does not match the target, or its buffers do not fit in memory. The server stops before "
        "serving.",
        (Step("Check that the draft file fits the speculative type (`--spec-type {spec_type}`): an MTP type needs a "
              "model with MTP layers or a matching MTP head; a draft model needs the target's vocabulary.",
              lambda e: bool(e.spec_type)),
         Step("Check that the draft file fits the speculative type: an MTP type needs MTP layers or an MTP head; a "
              "draft model needs the target's vocabulary.", lambda e: not e.spec_type),
         Step("Give the draft context room: lower `--ctx-size-draft`/`--ctx-size`, or put fewer draft layers on the "
              "GPU (`--spec-draft-ngl`)."),
         Step("Load the draft file alone (`llama-cli -m DRAFT`) to tell a broken file from a broken pairing."),
         REPORT_BUILD),
    ),
    Signature(
        "model_load_failed", "Model failed to load at start-up", rule_model_load,
        "llama.cpp stopped while loading a model, before the first request: the devices cannot hold the "
        "requested layout (RPC devices, for one, cannot hold row-split tensors), the file is broken, or it "
        "does not fit in memory.",
        (Step("Use `--split-mode layer` (or `none`): `--split-mode row` needs devices that hold split buffers, and "
              "RPC devices do not (this log lists {device_list}).",
              lambda e: e.split_mode == "row" or any(d.startswith("RPC") for d in e.devices)),
         Step("Check the device list (`llama-server --list-devices`, with the same `--rpc`/`--device` flags) and "
              "the memory each one has free."),
         REPORT_BUILD),
    ),
    Signature(
        "speculative_assert", "Assert or abort in the speculative path", rule_spec_assert,
        "llama.cpp hit an assertion or aborted while drafting or verifying. A DFlash drafter is non-causal and "
        "goes through encode(), which requires the whole batch in one ubatch (n_ubatch >= n_tokens).",
        (
            Step("Raise the drafter's `--ubatch-size` (or lower `--draft-max`) so a draft block fits one ubatch.",
                 lambda e: e.dflash),
            Step("Paste the whole backtrace (all frames): the frames name the code path."),
            RERUN_DEBUG, SINGLE_GPU, REPORT_BUILD,
        ),
    ),
    Signature(
        "abort_outside_speculation", "Abort without speculative decoding", rule_abort_outside_spec,
        "llama.cpp hit an assertion or aborted in a run that uses no speculative decoding at all: the bug is in the "
        "model, the backend or the caller, not in a draft/verify cycle.",
        (Step("Paste the whole backtrace (all frames): the frames name the code path."),
         Step("Retry on the CPU backend (`-ngl 0`) to tell a backend bug from a model bug.",
              lambda e: e.n_gpus != 1),
         SINGLE_GPU, REPORT_BUILD),
    ),
    Signature(
        "draft_kv_full", "Draft context's KV cache full", rule_draft_kv_full,
        "The draft context ran out of KV cells (`ret = 1` right after a draft call): it has its own context size, "
        "and a long prompt that fits the target does not fit the drafter.",
        (Step("Give the drafter as much context as the target (`--ctx-size-draft`, or the same `--ctx-size`)."),
         Step("Lower `--parallel` or `--draft-max` so the draft context needs fewer cells."),
         REPORT_BUILD),
    ),
    Signature(
        "kv_cache_full", "KV cache full or fragmented", rule_kv_full,
        "The KV cache had no free cells for a batch (`ret = 1`, no memory slot, context exceeded): the context "
        "is full, or split among too many slots, or fragmented so no contiguous run is free.",
        (Step("Raise `--ctx-size`, or lower `--parallel` (each slot gets ctx-size / parallel cells)."),
         Step("Lower `--batch-size` / `--ubatch-size`, or turn on context shift if the build has it."),
         Step("With a draft model, give the drafter its own context size (`--ctx-size-draft`).",
              lambda e: e.speculative),
         REPORT_BUILD),
    ),
    Signature(
        "encoder_model_decoded", "Encoder-only model called with decode", rule_encoder_decode,
        "An embedding or reranking (encoder-only) model was given to llama_decode, which refuses every batch: the "
        "runtime should call llama_encode for it.",
        (Step("Serve the model as an embedding model (`--embedding`, or the runtime's embedding endpoint) rather "
              "than for generation."),
         Step("Update the runtime: newer llama.cpp calls encode() for such models itself."), REPORT_BUILD),
    ),
    Signature(
        "decode_compute_failed", "Decode could not prepare or compute the batch", rule_decode_compute,
        "llama_decode returned -2/-3 (or `failed to prepare ubatch`, `Compute error`): the batch could not be "
        "split, allocated or computed, usually memory for the compute graph, a context larger than the model or "
        "runtime supports, or a backend failure; not a position or cache-room problem.",
        (Step("Lower the context size and `--batch-size`/`--ubatch-size`; stay within the model's trained context."),
         Step("Retry on another backend or the CPU to tell a backend failure from a memory limit."),
         SINGLE_GPU, REPORT_BUILD),
    ),
    Signature(
        "decode_invalid_batch", "Decode refused the batch as invalid (ret = -1)", rule_decode_invalid_batch,
        "llama_decode returned -1: the input-batch checks refused the batch before computing it (positions that do "
        "not continue the sequence's cache, a sequence id past the context's sequences, a token outside the "
        "vocabulary). llama.cpp logs which check just before it; a second call that fails where the first "
        "worked usually means the cache still holds the previous call's positions.",
        (Step("Turn on llama.cpp's log (the runtime's verbose mode or log callback) and rerun: the `init:` lines "
              "just before the failure name the check that refused the batch."),
         Step("Between independent calls, clear the context's memory (`llama_memory_clear`, the runtime's "
              "`reset()`), or start the next call's positions where the cache ends."),
         Step("Check the batch's sequence ids (below `--parallel` / `n_seq_max`) and token ids (below the "
              "model's vocabulary size)."),
         REPORT_BUILD),
    ),
    Signature(
        "invalid_logits", "Logits asked for a position that has none", rule_invalid_logits,
        "llama.cpp was asked for the logits of a batch position that was not marked for output (`invalid logits "
        "id`, `-1` when the batch produced none): the caller built the batch without `logits` set where it reads "
        "them, or an image/embedding step left no output row; newer builds abort there.",
        (Step("Check the caller's batch: the position it reads logits for must have `logits`/`output` set (the "
              "last token of each sequence at least)."),
         Step("If it happens with images or an embedding model, rerun text-only or with the model's own endpoint: "
              "the multimodal or embedding path produced no output row."),
         REPORT_BUILD),
    ),
    Signature(
        "out_of_memory", "Out of memory on a device or the host", rule_out_of_memory,
        "An allocation failed: the model's layers, the KV cache or the compute buffers did not fit in the free "
        "memory of the device (or the host). Not a position or cache bookkeeping problem.",
        (Step("Put fewer layers on the GPU (`-ngl`), lower `--ctx-size` and `--batch-size`/`--ubatch-size`, or "
              "quantize the KV cache (`--cache-type-k q8_0`)."),
         Step("Check what else holds the device's memory (`nvidia-smi`, another server or model still loaded)."),
         Step("With a draft model, count its weights and its own context too (`--ctx-size-draft`, "
              "`--spec-draft-ngl`).", lambda e: e.speculative),
         REPORT_BUILD),
    ),
    Signature(
        "server_error_response", "The server answered with an internal error", rule_server_error,
        "A client got an HTTP 500 (`server_error`) from llama-server, and the text holds no server line that says "
        "why. The message in the answer names the part that failed (a decode, the chat-format parser, a tool "
        "call), and the server's own log at that moment holds the cause.",
        (Step("Find the server's log lines at the time of the 500 (`-v` shows each request) and attach them."),
         Step("If the message names the output format or a parser, retry with another chat template or without "
              "tools/grammar: the model's output, not the decode, failed."),
         REPORT_BUILD),
    ),
    Signature(
        "runtime_reported_failure", "A failure told only in a runtime's words", rule_wrapper_failure,
        "A runtime around llama.cpp (a binding, ollama, a server wrapper) reported a failed decode, a full KV "
        "cache or a crash in its own words (a return-code enum, an exception, a Go panic, a signal), without "
        "llama.cpp's own log lines. The code tells the family: 1 is no KV slot, -1 an invalid batch, -2/-3 a "
        "compute or allocation failure.",
        (Step("Turn on the runtime's llama.cpp logging (verbose, or its log callback) and rerun, so llama.cpp's "
              "own failure lines are in the log."),
         Step("A full KV cache (`NoKvSlot`, code 1): raise the context size or lower the number of parallel "
              "sequences; keep the prompt within the context."),
         Step("Quote the runtime's version and the llama.cpp build it bundles."),
         REPORT_BUILD),
    ),
    Signature(
        "healthy_speculative", "Healthy speculative run", rule_healthy,
        "Speculative decoding ran without a failure. Acceptance says how often the target agreed with the "
        "drafter; the mean accepted length is tokens per verification (1 + accepted / verify steps).",
        (Step("Nothing to fix. To speed up, compare acceptance across `--draft-max` values."),
         Step("If a failure happens elsewhere, capture that run with `" + DEBUG_ENV + "` and `-v`.")),
        failure=False,
    ),
    Signature(
        "unclassified", "No known signature", rule_fallback,
        "The log does not match a known signature; the verdict says what the reader found.",
        (RERUN_DEBUG, SINGLE_GPU, PARALLEL_1, NO_KVU, REPORT_BUILD,
         Step("Attach the whole log (not an excerpt): the lines before the first failure matter.")),
    ),
)

BY_NAME: dict[str, Signature] = {s.name: s for s in SIGNATURES}
ORDER: dict[str, int] = {s.name: i for i, s in enumerate(SIGNATURES)}


def match_signature(result: ParseResult) -> SignatureMatch:
    """The most specific signature whose rule matches (the catalogue is ordered; the last always matches)."""
    env = env_of(result)
    cycles = cycle_stats(result)
    for sig in SIGNATURES:
        m = sig.rule(result, cycles)
        if m is None:
            continue
        if sig.name == "unclassified" and result.verdict.kind in ("no_log", "other") and not len(result.errors):
            sig = Signature(sig.name, "No failure found", sig.rule,
                            "The log has no failure and no draft statistics.", sig.next_steps, failure=False)
        steps = [s for s in (step.render(env) for step in sig.next_steps) if s]
        return SignatureMatch(sig, m, env, list(dict.fromkeys(steps)), cycles)
    raise AssertionError("the fallback signature always matches")
