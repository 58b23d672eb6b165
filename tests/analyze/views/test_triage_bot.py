"""The triage bot: `kvtrace reply` (analyze/views/reply.py) decides, and the sample workflow
(samples/github/kvtrace-triage.yml) carries it out. Its steps run here as a runner runs them (bash, curl, jq, the
installed kvtrace) against a real HTTP server on 127.0.0.1 that serves the thread the way GitHub's REST API returns
it (the issue object and its pages of comments, from GitHub's own example payloads) and records what the workflow
posts, edits and labels."""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from kvtrace import analyze
from kvtrace.analyze.views.reply import STATE_PREFIX, read_state, reply
from tests.analyze.reader.test_thread import SEED, gh_json, payload, report
from tests.analyze.views.test_report_github import assert_safe

ROOT = Path(__file__).resolve().parents[3]
WORKFLOW = ROOT / "samples" / "github" / "kvtrace-triage.yml"
BIN = Path(sys.executable).parent
BOT = "github-actions[bot]"
TOKEN = "ghs_test-token"
VERSION = "version: 11434 (0a1b2c3d)\nbuilt with GNU 12.2.0 for Linux x86_64\n"  # `llama-server --version`
PROSE = "The model crashes after a few requests."


@dataclass
class GitHub:
    """One issue (number 1 of o/r) as the REST API holds it, and what the workflow did to it."""

    url: str = ""
    issue: dict[str, Any] = field(default_factory=dict)
    comments: list[dict[str, Any]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)  # "POST /repos/...": the writes only
    labels: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)  # attachments served at /user-attachments/files/...
    next_id: int = 1000

    def comment(self, body: str, login: str = "reporter") -> dict[str, Any]:
        c = copy.deepcopy(payload("issue_comment-created")["comment"])
        self.next_id += 1
        c |= {"id": self.next_id, "body": body,
              "html_url": f"https://github.com/o/r/issues/1#issuecomment-{self.next_id}",
              "url": f"https://api.github.com/repos/o/r/issues/comments/{self.next_id}"}
        c["user"] = c["user"] | {"login": login, "type": "Bot" if login == BOT else "User"}
        self.comments.append(c)
        return c

    def own(self) -> list[dict[str, Any]]:
        return [c for c in self.comments if c["user"]["login"] == BOT]


@pytest.fixture
def github() -> Iterator[GitHub]:
    gh = GitHub()
    issue = copy.deepcopy(payload("issues-opened")["issue"])
    issue |= {"number": 1, "html_url": "https://github.com/o/r/issues/1"}
    gh.issue = issue

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, doc: Any = None, raw: bytes | None = None) -> None:
            body = raw if raw is not None else json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if raw is None else "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorised(self) -> bool:
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._send(401, {"message": "Bad credentials"})
                return False
            return True

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            url = urlsplit(self.path)
            if url.path.startswith("/user-attachments/files/"):  # attachments: public, no token
                name = url.path.removeprefix("/user-attachments/files/")
                self._send(200, raw=gh.files[name]) if name in gh.files else self._send(404, {})
                return
            if not self._authorised():
                return
            if url.path == "/repos/o/r/issues/1":
                self._send(200, gh.issue | {"comments": len(gh.comments)})
            elif url.path == "/repos/o/r/issues/1/comments":
                q = parse_qs(url.query)
                per, page = int(q.get("per_page", ["30"])[0]), int(q.get("page", ["1"])[0])
                self._send(200, gh.comments[(page - 1) * per: page * per])
            else:
                self._send(404, {"message": "Not Found"})

        def _write(self, method: str) -> None:
            if not self._authorised():
                return
            doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            path = urlsplit(self.path).path
            gh.calls.append(f"{method} {path}")
            if method == "POST" and path == "/repos/o/r/issues/1/comments":
                self._send(201, gh.comment(doc["body"], BOT))
            elif method == "PATCH" and (m := re.fullmatch(r"/repos/o/r/issues/comments/(\d+)", path)):
                found = [c for c in gh.comments if c["id"] == int(m[1])]
                if found:
                    found[0]["body"] = doc["body"]
                self._send(200 if found else 404, found[0] if found else {})
            elif method == "POST" and path == "/repos/o/r/issues/1/labels":
                gh.labels += doc["labels"]
                self._send(200, [{"name": n} for n in gh.labels])
            else:
                self._send(404, {"message": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            self._write("POST")

        def do_PATCH(self) -> None:  # noqa: N802
            self._write("PATCH")

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    gh.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield gh
    server.shutdown()
    server.server_close()


def workflow() -> dict[Any, Any]:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


def run_step(step: dict[str, Any], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """One `run:` step as a runner runs it: its script in a file, `bash --noprofile --norc -eo pipefail`."""
    script = cwd / "step.sh"
    script.write_text(step["run"], encoding="utf-8")
    values = {"${{ github.token }}": TOKEN, "${{ github.repository }}": "o/r",
              "${{ github.event.issue.number }}": "1", "${{ vars.KVTRACE_PIP }}": env.get("KVTRACE_PIP", "")}
    step_env = env | {k: values[v] for k, v in step.get("env", {}).items()}
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], env=step_env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def run_workflow(gh: GitHub, tmp_path: Path) -> str:
    """Every step after the install (kvtrace is this checkout's, on PATH as the install step would put it);
    the steps' output."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    runner = tmp_path / "runner"
    runner.mkdir()
    doc = workflow()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "KVTRACE_"))}
    env |= {k: str(v) for k, v in doc["env"].items()}
    env |= {"PATH": f"{BIN}:{os.environ['PATH']}", "RUNNER_TEMP": str(runner), "GITHUB_PATH": str(tmp_path / "path"),
            "GITHUB_API_URL": gh.url, "GITHUB_SERVER_URL": gh.url, "GITHUB_REPOSITORY": "o/r"}
    (job,) = doc["jobs"].values()
    out = []
    for step in job["steps"][1:]:
        done = run_step(step, env, tmp_path)
        assert done.returncode == 0, f"{step['name']}: {done.stdout}{done.stderr}"
        out.append(done.stdout + done.stderr)
    return "".join(out)


def safe(comment: str) -> None:
    """The bot's comment: safe as any kvtrace comment, plus its one hidden state line (kvtrace's own words)."""
    lines = comment.splitlines()
    assert lines[1].startswith(STATE_PREFIX) and re.fullmatch(r"<!-- kvtrace:state [\w=. -]* -->", lines[1])
    assert_safe("\n".join(lines[:1] + lines[2:]) + "\n")


def test_the_pin_is_required(tmp_path: Path) -> None:
    (job,) = workflow()["jobs"].values()
    install = job["steps"][0]
    assert install["env"] == {"KVTRACE_PIP": "${{ vars.KVTRACE_PIP }}"}
    env = {"PATH": os.environ["PATH"], "RUNNER_TEMP": str(tmp_path), "GITHUB_PATH": str(tmp_path / "path")}
    done = run_step(install, env | {"KVTRACE_PIP": ""}, tmp_path)
    assert done.returncode == 1
    assert done.stdout.startswith("::error title=kvtrace triage::KVTRACE_PIP is not set. Set the repository variable")
    assert "archive/COMMIT.tar.gz" in done.stdout and not (tmp_path / "kvtrace").exists()
    # the commit-hash pin the comment shows is a 40-digit commit
    assert re.search(r"archive/[0-9a-f]{40}\.tar\.gz", WORKFLOW.read_text())


def test_a_good_comment_stays_when_a_later_comment_holds_only_the_version(github: GitHub, tmp_path: Path) -> None:
    github.issue["body"] = report(SEED) + "\n$(touch pwned) `touch pwned2`"
    out = run_workflow(github, tmp_path / "first")
    assert github.calls == ["POST /repos/o/r/issues/1/comments", "POST /repos/o/r/issues/1/labels"]
    assert github.labels == ["drafter-kv"]
    (mine,) = github.own()
    good = mine["body"]
    assert read_state(good) == {"kind": "inconsistent_positions", "signature": "stale_drafter_kv", "side": "drafter",
                                "proof": "log"}
    assert "X = 259, Y = 1361" in good and "**Evidence** from the issue body" in good
    safe(good)
    assert "post: a log proves the verdict" in out
    # the reporter answers the checklist with `--version` output: the thread's verdict is the same, the comment stays
    github.comment(VERSION)
    github.calls.clear()
    out = run_workflow(github, tmp_path / "version")
    assert github.calls == [] and mine["body"] == good
    assert "none: the verdict is unchanged" in out
    assert not list(tmp_path.rglob("pwned*"))


def test_prose_gets_only_what_is_missing_once_then_the_log_edits_it(github: GitHub, tmp_path: Path) -> None:
    github.issue["body"] = PROSE
    run_workflow(github, tmp_path / "prose")
    assert github.calls == ["POST /repos/o/r/issues/1/comments"]  # no label: nothing is proved
    (mine,) = github.own()
    missing = mine["body"]
    assert "### kvtrace triage: waiting for a log" in missing and "**What is missing**" in missing
    assert "failing side" not in missing and "Signature" not in missing and "**Next steps:**" not in missing
    assert read_state(missing) is not None and read_state(missing)["proof"] == "prose"  # type: ignore[index]
    safe(missing)
    # another sentence: nothing posted again
    github.comment("Any update? It still crashes.")
    github.calls.clear()
    run_workflow(github, tmp_path / "again")
    assert github.calls == [] and mine["body"] == missing
    # a log arrives as an attachment: fetched, and the verdict it proves replaces the checklist
    github.files["7/server.log.gz"] = gzip.compress(report(SEED).encode())
    github.comment(f"Log attached: [server.log.gz]({github.url}/user-attachments/files/7/server.log.gz)")
    run_workflow(github, tmp_path / "log")
    assert github.calls == [f"PATCH /repos/o/r/issues/comments/{mine['id']}", "POST /repos/o/r/issues/1/labels"]
    assert len(github.own()) == 1
    edited = mine["body"]
    assert "stale_drafter_kv" in edited and "**Evidence** from server.log (linked in comment 3) by @&#8203;reporter" in edited
    assert "**Linked logs read**" in edited
    safe(edited)


def test_a_thread_without_a_log_gets_the_checklist_once(github: GitHub, tmp_path: Path) -> None:
    run_workflow(github, tmp_path / "one")  # the example payload's issue: no log, no failure told
    run_workflow(github, tmp_path / "two")
    assert github.calls == ["POST /repos/o/r/issues/1/comments"]
    assert "There is no llama.cpp log in this thread yet" in github.own()[0]["body"]


def test_many_comments_are_read_page_by_page(github: GitHub, tmp_path: Path) -> None:
    github.issue["body"] = PROSE
    for i in range(205):
        github.comment(f"+1 ({i})")
    github.comment(report(SEED))
    run_workflow(github, tmp_path)
    (mine,) = github.own()
    assert "stale_drafter_kv" in mine["body"] and "comment 206" in mine["body"]


def test_only_the_bots_own_marked_comment_counts() -> None:
    # a stranger's comment that opens with the marker is neither read nor taken for the bot's
    spoof = "<!-- kvtrace:triage -->\n<!-- kvtrace:state kind=inconsistent_positions signature=stale_drafter_kv " \
            "side=drafter proof=log -->\n"
    got = analyze.parse(gh_json(report(SEED), [("mallory", spoof)]))
    assert got.thread is not None and [p.author for p in got.thread.own] == ["mallory"]
    r = reply(got, BOT)
    assert (r.action, r.comment_id) == ("post", None)
    ours = analyze.parse(gh_json(report(SEED), [(BOT, r.body)]))
    again = reply(ours, BOT)
    assert (again.action, again.comment_id) == ("none", 1)  # gh's comment URL gives its REST id


def test_reply_cli_says_what_to_do_in_json(tmp_path: Path) -> None:
    thread = tmp_path / "thread.json"
    thread.write_bytes(gh_json(report(SEED)))
    done = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "reply", str(thread), "--bot", BOT, "-o",
                           str(tmp_path / "c.md")], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == {"action": "post", "comment_id": None, "reason": "a log proves the verdict: posted",
                                       "kind": "inconsistent_positions", "signature": "stale_drafter_kv",
                                       "side": "drafter", "proof": "log"}
    log = tmp_path / "server.log"
    log.write_text(report(SEED))
    bad = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "reply", str(log), "--bot", BOT, "-o",
                          str(tmp_path / "c.md")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a GitHub thread" in bad.stderr


def test_a_newer_log_that_changes_the_verdict_edits_the_comment() -> None:
    crash = report("23_buun-21-dflash-assert-encode-nubatch.log")
    first = reply(analyze.parse(gh_json(crash)), BOT)
    assert first.action == "post" and first.proof == "log" and first.kind == "other"
    # the same log pasted again changes nothing; the seed's log (a stale drafter) changes the verdict
    same = reply(analyze.parse(gh_json(crash, [(BOT, first.body), ("reporter", crash)])), BOT)
    assert (same.action, same.comment_id) == ("none", 1)
    newer = reply(analyze.parse(gh_json(crash, [(BOT, first.body), ("reporter", report(SEED))])), BOT)
    assert (newer.action, newer.comment_id, newer.signature) == ("edit", 1, "stale_drafter_kv")
    assert read_state(newer.body) == {"kind": "inconsistent_positions", "signature": "stale_drafter_kv",
                                      "side": "drafter", "proof": "log"}
