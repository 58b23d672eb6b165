"""llama.cpp's structured log (`--log-jsonl`, b11434; docs/jsonl.md) read as its text form, everywhere a log is read.

The JSON logs are built to llama.cpp's format (common/log.cpp): one object per log call,
`{"type":"log","time":<microseconds>,"level":"debug|info|warn|error|cont|none","msg":"..."}`, a call that prints
several lines (the X/Y block) as one object whose `msg` holds the newlines, `LOG_CONT` pieces as `"level":"cont"`
objects, and typed events as `{"type":T,"data":{...}}`. `as_jsonl` writes a real engine capture's calls so;
the hand-built lines below are written out whole."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from kvtrace import analyze
from kvtrace.analyze.cli import cli
from kvtrace.analyze.reader.jsonl import JsonlLog

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "fixtures" / "jsonl" / "position-error.jsonl"  # built by hand (its README.md)
STALE = ROOT / "samples" / "stale-drafter" / "raw.log"  # a real engine capture of the stale-drafter fault
# the fields of a verdict that do not depend on where its lines sit in the input
SAME = ("kind", "component", "seq_id", "last_pos", "batch_start", "n_position_errors", "n_errors", "n_batches",
        "n_resets", "acceptance")
_CALL = re.compile(r"(?P<m>\d+)\.(?P<s>\d\d)\.(?P<ms>\d{3})\.(?P<us>\d{3}) (?:(?P<lvl>[IWED]) )?")
_LEVEL = {"I": "info", "W": "warn", "E": "error", "D": "debug", None: "none"}

# b11434's typed event (common/fit.cpp) and a type a later build may add: both must pass through
FIT = ('{"type":"fit_memory_breakdown","data":{"unit":"MiB","rows":[{"device":"CUDA0","model":1400,"context":512,'
       '"compute":300,"free":20000}]}}')
UNKNOWN = '{"type":"spec_step","data":{"slot":0,"drafted":3,"accepted":1}}'


def as_jsonl(text: str) -> str:
    """A text log's calls as `--log-jsonl` writes them: a prefixed line starts a call, the unprefixed lines
    after it (the X/Y block's) are the same call's `msg`, which ends in its newline."""
    calls: list[dict[str, Any]] = []
    for line in text.split("\n"):
        m = _CALL.match(line)
        if m is None and calls:
            calls[-1]["msg"] += line + "\n"
            continue
        if m is None:
            calls.append({"type": "log", "time": 0, "level": "none", "msg": line + "\n"})
            continue
        us = ((int(m["m"]) * 60 + int(m["s"])) * 1000 + int(m["ms"])) * 1000 + int(m["us"])
        calls.append({"type": "log", "time": us, "level": _LEVEL[m["lvl"]], "msg": line[m.end():] + "\n"})
    if calls and calls[-1]["msg"] == "\n":
        calls.pop()  # the text's last newline
    return "".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) + "\n" for c in calls)


def _text() -> str:
    return STALE.read_bytes().decode("utf-8", "surrogateescape")


def _write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[analyze.ParseResult, analyze.ParseResult, Path]:
    folder = tmp_path_factory.mktemp("jsonl")
    jsonl = _write(folder / "raw.jsonl", as_jsonl(_text()))
    return analyze.parse(str(STALE)), analyze.parse(str(jsonl)), jsonl


def _same_tables(text: analyze.ParseResult, jl: analyze.ParseResult) -> None:
    for name in ("batches", "kv", "errors"):
        a, b = getattr(text, name), getattr(jl, name)
        keep = [c for c in a.columns if c not in ("line", "last_line", "evidence_line", "lines")]
        pd.testing.assert_frame_equal(a[keep].reset_index(drop=True), b[keep].reset_index(drop=True),
                                      check_dtype=False, obj=name)
    assert {k: text.verdict.to_dict()[k] for k in SAME} == {k: jl.verdict.to_dict()[k] for k in SAME}


def test_a_jsonl_capture_reads_as_its_text(pair: tuple[analyze.ParseResult, analyze.ParseResult, Path]) -> None:
    text, jl, _ = pair
    _same_tables(text, jl)
    assert jl.verdict.kind == text.verdict.kind != "healthy"
    assert jl.batches["t"].notna().all() and (jl.batches["t"] > 0).any()  # `time` became `t`
    assert jl.meta["log_format"] == "jsonl" and text.meta["log_format"] == "text"
    assert jl.meta["log_jsonl"]["objects"] > 1000 and jl.meta["log_jsonl"]["text_lines"] == 0
    assert text.meta["log_jsonl"] == {} and text.meta["fit_memory_breakdown"] == []


def test_the_xy_block_is_one_object_and_one_file_line(
        pair: tuple[analyze.ParseResult, analyze.ParseResult, Path]) -> None:
    text, jl, path = pair
    lines = path.read_bytes().split(b"\n")
    first = jl.errors.iloc[0]
    assert first["kind"] == "inconsistent_positions"
    line = lines[int(first["line"]) - 1]
    assert b"inconsistent sequence positions:\\n - the last position" in line  # the record sits on the object
    assert jl.lines == len(lines) - 1 < text.lines  # the file's lines, each block one of them
    assert jl.verdict.last_pos == text.verdict.last_pos == 17


def test_stdin_and_a_live_stream_read_it_the_same(
        pair: tuple[analyze.ParseResult, analyze.ParseResult, Path]) -> None:
    _, jl, path = pair
    data = path.read_bytes()
    live = analyze.StreamParser("live")
    half = len(data) // 2 // 777 * 777
    for i in range(0, len(data), 777):  # chunks cut anywhere, as a growing raw.log arrives
        live.feed(data[i:i + 777])
        if i == half:
            mid = live.snapshot()
            assert mid.meta["log_format"] == "jsonl" and len(mid.batches)
    done = live.finish()
    _same_tables(jl, done)
    assert list(done.batches["line"]) == list(jl.batches["line"])
    piped = analyze.parse(data)
    assert list(piped.errors["line"]) == list(jl.errors["line"])


def test_a_split_read_falls_back_to_serial(pair: tuple[analyze.ParseResult, analyze.ParseResult, Path]) -> None:
    _, jl, path = pair
    split = analyze.parse(str(path), jobs=2, piece_bytes=64 << 10)
    _same_tables(jl, split)
    assert list(split.batches["line"]) == list(jl.batches["line"])


def test_stderr_text_cont_pieces_and_typed_events() -> None:
    """stdout's JSON and stderr's text merged in one raw.log, in order; `cont` pieces joined to their line
    whatever came between; the typed events kept, the unknown one passed through."""
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()
    assert lines[1] == FIT and lines[4] == UNKNOWN and '"level":"cont"' in lines[5] and not lines[9].startswith("{")
    path = FIXTURE
    r = analyze.parse(str(path))
    assert r.meta["log_format"] == "jsonl"
    assert r.meta["spec_impls"] == ["draft-simple"]
    assert r.meta["fit_memory_breakdown"] == [json.loads(FIT)["data"]]
    assert r.meta["log_jsonl"]["events"] == {"fit_memory_breakdown": 1, "spec_step": 1}
    assert r.meta["log_jsonl"]["other_events"] == [{"type": "spec_step", "line": 5, "data": json.loads(UNKNOWN)["data"]}]
    assert r.meta["log_jsonl"]["text_lines"] == 1 and r.meta["log_jsonl"]["objects"] == 7
    assert r.verdict.acceptance is not None and (r.verdict.acceptance["accepted"], r.verdict.acceptance["generated"]) == (1, 3)  # cont joined
    assert (r.verdict.last_pos, r.verdict.batch_start) == (259, 1361)
    errors = r.errors
    assert int(errors.iloc[0]["line"]) == 7  # the block's object
    assert r.lines == 10


def test_the_shortest_object_and_others_convert_alike() -> None:
    """The fast path (one line, nothing escaped) and json.loads give the same text; `time` 0 (timestamps off)
    gives no prefix, as the text log prints none."""
    a = JsonlLog(0, 0).convert('{"type":"log","time":1116440,"level":"warn","msg":"x = 1\\n"}\n')
    b = JsonlLog(0, 0).convert('{"type": "log", "time": 1116440, "level": "warn", "msg": "x = 1\\n"}\n')
    assert a == b == "0.01.116.440 W x = 1\n"
    assert JsonlLog(0, 0).convert('{"type":"log","time":0,"level":"info","msg":"y\\n"}\n') == "y\n"


def test_not_json_and_broken_objects_read_as_text(tmp_path: Path) -> None:
    """A cut object, a request body quoting one and prose are read as the lines they are, with no error."""
    lines = ['{"type":"log","time":5,"level":"info","msg":"cut', 'request: {"type": "log"}',
             "just text with \"type\" in it"]
    r = analyze.parse("\n".join(lines).encode())
    assert r.meta["log_format"] == "text" and r.lines == 3


def test_a_pasted_jsonl_block_in_a_thread_triages_as_its_text(tmp_path: Path) -> None:
    text = "\n".join(_text().split("\n")[:1420])  # the log up to its first X/Y failure and the lines after it
    threads = {}
    for name, body in (("text", text), ("jsonl", as_jsonl(text))):
        comment = f"Here is my log with `--log-jsonl`:\n\n```\n{body}\n```\n\nThanks!"
        path = tmp_path / f"{name}.gh.json"
        path.write_bytes(json.dumps({"title": "crash", "body": "It crashes.", "comments": [
            {"author": {"login": "u"}, "body": comment, "createdAt": "2026-01-01T00:00:00Z"}]},
            ensure_ascii=False).encode("utf-8", "surrogateescape"))
        run = CliRunner().invoke(cli, ["triage", "--json", str(path)])
        assert run.exit_code in (0, 1, 2, 3), run.output
        threads[name] = json.loads(run.stdout)
    t, j = threads["text"], threads["jsonl"]
    verdict = {k: t["verdict"][k] for k in SAME} if "verdict" in t else {k: t[k] for k in SAME}
    assert verdict == ({k: j["verdict"][k] for k in SAME} if "verdict" in j else {k: j[k] for k in SAME})
    assert verdict["kind"] != "healthy" and verdict["last_pos"] == 17


def test_a_session_folder_with_a_jsonl_raw_log(tmp_path: Path) -> None:
    folder = tmp_path / "session"
    folder.mkdir()
    (folder / "manifest.json").write_bytes((STALE.parent / "manifest.json").read_bytes())
    _write(folder / "raw.log", as_jsonl(_text()))
    r = analyze.parse(str(folder))
    assert r.meta["log_format"] == "jsonl"
    assert r.verdict.kind == analyze.parse(str(STALE.parent)).verdict.kind
