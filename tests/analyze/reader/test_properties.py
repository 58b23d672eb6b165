"""Property tests: arbitrary bytes and mutated real logs never raise, and always give a verdict."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvtrace import analyze
from kvtrace.analyze.reader.normalize import ANSI
from kvtrace.analyze.reader.verdict import KINDS

CORPUS = sorted((Path(__file__).parents[2] / "fixtures" / "corpus").glob("*.log"))
REAL = [p.read_bytes() for p in CORPUS]
ANSI_BYTES = re.compile(ANSI.pattern.encode())  # the reader drops these as it drops carriage returns


def _check(data: bytes) -> None:
    r = analyze.parse(data)
    assert r.verdict.kind in KINDS
    assert r.verdict.n_position_errors >= 0
    if not data.startswith(b"\x1f\x8b"):
        # carriage returns and ANSI codes are dropped (a last fragment of nothing else is no line); breaks are kept
        text = ANSI_BYTES.sub(b"", data.replace(b"\r", b""))
        assert r.lines == text.count(b"\n") + (0 if not text or text.endswith(b"\n") else 1)
    for col in ("batches", "kv", "errors", "events"):
        assert getattr(r, col) is not None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4000))
@example(b"\x1b[A")  # found by hypothesis: a cursor-up code alone
def test_arbitrary_bytes(data: bytes) -> None:
    _check(data)


@st.composite
def mutated_log(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(REAL)))
    for _ in range(draw(st.integers(1, 12))):
        op = draw(st.sampled_from(["flip", "cut", "dup", "insert", "crlf", "nul"]))
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[i] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[i : i + draw(st.integers(1, 300))]
        elif op == "dup":
            j = draw(st.integers(i, min(len(data), i + 400)))
            data[j:j] = data[i:j]
        elif op == "insert":
            data[i:i] = draw(st.binary(max_size=40))
        elif op == "crlf":
            data[:] = data.replace(b"\n", b"\r\n")
        elif op == "nul":
            data[i:i] = b"\x00"
    return bytes(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_log())
def test_mutated_real_logs(data: bytes) -> None:
    _check(data)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(REAL), st.integers(1, 4096))
def test_chunking_never_changes_the_result(data: bytes, size: int) -> None:
    sp = analyze.StreamParser()
    for i in range(0, len(data), size):
        sp.feed(data[i : i + size])
    a = sp.finish().verdict.to_dict()
    b = analyze.parse(data).verdict.to_dict()
    assert a | {"source": ""} == b | {"source": ""}
