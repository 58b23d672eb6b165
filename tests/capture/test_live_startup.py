"""The live parse uses the triage's start-up rule (issue 36): on a real llama-server capture with memory fitting
on (draft-dflash, the server's defaults), the line llama.cpp calls normal ("dflash requires ctx_other ... this
warning is normal during memory fitting") is no error live, no TRIAGE line is printed, and the live count agrees
with the final triage of the same log."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

from kvtrace import analyze
from kvtrace.analyze import LiveParser
from kvtrace.capture.monitor import LiveParse, Terminal

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "scenarios" / "draft-dflash-defaults.log.gz"
NORMAL = b"dflash requires ctx_other to be set (this warning is normal during memory fitting)"


def _raw() -> bytes:
    data = gzip.decompress(CAPTURE.read_bytes())
    assert NORMAL in data  # the capture holds the line this is about
    return data


def test_the_live_count_never_counts_the_fitting_notice() -> None:
    data = _raw()
    final = analyze.parse(data)
    assert len(final.errors) == 0 and (final.events["kind"] == "startup_notice").any()
    live = LiveParser("raw.log")
    at = data.index(NORMAL)
    # fed as a capture's pump hands it over: cut right after the line, then in pieces to the end
    for start, end in [(0, at + len(NORMAL) + 2), *((i, i + 65536) for i in range(at + len(NORMAL) + 2, len(data),
                                                                                 65536))]:
        live.feed(data[start:end])
        assert live.stats().errors == 0, start
    assert live.stats().errors == len(final.errors)


def test_the_live_parse_prints_no_triage_for_it(tmp_path: Path) -> None:
    """The live parse as a capture runs it (its own process over raw.log): no TRIAGE line, 0 errors."""
    raw = tmp_path / "raw.log"
    raw.write_bytes(_raw())
    err = io.StringIO()
    live = LiveParse(raw, 0, Terminal(echo=False, status=False, err=err), interval_s=0.1)
    live.start()
    assert live.finish(raw.stat().st_size, wait_s=120)
    assert live.stats.errors == 0 and live.stats.batches > 0
    assert live.triage_printed == "" and "TRIAGE" not in err.getvalue()
