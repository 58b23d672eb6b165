"""raw.log is written the way llama.cpp's common_log prints: one prefix per entry, none on CONT pieces."""

from __future__ import annotations

import re
from pathlib import Path

from kvtrace.capture.engine.llama_log import CONT, DEBUG, ERROR, INFO, NONE, WARN, LogWriter, format_timestamp


def test_timestamp_fields() -> None:
    assert format_timestamp(0) == "0.00.000.000"
    assert format_timestamp(14 * 1_000_000 + 967 * 1000 + 966) == "0.14.967.966"
    # Minutes are neither padded nor wrapped at an hour.
    assert format_timestamp((125 * 60 + 3) * 1_000_000 + 7) == "125.03.000.007"


def test_prefix_per_entry_only(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / "raw.log", prefix=True)
    assert w.line == 1
    w.write(INFO, b"load_tensors: loading model tensors\n")
    w.write(CONT, b".")
    w.write(CONT, b".")
    w.write(CONT, b"\n")
    w.write(ERROR, b"init: first\n - second\n it is required: Y = X + 1\n")
    w.write(DEBUG, b"init: input batch info:\n")
    w.write(WARN, b"no newline, ")
    w.write(INFO, b"glued\n")
    w.write(NONE, b"plain output\n")
    assert w.line == 9  # eight newlines written
    w.close()
    lines = (tmp_path / "raw.log").read_bytes().split(b"\n")
    ts = rb"\d+\.\d{2}\.\d{3}\.\d{3}"
    assert re.fullmatch(ts + rb" I load_tensors: loading model tensors", lines[0])
    assert lines[1] == b".."
    assert re.fullmatch(ts + rb" E init: first", lines[2])
    assert lines[3:5] == [b" - second", b" it is required: Y = X + 1"]
    assert re.fullmatch(ts + rb" D init: input batch info:", lines[5])
    assert re.fullmatch(ts + rb" W no newline, " + ts + rb" I glued", lines[6])
    assert lines[7] == b"plain output"
    assert w.levels[CONT] == 3 and w.levels[ERROR] == 1


def test_no_prefix(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / "raw.log", prefix=False)
    w.write(ERROR, b"decode: failed to initialize batch\n")
    w.write(DEBUG, b"find_slot: stream[0] min[0] =     0, max[0] =   259\n")
    w.close()
    assert (tmp_path / "raw.log").read_bytes() == (
        b"decode: failed to initialize batch\nfind_slot: stream[0] min[0] =     0, max[0] =   259\n"
    )
