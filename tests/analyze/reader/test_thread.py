"""A GitHub thread as input (analyze/reader/thread.py): gh's JSON, the REST API's issue and comments, an Actions event.

The fixtures are real reports (tests/fixtures/corpus/) put into GitHub's own example payloads and gh's
documented shape (tests/fixtures/github/README.md); each must give the verdict its plain paste gives."""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kvtrace import analyze
from kvtrace.analyze.reader.thread import read_thread
from tests.conftest import CORPUS, FIXTURES, corpus_labels

GITHUB = FIXTURES / "github"
SEED = "00_beellama-28-multigpu-dflash-seed.log"
SEED_GH = GITHUB / "beellama-28.gh.json"
NAMES = sorted(corpus_labels())
# the fields of a verdict that do not depend on where its lines sit in the input
SAME = ("kind", "component", "seq_id", "last_pos", "batch_start", "n_position_errors", "n_errors", "n_batches",
        "n_resets", "acceptance")


def payload(name: str) -> dict[str, Any]:
    return json.loads((GITHUB / f"{name}.payload.json").read_text(encoding="utf-8"))


def report(name: str) -> str:
    return (CORPUS / name).read_text(encoding="utf-8", errors="replace")


def source_of(name: str) -> str:
    """The report's GitHub URL, from labels.json."""
    source = json.loads((CORPUS / "labels.json").read_text())[name]["source"]
    return source[source.index("https://"):].rstrip(")")


def gh_json(body: str, comments: Sequence[tuple[str, str]] = (), title: str = "a report") -> bytes:
    """`gh issue view N --json title,body,comments` output (gh's field names)."""
    return json.dumps({"body": body, "comments": [
        {"author": {"login": login}, "authorAssociation": "NONE", "body": text, "createdAt": "2026-01-01T00:00:00Z",
         "id": f"IC_{i}", "includesCreatedEdit": False, "isMinimized": False, "minimizedReason": "",
         "reactionGroups": [], "url": f"https://github.com/o/r/issues/1#issuecomment-{i}", "viewerDidAuthor": False}
        for i, (login, text) in enumerate(comments, 1)], "title": title}, indent=2).encode()


def rest_issue(body: str | None) -> dict[str, Any]:
    """The REST API's issue object: the example payload's issue (same fields), with this body."""
    issue = copy.deepcopy(payload("issues-opened")["issue"])
    issue["body"] = body
    return issue


def rest_comment(body: str, login: str = "Codertocat") -> dict[str, Any]:
    comment = copy.deepcopy(payload("issue_comment-created")["comment"])
    comment["body"] = body
    comment["user"]["login"] = login
    return comment


def verdict(data: bytes, name: str = "thread.json") -> dict[str, Any]:
    return analyze.parse(data, name=name).verdict.to_dict()


@pytest.fixture(scope="module")
def plain() -> dict[str, dict[str, Any]]:
    return {name: analyze.parse(CORPUS / name).verdict.to_dict() for name in NAMES}


def same_verdict(got: dict[str, Any], want: dict[str, Any], offset: int = 0) -> None:
    assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}
    assert [(e["line"] - offset, e["text"]) for e in got["evidence"]] == [(e["line"], e["text"]) for e in want["evidence"]]
    if want["component_evidence"] is not None:
        assert got["component_evidence"] == want["component_evidence"] + offset


@pytest.mark.parametrize("name", NAMES)
def test_a_report_as_gh_body_reads_as_its_paste(name: str, plain: dict[str, dict[str, Any]]) -> None:
    text = report(name)
    got = verdict(gh_json(text.replace("\n", "\r\n")))  # a browser's CRLF
    same_verdict(got, plain[name])
    assert got["thread"]["shape"] == "gh"
    assert got["thread"]["evidence_from"] == ("body" if got["evidence"] else None)
    assert plain[name]["thread"] is None


@pytest.mark.parametrize("name", NAMES)
def test_a_report_as_a_new_comment_event_reads_as_its_paste(name: str, plain: dict[str, dict[str, Any]]) -> None:
    """An issue_comment event: the example's issue body (no log), then the report as the new comment."""
    event = payload("issue_comment-created")
    event["comment"]["body"] = report(name)
    got = verdict(json.dumps(event).encode())
    body_lines = event["issue"]["body"].count("\n") + 2  # the body's line, then the blank line between parts
    same_verdict(got, plain[name], offset=body_lines)
    thread = got["thread"]
    assert thread["shape"] == "event"
    assert [p["part"] for p in thread["parts"]] == ["body", "comment"]
    if got["evidence"]:
        url = event["comment"]["html_url"]
        assert thread["evidence_from"] == f"comment by @{event['comment']['user']['login']} at {url}"


REST_NAMES = ["01_beellama-27-dflash-drafter-consecutive.log", "08_llamacpp-17316-http500-seq2-parallel.log",
              "13_llamacpp-4185-docker-compose-kv-free-space.log", "33_llamafile-244-epoch-prefix-kv-free-space.log",
              "41_llamacpp-10547-draft-model-kv-ret1-after-gen-draft.log", "57_llamacpp-pr18211-per-round-accepted-draft-OK.log"]


@pytest.mark.parametrize("name", REST_NAMES)
def test_rest_shapes_and_issue_events_read_as_the_paste(name: str, plain: dict[str, dict[str, Any]]) -> None:
    text = report(name)
    want = plain[name]
    # the REST issue object, the body holding the report
    same_verdict(verdict(json.dumps(rest_issue(text)).encode()), want)
    # its comments (a JSON array): a first comment without a log, then the report
    first = "Same here on two GPUs, @maintainer any idea?"
    got = verdict(json.dumps([rest_comment(first, "someone"), rest_comment(text)]).encode())
    same_verdict(got, want, offset=first.count("\n") + 2)
    assert got["thread"]["shape"] == "rest-comments"
    if want["evidence"]:
        assert got["thread"]["evidence_from"].startswith("comment 2 by @Codertocat at https://github.com/")
    # `jq -s . issue.json comments.json`: the issue (no log, body null), then the list of its comments
    got = verdict(json.dumps([rest_issue(None), [rest_comment(first), rest_comment(text)]]).encode())
    same_verdict(got, want, offset=1 + first.count("\n") + 2)
    assert [p["part"] for p in got["thread"]["parts"]] == ["body", "comment 1", "comment 2"]
    # issues opened and edited: the report is the issue body (an edit's old text is not read)
    for event_name in ("issues-opened", "issues-edited"):
        event = payload(event_name)
        event["issue"]["body"] = text
        event["changes"] = {"body": {"from": report(SEED)}}
        same_verdict(verdict(json.dumps(event).encode()), want)


def test_seed_as_gh_json_says_drafter_and_y_1361() -> None:
    """The issue's own example: `gh issue view 28 --json title,body,comments > t.json; kvtrace triage t.json`."""
    out = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "triage", "--json", str(SEED_GH)], capture_output=True,
                         text=True, check=True)
    v = json.loads(out.stdout)
    assert (v["kind"], v["component"], v["seq_id"], v["last_pos"], v["batch_start"]) == (
        "inconsistent_positions", "drafter", 0, 259, 1361)
    thread = v["thread"]
    assert thread["evidence_from"] == "body"
    assert [(p["part"], p["author"]) for p in thread["parts"]] == [("body", ""), ("comment 1", "Anbeeld")]
    doc = json.loads(SEED_GH.read_text())
    body_lines = doc["body"].split("\r\n")
    assert thread["parts"][0] == {"part": "body", "author": "", "url": "", "first_line": 1,
                                  "last_line": len(body_lines)}
    for e in v["evidence"]:  # the evidence's lines are the body's own lines
        assert body_lines[e["line"] - 1].strip() == e["text"]
    text = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "triage", str(SEED_GH)], capture_output=True, text=True,
                          check=True).stdout
    assert "verdict:  inconsistent_positions (drafter" in text and "Y = 1361" in text
    assert "  thread:   GitHub issue, 2 parts (body and comments); evidence from: body\n" in text


def test_every_command_reads_a_thread(tmp_path: Path) -> None:
    """parse, report and stdin see the thread too (the reader core decodes it, not a command)."""
    out = tmp_path / "tables"
    run = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "parse", str(SEED_GH), "-o", str(out), "--json"],
                         capture_output=True, text=True, check=True)
    assert json.loads(run.stdout)[0]["kind"] == "inconsistent_positions"
    assert json.loads((out / "verdict.json").read_text())["batch_start"] == 1361
    md = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "report", "-"], input=SEED_GH.read_bytes(),
                        capture_output=True, check=True).stdout.decode()
    assert "X = 259" in md and "Y = 1361" in md
    # the dashboard's upload: bytes with the uploaded file's name
    assert analyze.parse(SEED_GH.read_bytes(), name="t.json").verdict.batch_start == 1361


def test_linked_logs_are_listed_not_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*_a: object, **_k: object) -> None:
        raise AssertionError("kvtrace opened a connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    body = ("Full log: [server.log](https://github.com/user-attachments/files/123456/server.log).\n"
            "![screenshot](https://github.com/user-attachments/assets/0a1b2c3d)\n"
            "also https://gist.github.com/someone/0123abcd and <https://example.org/logs/run-2.txt>,\n"
            "docs at https://example.org/guide.html\n")
    thread = verdict(gh_json(body, [("other", "again: https://gist.github.com/someone/0123abcd")]))["thread"]
    assert thread["not_fetched"] == ["https://github.com/user-attachments/files/123456/server.log",
                                     "https://gist.github.com/someone/0123abcd",
                                     "https://example.org/logs/run-2.txt"]
    text = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "triage", "-"], input=gh_json(body), capture_output=True,
                          check=True).stdout.decode()
    assert "  not fetched: https://github.com/user-attachments/files/123456/server.log\n" in text


def test_other_json_and_bracketed_logs_read_as_text() -> None:
    # JSON that is no thread
    assert read_thread(b'{"model": "x", "body_size": 3}') is None
    assert analyze.parse(b'{"a": 1}\n', name="x.json").verdict.kind == "no_log"
    # a log whose lines start with `[` (epoch prefix, speaker tags) or JSON lines: read as the log it is
    epoch = (CORPUS / "33_llamafile-244-epoch-prefix-kv-free-space.log").read_bytes()
    unfenced = epoch.replace(b"```\n", b"\n").lstrip(b"\n")  # the paste without its fence: starts `[1718...]`
    for data in (unfenced, (CORPUS / SEED).read_bytes()):
        assert data[:1] == b"["
        assert analyze.parse(data).thread is None
    assert analyze.parse(unfenced).verdict.kind == analyze.parse(epoch).verdict.kind == "kv_slot"
    assert analyze.parse((CORPUS / SEED).read_bytes()).verdict.batch_start == 1361
    lines = b'{"level": "info", "msg": "start"}\n' + (CORPUS / REST_NAMES[0]).read_bytes()
    assert analyze.parse(lines).verdict.kind == "inconsistent_positions"


def test_rest_issue_without_body_and_with_a_comment_count() -> None:
    """The REST issue object's `comments` is a count and its body may be null: a thread with nothing to read."""
    issue = rest_issue(None)
    assert isinstance(issue["comments"], int)
    got = verdict(json.dumps(issue).encode())
    assert got["kind"] == "no_log"
    assert got["thread"]["shape"] == "rest" and len(got["thread"]["parts"]) == 1
    assert got["thread"]["url"] == issue["html_url"]


def test_a_title_is_not_read() -> None:
    """The seed's title quotes the error (`Y = 1360 ... Y = X + 1`); it is not a log line."""
    title = json.loads(SEED_GH.read_text())["title"]
    assert "Y = 1360" in title
    assert verdict(gh_json("no log here", title=title))["kind"] == "no_log"


def gh_issue_list(reports: Sequence[tuple[int, str]]) -> bytes:
    """`gh issue list --json number,title,body,comments,url` output: a list of issues in gh's field names, the seed
    thread's own (tests/fixtures/github/beellama-28.gh.json) first, then each report as an issue's body."""
    seed = json.loads(SEED_GH.read_text(encoding="utf-8"))
    issues = [{**seed, "number": 28, "url": "https://github.com/Anbeeld/beellama.cpp/issues/28"}]
    issues += [{**json.loads(gh_json(report(name), title=name)), "number": number,
                "url": f"https://github.com/o/r/issues/{number}"} for number, name in reports]
    return json.dumps(issues, indent=2).encode()


LISTED = ((7, "33_llamafile-244-epoch-prefix-kv-free-space.log"), (9, REST_NAMES[0]))


def _triage_rows(*args: str) -> tuple[int, list[dict[str, str]], str]:
    import csv

    run = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "triage", "--table", "--csv", *args], capture_output=True,
                         text=True)
    return run.returncode, list(csv.DictReader(run.stdout.splitlines())), run.stderr


def test_a_list_of_issues_is_one_report_each(tmp_path: Path, plain: dict[str, dict[str, Any]]) -> None:
    """A maintainer's `gh issue list --json ...` of open bugs: each issue is triaged on its own, `FILE#NUMBER`,
    with the verdict its paste gives; `FILE#NUMBER` reads that issue alone."""
    issues = tmp_path / "bugs.json"
    issues.write_bytes(gh_issue_list(LISTED))
    code, rows, _ = _triage_rows(str(issues))
    assert code == 0
    assert sorted(r["report"] for r in rows) == ["bugs.json#28", "bugs.json#7", "bugs.json#9"]
    by = {r["report"]: r for r in rows}
    assert (by["bugs.json#28"]["signature"], by["bugs.json#28"]["y"]) == ("stale_drafter_kv", "1361")
    for number, name in LISTED:
        assert by[f"bugs.json#{number}"]["kind"] == plain[name]["kind"]
    one = analyze.parse(f"{issues}#9").verdict.to_dict()
    same_verdict(one, plain[REST_NAMES[0]])
    assert one["thread"]["url"] == "https://github.com/o/r/issues/9" and one["source"].endswith("bugs.json#9")


def test_a_folder_of_saved_threads_is_read_and_other_json_is_left_alone(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "28.json").write_bytes(SEED_GH.read_bytes())  # gh issue view 28 --json ... > 28.json
    (folder / "open.json").write_bytes(gh_issue_list(LISTED[:1]))
    (folder / "labels.json").write_text('{"28.json": {"expected": {"kind": "x"}}}')  # JSON that is no thread
    (folder / "server.log").write_bytes((CORPUS / SEED).read_bytes())
    code, rows, _ = _triage_rows(str(folder))
    assert code == 0
    assert sorted(r["report"] for r in rows) == ["28.json", "open.json#28", "open.json#7", "server.log"]


def test_an_issue_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    issues = tmp_path / "bugs.json"
    issues.write_bytes(gh_issue_list(LISTED))
    for source, says in ((f"{issues}#5", "no issue 5 in this list of GitHub issues; pass the file alone"),
                         (f"{SEED_GH}#28", "this file is one GitHub thread, not a list of issues; pass it without #28"),
                         (f"{CORPUS / SEED}#2", "not a list of GitHub issues; pass the file without #2")):
        run = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "triage", source], capture_output=True, text=True)
        assert run.returncode == 2 and run.stderr.count("\n") == 1 and says in run.stderr, run.stderr


def test_a_list_of_issues_read_as_one_input_says_how_to_read_each(tmp_path: Path) -> None:
    """The dashboard's upload (bytes) and `parse -` read one input: a list of issues is read as its text, with a
    warning that names the command reading each issue."""
    result = analyze.parse(gh_issue_list(LISTED), name="bugs.json")
    assert result.thread is None
    assert result.warnings == ["bugs.json: a list of 3 GitHub issues, read here as one text; kvtrace triage --table "
                               "FILE reads each issue as its own report"]
