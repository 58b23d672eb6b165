"""A log's head parsed as a log that ends there (`parse_head`): what a big upload's first chart is drawn
from while the whole is parsed. Real engine output (the stale-drafter sample) repeated to a few MB."""

from __future__ import annotations

import gzip
from pathlib import Path

from kvtrace import analyze
from kvtrace.analyze.reader.parser import parse_head

ROOT = Path(__file__).resolve().parents[3]
RAW = (ROOT / "samples" / "stale-drafter" / "raw.log").read_bytes()


def test_the_head_is_the_parse_of_its_first_lines_and_says_how_far_it_read() -> None:
    data = RAW * 12  # 2.2 MB
    head = parse_head(data, max_bytes=1 << 20, name="big.log")
    assert not head.whole and head.size == len(data)
    assert 1 << 20 <= head.read < (1 << 20) + (128 << 10)  # whole lines, a little past the limit
    lines = head.result.lines
    assert 0 < lines < data.count(b"\n")
    # the same tables as the whole parse of the lines it read
    cut = b"".join(data.splitlines(keepends=True)[:lines])
    whole = analyze.parse(cut, name="big.log")
    assert head.result.batches.equals(whole.batches) and head.result.kv.equals(whole.kv)
    assert head.result.truncated  # never to be read as the whole log's verdict


def test_a_gzip_head_counts_the_text_read() -> None:
    data = gzip.compress(RAW * 40, mtime=0)
    head = parse_head(data, max_bytes=1 << 20, name="big.log.gz")
    assert not head.whole and head.size == len(data) and 1 << 20 <= head.read < 2 << 20
    assert len(head.result.batches) < len(analyze.parse(data, name="big.log.gz").batches)


def test_a_log_that_ends_within_the_head_is_whole() -> None:
    head = parse_head(RAW, max_bytes=4 << 20, name="raw.log")
    whole = analyze.parse(RAW, name="raw.log")
    assert head.whole and head.read == len(RAW) and not head.result.truncated
    assert head.result.verdict.to_dict() == whole.verdict.to_dict()
