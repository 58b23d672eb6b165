"""b11739's batch dumps and input checks (docs/llama-cpp-lines.md#upstream-after-b11434): the ubatch header's
`embd_state` (after `embd`) and `type` (after `output`) lines, a header line no build prints yet, and the reworded
input checks. Each dump is a real engine capture's with the new lines put where b11739 prints them, in the
header's own `ubatch_print:   name = value` shape; read with the C accelerator and without it, the tables equal
the capture's own."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from kvtrace import analyze
from kvtrace.analyze.reader import walker

ROOT = Path(__file__).resolve().parents[3]
STALE = ROOT / "samples" / "stale-drafter" / "raw.log"  # a real engine capture: DFlash's embd batches, X/Y failures
_EMBD = re.compile(r"(?P<head>\S+ D ubatch_print:   )embd       = \S+$")
_OUTPUT = re.compile(r"(?P<head>\S+ D ubatch_print:   )output     = \S+$")


def _with(lines_after: dict[re.Pattern[str], list[str]]) -> bytes:
    out: list[str] = []
    for line in STALE.read_bytes().decode("utf-8", "surrogateescape").split("\n"):
        out.append(line)
        for pattern, extra in lines_after.items():
            if (m := pattern.match(line)) is not None:
                out += [m["head"] + e for e in extra]
    return "\n".join(out).encode("utf-8", "surrogateescape")


@contextmanager
def _accelerated(on: bool) -> Iterator[None]:
    kept = walker._skim  # noqa: SLF001
    if not on:
        walker._skim = None  # noqa: SLF001
    try:
        yield
    finally:
        walker._skim = kept  # noqa: SLF001


def _same(a: analyze.ParseResult, b: analyze.ParseResult) -> None:
    for name in ("batches", "kv", "errors"):
        x, y = getattr(a, name), getattr(b, name)
        keep = [c for c in x.columns if c not in ("line", "evidence_line", "lines")]
        pd.testing.assert_frame_equal(x[keep], y[keep], obj=name)
    assert a.verdict.to_dict() | {"evidence": None, "source": None, "component_evidence": None} == \
        b.verdict.to_dict() | {"evidence": None, "source": None, "component_evidence": None}


@pytest.mark.parametrize("accelerated", [True, False], ids=["C", "python"])
@pytest.mark.parametrize("extra", [
    {_EMBD: ["embd_state = (nil)"], _OUTPUT: ["type       = (nil)"]},  # b11739's two lines
    {_EMBD: ["embd_state = 0x7f3a2c0052a0"], _OUTPUT: ["type       = 0x7f3a2c005310"]},  # set, as pointers
    {_OUTPUT: ["rope_pos   = (nil)", "n_future   = 7", "future_field_with_a_long_name = [ 0 1 ]"]},  # unknown ones
], ids=["nil", "pointers", "unknown"])
def test_new_header_lines_leave_the_dump_as_it_was(extra: dict[re.Pattern[str], list[str]], accelerated: bool) -> None:
    with _accelerated(accelerated):
        plain = analyze.parse(STALE.read_bytes())
        newer = analyze.parse(_with(extra))
    assert newer.lines > plain.lines
    assert len(plain.batches) > 30 and plain.batches["embd"].astype(bool).any()  # DFlash's embedding batches
    _same(plain, newer)


@pytest.mark.parametrize("message", [
    "init: entry 3 has neither a token id nor an embedding",
    "init: entries with both a token id and an embedding cannot be mixed with other entries",
    "init: this model or context does not support batches mixing token and embedding entries",
])
def test_the_reworded_input_checks_are_decode_failures(message: str) -> None:
    log = "\n".join([
        "0.00.074.655 I spec common_specu: adding speculative implementation 'draft-simple'",
        f"0.01.000.002 E {message}",
        "0.01.000.003 E decode: failed to initialize batch",
        "0.01.000.004 E llama_decode: failed to decode, ret = -1",
    ]) + "\n"
    r = analyze.parse(log.encode())
    assert list(r.errors["kind"].unique()) == ["decode_failed"]
    assert int(r.errors.iloc[0]["line"]) == 2  # the check opens the failure: it says why
    assert r.verdict.kind == "decode_failed"
