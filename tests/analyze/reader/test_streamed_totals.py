"""A streamed response's running totals are never summed (docs/llama-cpp-lines.md#the-servers-counters).

With `timings_per_token`, every chunk of a stream carries the response's `timings` so far, and `-v` logs each
chunk. A request cancelled mid-stream prints no per-request `draft acceptance` line, so the chunks are all the
log has. The fixture is a real llama-server b11434 run (draft-simple, `-v`): one streamed request with
`timings_per_token`, cancelled by its client after ten chunks (`stop: cancel task`); model paths shortened."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from kvtrace import analyze

LOG = Path(__file__).resolve().parents[2] / "fixtures" / "server" / "b11434-stream-timings-per-token-cancelled.log.gz"


def test_a_cancelled_streams_chunks_count_once() -> None:
    text = gzip.decompress(LOG.read_bytes()).decode("utf-8", "replace")
    assert "cancel task" in text and "draft acceptance =" not in text
    chunks = [json.loads(line.split("streamed chunk: data: ", 1)[1]) for line in text.splitlines()
              if "streamed chunk: data: {" in line]
    totals = [(c["timings"]["draft_n_accepted"], c["timings"]["draft_n"]) for c in chunks if "timings" in c]
    assert len(totals) >= 5 and len(set(totals)) > 1  # running totals, growing
    assert len({c["id"] for c in chunks}) == 1
    r = analyze.parse(LOG)
    acc = r.verdict.acceptance
    assert (acc["accepted"], acc["generated"]) == totals[-1]  # the last chunk's, not the chunks' sum
    summed = tuple(map(sum, zip(*totals, strict=True)))
    assert summed != totals[-1]

