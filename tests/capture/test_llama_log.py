"""raw.log is written the way llama.cpp's common_log prints: one prefix per entry, none on CONT pieces."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvtrace.capture.engine.llama_log import (
    CONT,
    DEBUG,
    ERROR,
    INFO,
    NONE,
    WARN,
    LogWriter,
    format_timestamp,
    json_object,
)


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


# -- --log-format jsonl: the objects b11434's --log-jsonl writes ----------------------------------------------

REAL_JSONL = Path(__file__).parents[1] / "fixtures" / "jsonl" / "b11434-escapes.jsonl"
LEVELS = {"debug": DEBUG, "info": INFO, "warn": WARN, "error": ERROR, "cont": CONT, "none": NONE}


def test_json_objects_escape_as_the_real_server_does() -> None:
    """Each real b11434 line is rebuilt byte for byte from the text llama.cpp logged: the bytes its text log would
    hold (the byte token 199 is the lone byte 0xC3 there, which the server wrote as U+FFFD)."""
    lines = REAL_JSONL.read_bytes().splitlines(keepends=True)
    assert len(lines) == 7 and json.loads(lines[-1])["level"] == "none"
    for line in lines:
        obj = json.loads(line)
        assert list(obj) == ["type", "time", "level", "msg"]
        text = obj["msg"].encode().replace("\ufffd".encode(), b"\xc3")
        assert json_object(LEVELS[obj["level"]], text, obj["time"]) == line
    assert sum("\ufffd".encode() in line for line in lines) == 1  # the case of a byte that is no UTF-8 is there


def test_json_object_escapes() -> None:
    got = json_object(ERROR, b'a"b\\c/d\x01\x1f\x7f\x08\x0c\r\t\n \xe2\x82 \xc3\xa9\xf0\x9f\x98\x80', 12)
    assert got == (b'{"type":"log","time":12,"level":"error","msg":"a\\"b\\\\c/d\\u0001\\u001f\x7f\\b\\f\\r\\t\\n '
                   + "\ufffd é😀".encode() + b'"}\n')
    assert json_object(NONE, b"", 0) == b'{"type":"log","time":0,"level":"none","msg":""}\n'


def test_jsonl_one_object_per_entry(tmp_path: Path) -> None:
    """Whatever newlines an entry holds (the X/Y block is one call), it is one object on one line; CONT pieces are
    objects of their own with their own time; no prefix letters anywhere."""
    w = LogWriter(tmp_path / "raw.log", prefix=True, log_format="jsonl")
    w.write(INFO, b"load_tensors: loading model tensors\n")
    w.write(CONT, b".")
    w.write(CONT, b"\n")
    w.write(ERROR, b"init: first\n - second\n it is required: Y = X + 1\n")
    w.write(WARN, b"no newline, ")
    w.write(INFO, b"glued\n")
    assert w.line == 7
    w.close()
    raw = (tmp_path / "raw.log").read_bytes()
    objects = [json.loads(line) for line in raw.splitlines()]
    assert [(o["type"], o["level"], o["msg"]) for o in objects] == [
        ("log", "info", "load_tensors: loading model tensors\n"), ("log", "cont", "."), ("log", "cont", "\n"),
        ("log", "error", "init: first\n - second\n it is required: Y = X + 1\n"), ("log", "warn", "no newline, "),
        ("log", "info", "glued\n"),
    ]
    times = [o["time"] for o in objects]
    assert all(isinstance(t, int) and t > 0 for t in times) and times == sorted(times)
    assert raw.count(b"\n") == 6 and not re.search(rb"\d+\.\d{2}\.\d{3}\.\d{3} [IWED] ", raw)


def test_jsonl_without_timestamps_writes_time_0(tmp_path: Path) -> None:
    w = LogWriter(tmp_path / "raw.log", prefix=False, log_format="jsonl")
    w.write(DEBUG, b"find_slot: stream[0] min[0] =     0, max[0] =   259\n")
    w.close()
    assert (tmp_path / "raw.log").read_bytes() == (
        b'{"type":"log","time":0,"level":"debug","msg":"find_slot: stream[0] min[0] =     0, max[0] =   259\\n"}\n'
    )
    with pytest.raises(ValueError, match="unknown log format 'json'"):
        LogWriter(tmp_path / "other.log", log_format="json")
