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



SCENARIO = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios" / "draft-simple-1slot.log.gz"


def test_the_same_totals_in_two_wordings_count_once() -> None:
    """A real b11434 capture (four streamed requests, draft-simple) pasted without its per-request lines and
    LLAMA_TRACE's per-step lines: the
    drafts are told again by each response's `timings` and by the `statistics draft-simple:` line, the
    implementation's running total after each request. One wording counts, the running total by its last line:
    the run's totals, as the per-request lines sum them (and never the wordings added, or every running total)."""
    import re

    lines = gzip.decompress(SCENARIO.read_bytes()).decode("utf-8", "replace").splitlines(keepends=True)
    full = "".join(lines)
    per_request = [(int(a), int(g)) for a, g in re.findall(r"\(\s*(\d+) accepted /\s*(\d+) generated\)", full)]
    running = re.findall(r"#gen tokens =\s*(\d+), #acc tokens =\s*(\d+)", full)
    assert len(per_request) == len(running) == 4
    want = tuple(map(sum, zip(*per_request, strict=True)))
    assert (int(running[-1][1]), int(running[-1][0])) == want  # the last running total is the run's
    # run without LLAMA_TRACE: its per-step lines (`accepted  A/ N draft tokens`, every step) are not there either
    traced = re.compile(r"accepted +\d+/ *\d+ draft tokens\s*$")
    lines = [line for line in lines if not traced.search(line)]
    pasted = "".join(line for line in lines if "draft acceptance =" not in line)
    acc = analyze.parse(pasted.encode(), name="pasted").verdict.acceptance
    assert (acc["accepted"], acc["generated"]) == want, acc
    # the first request alone: 23 + 23 was the old reading of such a pair
    first_end = next(i for i, line in enumerate(lines) if '"draft_n":' in line)
    one = "".join(line for line in lines[:first_end + 1] if "draft acceptance =" not in line)
    acc = analyze.parse(one.encode(), name="one").verdict.acceptance
    assert (acc["accepted"], acc["generated"]) == per_request[0], acc
