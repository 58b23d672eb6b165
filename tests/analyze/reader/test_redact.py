"""The redaction table (analyze/reader/redact.py) against its own examples, the streaming redactor, `kvtrace redact`,
and the redacted copies of the real captures (scenario fixtures, the server head, the engine samples)
triaging exactly like the originals."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kvtrace import analyze
from kvtrace.analyze.reader.redact import (
    BY_NAME,
    PLACEHOLDER,
    RULES,
    Redactor,
    Rule,
    redact_bytes,
    redact_file,
    redact_session,
)
from kvtrace.analyze.reader.source import MAX_LINE

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures"
REAL_LOGS = sorted((FIXTURES / "scenarios").glob("*.log.gz")) + sorted((FIXTURES / "server").glob("*.log.gz")) + \
    sorted((ROOT / "samples").glob("*/raw.log"))

EXAMPLES = [pytest.param(r, src, want, id=f"{r.name}-{i}") for r in RULES for i, (src, want) in enumerate(r.examples)]


def kvtrace(*args: str, cwd: Path = ROOT, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "kvtrace.analyze", *args], cwd=cwd, capture_output=True, input=input,
                          timeout=120)


# ---------------------------------------------------------------- the table, entry by entry

def test_every_rule_has_examples_and_a_name_of_its_own() -> None:
    assert [r.name for r in RULES if not r.examples] == []
    assert len({r.name for r in RULES}) == len(RULES) == len(BY_NAME)
    assert all(r.what for r in RULES)


@pytest.mark.parametrize(("rule", "src", "want"), EXAMPLES)
def test_the_rule_redacts_its_example_to_what_it_says(rule: Rule, src: str, want: str) -> None:
    got, summary = redact_bytes(src.encode())
    assert got.decode() == want
    assert summary.lines == src.count("\n") + 1 == want.count("\n") + 1  # every line stays a line
    if src != want:
        assert summary.removed.get(rule.name, 0) >= 1  # counted under its own name


@pytest.mark.parametrize(("rule", "src", "want"), EXAMPLES)
def test_the_anchor_and_regex_are_the_examples_own(rule: Rule, src: str, want: str) -> None:
    first = src.split("\n")[0].encode()
    assert rule.anchor in first and rule.regex.search(first) is not None
    if not rule.every:
        # no earlier line shape takes it
        earlier = [r.name for r in RULES[: RULES.index(rule)] if not r.every and r.anchor in first
                   and r.regex.search(first) is not None]
        assert earlier == []


def test_text_goes_and_the_rest_of_the_line_stays() -> None:
    row = b"0.00.228.579 D ubatch_print:     1: id =    565 (             wr), pos =    1, n_seq_id =  1, " \
          b"seq_id = [0], output = 0"
    out, _ = redact_bytes(row)
    assert b" wr)" not in out and b"565" not in out
    assert out.endswith(b"), pos =    1, n_seq_id =  1, seq_id = [0], output = 0")
    # the slot's JSON keeps its numbers and settings, loses the prompt
    line = (b'D slot launch_slot_: id  0 | task -1 | launching slot : {"id":0,"n_prompt_tokens":82,'
            b'"params":{"temperature":0.8,"stop":["Quokka"]},"prompt":"<s> user: Zorblaxian","generated":"x"}')
    out, summary = redact_bytes(line)
    assert out == (b'D slot launch_slot_: id  0 | task -1 | launching slot : {"id":0,"n_prompt_tokens":82,'
                   b'"params":{"temperature":0.8,"stop":[]},"prompt":"[redacted]","generated":"[redacted]"}')
    assert summary.removed == {"json_text": 1, "json_tokens": 1}


def test_a_json_value_cut_off_at_the_end_of_the_line_goes_too() -> None:
    out, _ = redact_bytes(b'D Parsed message: {"role":"assistant","content":"Zorblaxian quokka')
    assert out == b'D Parsed message: {"role":"assistant","content":"[redacted]"'


def test_a_piece_cut_by_line_breaks_keeps_its_lines_and_loses_its_text() -> None:
    src = (b"0.01.099.488 D ubatch_print:    13: id =     14 (   secret\n"
           b"more secret\n"
           b"last), pos =   13, n_seq_id =  1, seq_id = [0], output = 0\n"
           b"0.01.099.490 D ubatch_print:    14: id =    261 (               a), pos =   14, n_seq_id =  1, "
           b"seq_id = [0], output = 0\n")
    out, summary = redact_bytes(src)
    assert out.split(b"\n") == [
        b"0.01.099.488 D ubatch_print:    13: id =      0 (      [redacted]",
        b"",
        b"), pos =   13, n_seq_id =  1, seq_id = [0], output = 0",
        b"0.01.099.490 D ubatch_print:    14: id =      0 (      [redacted]), pos =   14, n_seq_id =  1, "
        b"seq_id = [0], output = 0",
        b"",
    ]
    assert summary.removed == {"batch_token_cut": 3, "batch_token": 1} and summary.changed == 4


def test_a_quoted_piece_ends_at_its_quote_or_at_the_next_log_line() -> None:
    src = (b"0.02.158.158 D  - seq_id 0, draft candidate   1, pos   0:     14 (   0.052) 'a\n"
           b"b'\n"
           b"0.02.158.160 D  - seq_id 0, draft candidate   2, pos   0:     14 (   0.052) '\n"
           b"0.02.158.161 I srv  update_slots: all slots are idle\n")
    out, _ = redact_bytes(src)
    assert out.split(b"\n") == [
        b"0.02.158.158 D  - seq_id 0, draft candidate   1, pos   0:      0 (   0.052) '[redacted]'",
        b"",
        b"0.02.158.160 D  - seq_id 0, draft candidate   2, pos   0:      0 (   0.052) '[redacted]'",
        b"0.02.158.161 I srv  update_slots: all slots are idle",
        b"",
    ]


def test_line_breaks_and_untouched_bytes_are_kept_exactly() -> None:
    src = (b"\x1b[0m0.00.001.000 I srv  load_model: loading model 'm.gguf'\r\n"
           b"0.00.002.000 D Parsed message: {\"content\":\"hi \\u00e9\"}\r\n"
           b"bytes \xff\xfe that are not UTF-8\n"
           b"no line break at the end")
    out, summary = redact_bytes(src)
    assert out == (b"\x1b[0m0.00.001.000 I srv  load_model: loading model 'm.gguf'\r\n"
                   b"0.00.002.000 D Parsed message: {\"content\":\"[redacted]\"}\r\n"
                   b"bytes \xff\xfe that are not UTF-8\n"
                   b"no line break at the end")
    assert (summary.lines, summary.changed) == (4, 1)


def test_the_redactor_streams_in_any_chunks() -> None:
    src = b"".join(src.encode() + b"\n" for r in RULES for src, _ in r.examples) * 3
    whole, summary = redact_bytes(src)
    for size in (1, 7, 64, 4096):
        r = Redactor()
        out = b"".join(r.feed(src[i: i + size]) for i in range(0, len(src), size)) + r.close()
        assert out == whole and r.summary == summary


def test_a_line_longer_than_the_reader_reads_is_cut_where_the_reader_cuts_it() -> None:
    r = Redactor()
    long = b'{"content":"' + b"x" * (MAX_LINE + 10)
    out = r.feed(long[: MAX_LINE // 2]) + r.feed(long[MAX_LINE // 2:]) + r.feed(b'"}\nnext line\n') + r.close()
    assert out == b'{"content":"[redacted]"\nnext line\n'
    assert (r.summary.cut, r.summary.lines) == (1, 2)
    assert len(r._carry) == 0  # noqa: SLF001 - nothing of the long line is held any more


# ---------------------------------------------------------------- the summary and the command line

SMALL = "\n".join(src for name in ("batch_token", "draft_candidate", "json_text") for src, _ in BY_NAME[name].examples)


def test_the_summary_counts_the_lines_each_rule_changed(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(SMALL + "\n0.00.001 I srv  update_slots: all slots are idle\n", encoding="utf-8")
    summary = redact_file(log, tmp_path / "out.log")
    # two batch rows (one a special token, kept), one candidate, three JSON lines, one line untouched
    assert summary.to_dict() == {
        "lines": 7, "changed_lines": 5, "cut_lines": 0,
        "removed": {"batch_token": {"lines": 1, "what": BY_NAME["batch_token"].what},
                    "draft_candidate": {"lines": 1, "what": BY_NAME["draft_candidate"].what},
                    "json_text": {"lines": 3, "what": BY_NAME["json_text"].what}},
    }


def test_kvtrace_redact_writes_the_copy_and_says_what_it_removed(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(SMALL + "\n", encoding="utf-8")
    before = (log.read_bytes(), log.stat().st_mtime_ns)
    proc = kvtrace("redact", str(log), "-o", str(tmp_path / "shareable.log"), "--json")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "shareable.log"
    assert proc.stderr.decode().splitlines() == [
        f"kvtrace: wrote {out}: 5 of 6 lines redacted (prompts and answers removed; positions, sequences, sizes, "
        "errors and statistics kept)",
        f"kvtrace:           3  {BY_NAME['json_text'].what}",
        f"kvtrace:           1  {BY_NAME['batch_token'].what}",
        f"kvtrace:           1  {BY_NAME['draft_candidate'].what}",
    ]
    summary = json.loads(proc.stdout)
    assert summary["source"] == str(log) and summary["output"] == str(out)
    assert summary["changed_lines"] == 5 and summary["removed"]["json_text"]["lines"] == 3
    assert out.read_bytes() == redact_bytes(log.read_bytes())[0]
    assert (log.read_bytes(), log.stat().st_mtime_ns) == before  # the original is untouched


def test_kvtrace_redact_reads_stdin_and_gzip_and_writes_stdout(tmp_path: Path) -> None:
    data = (SMALL + "\n").encode()
    want = redact_bytes(data)[0]
    proc = kvtrace("redact", "-", "-o", "-", input=gzip.compress(data))
    assert proc.returncode == 0 and proc.stdout == want
    gz = tmp_path / "server.log.gz"
    gz.write_bytes(gzip.compress(data))
    assert kvtrace("redact", str(gz), "-o", str(tmp_path / "out.log")).returncode == 0
    assert (tmp_path / "out.log").read_bytes() == want


@pytest.mark.parametrize(("args", "message"), [
    (["nothere.log", "-o", "x.log"], "kvtrace: nothere.log: no such file; pass a log file, a session folder or - for "
                                     "stdin"),
    (["plain.log"], "kvtrace: plain.log: give -o SHAREABLE (a file, or - for stdout); only a session folder has a "
                    "default"),
    (["plain.log", "-o", "plain.log"], "kvtrace: plain.log: that is the log itself; redact into another file"),
    (["plain.log", "-o", "-", "--json"], "kvtrace: --json and -o - would both write to stdout: give -o a file"),
    (["plain.log", "-o", "no/such/folder/x.log"], None),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str | None) -> None:
    (tmp_path / "plain.log").write_text(SMALL, encoding="utf-8")
    proc = kvtrace("redact", *args, cwd=tmp_path)
    lines = proc.stderr.decode().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    if message is not None:
        assert lines == [message]
    assert (tmp_path / "plain.log").read_text(encoding="utf-8") == SMALL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.log"]  # nothing half-written left behind


def test_a_session_gets_its_shareable_copy_and_its_manifest_says_so(tmp_path: Path) -> None:
    from kvtrace.analyze.reader.session import SHAREABLE, new_session, read_manifest

    session = new_session("run", out=tmp_path / "s")
    session.raw_log.write_text(SMALL + "\n", encoding="utf-8")
    session.write_manifest({"ping_config": {"prompt": "Zorblaxian quokka", "n": 2}})
    raw = session.raw_log.read_bytes()
    summary = redact_session(session.path)
    assert (session.path / SHAREABLE).read_bytes() == redact_bytes(raw)[0]
    assert session.raw_log.read_bytes() == raw
    m = read_manifest(session.path)
    assert m["redacted"]["log"] == SHAREABLE and m["redacted"]["from"] == "raw.log"
    assert m["redacted"]["changed_lines"] == summary.changed == 5
    assert m["ping_config"] == {"prompt": PLACEHOLDER.decode(), "n": 2}  # --ping's prompt is the user's text too
    assert "Zorblaxian" not in session.manifest_path.read_text(encoding="utf-8")
    # `kvtrace redact SESSION` does the same, and the copy is read with the session's manifest (its flags)
    (session.path / SHAREABLE).unlink()
    assert kvtrace("redact", str(session.path)).returncode == 0
    assert (session.path / SHAREABLE).read_bytes() == redact_bytes(raw)[0]


# ---------------------------------------------------------------- real captures triage the same

def assert_triages_alike(original: analyze.ParseResult, redacted: analyze.ParseResult) -> None:
    """Same tables (positions, sequences, sizes, line numbers, events), same verdict, X/Y and acceptance."""
    for name in ("batches", "kv", "errors", "events"):
        pd.testing.assert_frame_equal(getattr(original, name), getattr(redacted, name), obj=name)
    a, b = original.verdict.to_dict(), redacted.verdict.to_dict()
    a.pop("source"), b.pop("source")
    assert a == b
    assert {k: v for k, v in original.meta.items() if k not in ("source", "bytes")} == \
        {k: v for k, v in redacted.meta.items() if k not in ("source", "bytes")}


TEXT_PIECE = re.compile(rb": id =\s*\d+ \((?!\s*(?:\[redacted\]|<[^<>\s]+>)(?:\)|$))", re.M)


@pytest.mark.parametrize("log", REAL_LOGS, ids=[f"{p.parent.name}/{p.name}" for p in REAL_LOGS])
def test_a_real_capture_redacted_triages_exactly_like_the_original(log: Path, tmp_path: Path) -> None:
    from kvtrace.analyze.reader.session import MANIFEST, SHAREABLE

    before = log.stat().st_mtime_ns
    out = tmp_path / SHAREABLE
    if (log.parent / MANIFEST).is_file():  # a session's copy is read with its manifest (the run's command line)
        shutil.copy(log.parent / MANIFEST, tmp_path / MANIFEST)
    summary = redact_file(log, out)
    raw = gzip.decompress(log.read_bytes()) if log.suffix == ".gz" else log.read_bytes()
    assert summary.changed > 0  # a capture without batch dumps (no LLAMA_BATCH_DEBUG) has no token rows to cut
    assert (summary.removed.get("batch_token", 0) > 0) == bool(TEXT_PIECE.search(raw))
    data = out.read_bytes()
    assert not TEXT_PIECE.search(data)  # no token row keeps text other than a special token
    assert not re.search(rb"(?:draft candidate|next token:)[^\n']*'(?!\[redacted\]'$)", data, re.M)
    assert not re.search(rb'"(?:content|prompt)":"(?!\[redacted\]"|")', data)
    assert_triages_alike(analyze.parse(log), analyze.parse(out))
    assert log.stat().st_mtime_ns == before


def test_the_statistics_in_a_redacted_response_are_read_as_before() -> None:
    from kvtrace.analyze.reader.patterns import BY_NAME as PATTERNS

    final_chunk = PATTERNS["json_draft_n"].examples[0]  # a real streamed chunk with timings and the prompt
    out, summary = redact_bytes(final_chunk.encode())
    assert b"the cache and the draft" in final_chunk.encode() and b"the cache and the draft" not in out
    entry = PATTERNS["json_draft_n"]
    assert entry.regex.search(out.decode()).groupdict() == entry.regex.search(final_chunk).groupdict()  # type: ignore[union-attr]
    assert summary.removed == {"json_text": 1}  # its token list and stop words are empty: nothing to remove
