"""`--fetch-links` (analyze/reader/links.py) on loopback: a real HTTP server on 127.0.0.1 serves the shapes a
thread links to (a GitHub `user-attachments` file gzipped, a zip of logs, a gist through the API, a raw `.txt`, a
redirect), and the bounds (size cap, timeout, private addresses, plain http) hold. Nothing is fetched unless asked."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvtrace import analyze
from kvtrace.analyze.reader.links import LinkPolicy, fetch_links, unpack
from kvtrace.analyze.reader.thread import read_thread
from kvtrace.analyze.views.report import github_comment
from tests.analyze.reader.test_thread import SEED, gh_json, report

SEED_TEXT = report(SEED)
ASSERT_TEXT = report("23_buun-21-dflash-assert-encode-nubatch.log")
OTHER_TEXT = report("33_llamafile-244-epoch-prefix-kv-free-space.log")


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


@dataclass
class Served:
    url: str
    requests: list[str] = field(default_factory=list)
    routes: dict[str, tuple[int, dict[str, str], bytes]] = field(default_factory=dict)


@pytest.fixture
def served() -> Iterator[Served]:
    """A real HTTP server on 127.0.0.1 (an ephemeral port) that records every request."""
    state = Served("")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            state.requests.append(self.path)
            if self.path == "/slow.log":
                time.sleep(3)
            status, headers, body = state.routes.get(self.path, (404, {}, b"not found"))
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    worker = threading.Thread(target=server.serve_forever, daemon=True)
    worker.start()
    gist = {"files": {
        "command.txt": {"filename": "command.txt", "truncated": False, "content": "llama-server -m t.gguf -md d.gguf\n"},
        "server.log": {"filename": "server.log", "truncated": True, "content": SEED_TEXT[:100],
                       "raw_url": f"{state.url}/gist-raw/abc123/server.log"},
    }}
    state.routes = {
        "/user-attachments/files/1/server.log.gz": (200, {"Content-Type": "application/gzip"},
                                                    gzip.compress(SEED_TEXT.encode())),
        "/user-attachments/files/2/logs.zip": (200, {"Content-Type": "application/zip"},
                                               _zip({"logs/server.log": ASSERT_TEXT.encode(),
                                                     "logs/screen.png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"})),
        "/gists/abc123": (200, {"Content-Type": "application/json"}, json.dumps(gist).encode()),
        "/gist-raw/abc123/server.log": (200, {"Content-Type": "text/plain"}, SEED_TEXT.encode()),
        "/raw/run.txt": (200, {"Content-Type": "text/plain"}, OTHER_TEXT.encode()),
        "/moved/run.log": (302, {"Location": "/raw/run.txt"}, b""),
        "/big.log": (200, {"Content-Type": "text/plain"}, b"x" * 300_000),
        "/slow.log": (200, {"Content-Type": "text/plain"}, b"late\n"),
        "/bomb.log.gz": (200, {}, gzip.compress(b"a" * 2_000_000)),
        "/image.txt": (200, {}, b"\x89PNG\r\n\x1a\n\x00\x00binary"),
    }
    yield state
    server.shutdown()
    server.server_close()


def policy(served: Served, **kw: float) -> LinkPolicy:
    return LinkPolicy(github_url=served.url, api_url=served.url, **kw)  # type: ignore[arg-type]


def thread_json(served: Served) -> bytes:
    return gh_json(f"DFlash breaks after a few turns. Log: [server.log.gz]({served.url}/user-attachments/files/1/server.log.gz)\n",
                   [("helper", "Can you attach the log of the crash too?"),
                    ("reporter", f"Here: {served.url}/user-attachments/files/2/logs.zip and my notes "
                                 "https://gist.github.com/reporter/abc123\n")])


def test_nothing_is_fetched_by_default(served: Served, tmp_path: Path) -> None:
    data = thread_json(served)
    got = analyze.parse(data, name="thread.json")
    assert got.verdict.kind == "no_log" and got.verdict.thread is not None
    assert len(got.verdict.thread["not_fetched"]) == 3 and got.verdict.thread["fetched"] == []
    (tmp_path / "thread.json").write_bytes(data)
    for cmd in (["triage", "--json"], ["report", "--format", "github"]):
        subprocess.run([sys.executable, "-m", "kvtrace.analyze", *cmd, str(tmp_path / "thread.json")], check=True,
                       capture_output=True, env={"PATH": "/usr/bin:/bin", "GITHUB_SERVER_URL": served.url})
    assert served.requests == []


def test_attachments_zips_and_gists_are_read_and_named(served: Served) -> None:
    got = analyze.parse(thread_json(served), name="thread.json", links=policy(served))
    v = got.verdict
    assert v.thread is not None
    fetched = {f["file"]: f for f in v.thread["fetched"]}
    # the .gz unpacked, the zip's text file read (its image left out), the gist's files (the cut one whole)
    assert set(fetched) == {"server.log", "logs.zip:logs/server.log", "gist abc123/command.txt",
                            "gist abc123/server.log"}
    assert fetched["server.log"]["part"] == "server.log (linked in the body)"
    assert fetched["logs.zip:logs/server.log"]["part"] == "logs.zip:logs/server.log (linked in comment 2)"
    assert v.thread["not_fetched"] == []
    # the seed's log, fetched, is what the verdict stands on, and the evidence names the file it came from
    assert (v.kind, v.component, v.last_pos, v.batch_start) == ("inconsistent_positions", "drafter", 259, 1361)
    assert v.thread["evidence_from"] == f"server.log (linked in the body) at {served.url}/user-attachments/files/1/server.log.gz"
    comment = github_comment(got)
    assert "**Evidence** from server.log (linked in the body)" in comment
    assert "**Linked logs read**" in comment and "logs.zip:logs/server.log" in comment
    assert "/gists/abc123" in served.requests and "/gist-raw/abc123/server.log" in served.requests


def test_raw_text_links_and_redirects(served: Served) -> None:
    thread = read_thread(gh_json(f"see {served.url}/moved/run.log"))
    assert thread is not None
    fetch_links(thread, policy(served))
    assert [(f["file"], f["bytes"]) for f in thread.fetched] == [("run.log", len(OTHER_TEXT.encode()))]
    assert served.requests == ["/moved/run.log", "/raw/run.txt"]
    assert thread.parts[-1].text == OTHER_TEXT


def test_size_cap_timeout_and_bombs_fail_in_one_line(served: Served) -> None:
    links = [f"{served.url}/big.log", f"{served.url}/slow.log", f"{served.url}/bomb.log.gz",
             f"{served.url}/image.txt", f"{served.url}/missing.log"]
    thread = read_thread(gh_json("\n".join(links)))
    assert thread is not None
    start = time.monotonic()
    fetch_links(thread, policy(served, max_bytes=100_000, max_text=1_000_000, timeout=1.0))
    assert time.monotonic() - start < 10
    errors = {f["url"].rsplit("/", 1)[1]: f["error"] for f in thread.fetched}
    assert errors == {
        "big.log": "300,000 bytes, over the 100,000-byte cap",
        "slow.log": "no answer within 1 s",
        "bomb.log.gz": "unpacks to over 1,000,000 bytes",
        "image.txt": "not text",
        "missing.log": "HTTP 404",
    }
    assert len(thread.parts) == 1  # nothing half-read became a part
    # and the verdict says which links were not read, and why
    got = analyze.parse(gh_json("\n".join(links)),
                        links=policy(served, max_bytes=100_000, max_text=1_000_000, timeout=1.0))
    assert got.verdict.thread is not None and len(got.verdict.thread["not_fetched"]) == 5
    assert "over the 100,000-byte cap" in github_comment(got)


def test_only_the_github_instance_may_be_plain_http_or_private(served: Served) -> None:
    # the same server under a name kvtrace was not told of: refused before any connection
    other = served.url.replace("127.0.0.1", "localhost")
    thread = read_thread(gh_json(f"{other}/raw/run.txt https://127.0.0.1:1/x.log https://10.0.0.1/y.log "
                                 "file:///etc/passwd.txt"))
    assert thread is not None
    fetch_links(thread, policy(served))
    assert served.requests == []
    assert [f["error"] for f in thread.fetched] == ["plain http: only https links are fetched",
                                                    "a private address: not fetched",
                                                    "a private address: not fetched"]


def test_unpack_by_content_not_name() -> None:
    assert [f.file for f in unpack("a.txt", gzip.compress(b"hello\n"))] == ["a.txt"]
    assert unpack("renamed.bin", _zip({"x.log": b"line\n"}))[0].text == "line\n"
    assert unpack("x.log.gz", gzip.compress(b"a") + gzip.compress(b"b"))[0].text == "ab"


def test_the_cli_fetches_when_asked(served: Served, tmp_path: Path) -> None:
    path = tmp_path / "thread.json"
    path.write_bytes(thread_json(served))
    run = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "triage", "--fetch-links", "--github-url", served.url,
                          "--github-api-url", served.url, str(path)], capture_output=True, text=True, check=True)
    assert "  fetched:  server.log (" in run.stdout and "evidence from: server.log (linked in the body)" in run.stdout
    bad = subprocess.run([sys.executable, "-m", "kvtrace.analyze", "triage", "--fetch-links", "--table", str(path)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--fetch-links" in bad.stderr
