"""Events' details are decoded once, by the reader: the typed columns say what the line said."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from kvtrace import analyze
from kvtrace.analyze.reader.records import SUMMED_STATS, detail_of, lines_of

ROOT = Path(__file__).resolve().parents[3]
LOGS = sorted((ROOT / "tests" / "fixtures" / "corpus").glob("*.log")) + [
    ROOT / "samples" / name / "raw.log" for name in ("healthy", "stale-drafter", "no-rollback")]
PER_REQUEST = re.compile(r"draft acceptance = [\d.]+ \(\s*(\d+) accepted /\s*(\d+) generated\)")


def _int(v: object) -> int | None:
    return None if v is None else int(str(v))


def _cell(v: object) -> int | None:
    return None if v is None or v is pd.NA else int(str(v))


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.parent.name if p.name == "raw.log" else p.stem[:40])
def test_the_typed_columns_say_what_the_detail_says(log: Path) -> None:
    ev = analyze.parse(log).events
    for row in ev.itertuples():
        d = json.loads(row.detail)
        if "pattern" in d:
            assert row.pattern == d["pattern"]
        assert _cell(row.slot) == _int(d.get("slot"))
        acc, gen = _cell(row.accepted), _cell(row.generated)
        if row.kind == "accepted":
            assert (acc, gen) == (_int(d.get("accepted")), _int(d.get("drafted")))
        elif row.pattern == "spec_statistics":
            assert (acc, gen) == (_int(d.get("acc_tokens")), _int(d.get("gen_tokens")))
        elif row.kind == "draft_stats" and row.pattern in SUMMED_STATS:
            assert acc == _int(d.get("accepted", 0))
        elif row.kind != "draft_stats":
            assert (acc, gen) == (None, None), row


def test_per_request_lines_win_over_the_run_totals() -> None:
    log = ROOT / "samples" / "stale-drafter" / "raw.log"
    pairs = [(int(a), int(g)) for a, g in PER_REQUEST.findall(log.read_text(encoding="utf-8"))]
    assert len(pairs) >= 2  # and the log also has `statistics dflash` totals, which must not be added in
    acc = analyze.parse(log).verdict.acceptance
    assert (acc["accepted"], acc["generated"]) == (sum(a for a, _ in pairs), sum(g for _, g in pairs))


def test_the_one_decoder_reads_bad_text_as_empty() -> None:
    assert detail_of('{"pattern": "seq_rm", "slot": 0}') == {"pattern": "seq_rm", "slot": 0}
    assert detail_of("not json") == detail_of("[1, 2]") == detail_of(None) == {}
    assert lines_of('[[3, "decode: failed"]]') == [(3, "decode: failed")]
    assert lines_of("{") == lines_of(None) == []
