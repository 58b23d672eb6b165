"""Raw lines by number agree with the reader's line numbers, for plain, gzip and bytes sources."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvtrace import analyze
from kvtrace.analyze.dashboard.rawtext import RawText, capture_seconds, format_excerpt

ROOT = Path(__file__).resolve().parents[3]
SEED = ROOT / "tests" / "fixtures" / "corpus" / "00_beellama-28-multigpu-dflash-seed.log"
STALE = ROOT / "samples" / "stale-drafter"


@pytest.mark.parametrize("source", [SEED, STALE, STALE / "raw.log"])
def test_evidence_lines_are_where_the_reader_says(source: Path) -> None:
    result = analyze.parse(source)
    raw = RawText.open(source)
    assert raw.n_lines == result.lines
    assert result.verdict.evidence
    for ev in result.verdict.evidence:
        assert ev["text"].strip() in raw.line(ev["line"]), ev


def test_gzip_and_bytes_read_the_same_as_the_file(tmp_path: Path) -> None:
    data = (STALE / "raw.log").read_bytes()
    gz = tmp_path / "raw.log.gz"
    gz.write_bytes(gzip.compress(data))
    plain, zipped, mem = RawText.open(STALE), RawText.open(gz), RawText.open(gzip.compress(data))
    assert plain.n_lines == zipped.n_lines == mem.n_lines
    assert plain.around(1205, 3, 3) == zipped.around(1205, 3, 3) == mem.around(1205, 3, 3)


def test_crlf_ansi_and_edges() -> None:
    raw = RawText.open(b"one\r\n\x1b[31mE two\x1b[0m\r\nthree")
    assert raw.n_lines == 3
    assert raw.lines(0, 99) == [(1, "one"), (2, "E two"), (3, "three")]
    assert raw.line(4) == "" and raw.line(0) == ""
    assert RawText.open(b"").n_lines == 0
    assert RawText.open(b"a\n").n_lines == 1
    text = format_excerpt(raw.around(2, 1, 1), mark=2)
    assert text.splitlines() == ["   1 | one", ">> 2 | E two", "   3 | three"]


def test_capture_seconds_map_lines_to_chunk_arrival() -> None:
    data = b"a\nb\nc\nd\n"
    raw = RawText.open(data)
    # two chunks: "a\nb\n" at t=100.0 and "c\nd\n" at t=102.5
    chunks = pd.DataFrame({"t": [100.0, 102.5], "offset": [0, 4], "nbytes": [4, 4]})
    secs = capture_seconds(raw, chunks)
    np.testing.assert_allclose(secs[1:], [0.0, 0.0, 2.5, 2.5])
