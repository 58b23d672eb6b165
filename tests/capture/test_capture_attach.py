"""`kvtrace capture attach`: a followed file, stdin, llama-swap's log stream; live triage and --until-error."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.capture.capture_helpers import (
    file_contains,
    kvtrace_argv,
    manifest,
    run_kvtrace,
    start_kvtrace,
    wait_for,
    write_script,
)

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
ERROR_LOG = CORPUS / "01_beellama-27-dflash-drafter-consecutive.log"
OK_LOG = CORPUS / "16_club3090-1106-deepseek-draft-acceptance-OK.log"


def test_follow_survives_truncation_and_rotation(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    rotated = tmp_path / "server.log.1"
    log.write_bytes(b"a1\na2\n")
    out = tmp_path / "s"
    w = start_kvtrace("capture", "attach", "--file", str(log), "--follow", "--quiet", "--out", str(out),
                      cwd=tmp_path)
    raw = out / "raw.log"
    try:
        wait_for(file_contains(raw, b"a2\n"), what="existing content")
        with open(log, "ab") as f:
            f.write(b"a3 appended\n")
        wait_for(file_contains(raw, b"a3 appended\n"), what="appended line")
        # copytruncate-style rotation: the same file, emptied in place, then written again
        with open(log, "r+b") as f:
            f.truncate(0)
        with open(log, "ab") as f:
            f.write(b"b1\n")
        wait_for(file_contains(raw, b"b1\n"), what="line after truncation")
        # rename-style rotation: a late line still lands in the old file, then a new file appears
        os.rename(log, rotated)
        with open(rotated, "ab") as f:
            f.write(b"b2 late line in the rotated file\n")
        log.write_bytes(b"c1 in the new file\nc2\n")
        wait_for(file_contains(raw, b"c2\n"), what="new file after rotation")
        w.send_signal(signal.SIGINT)
        w.wait(30)
    finally:
        w.kill()
    assert raw.read_bytes() == b"a1\na2\na3 appended\nb1\nb2 late line in the rotated file\nc1 in the new file\nc2\n"
    err = w.stderr.read().decode() if w.stderr else ""
    assert "was truncated" in err and "was rotated" in err
    m = manifest(out)
    assert m["kind"] == "attach" and m["attach"]["follow"] is True
    assert m["stop_reason"] == "signal SIGINT"


def test_file_without_follow_reads_once(tmp_path: Path) -> None:
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "attach", "--file", str(OK_LOG), "--quiet", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    assert (out / "raw.log").read_bytes() == OK_LOG.read_bytes()
    assert manifest(out)["stop_reason"] == "end of input"


def test_missing_file_is_a_one_line_error(tmp_path: Path) -> None:
    proc = run_kvtrace("capture", "attach", "--file", str(tmp_path / "nope.log"), "--root", str(tmp_path / "r"),
                       cwd=tmp_path)
    assert proc.returncode == 2
    err = proc.stderr.decode().strip()
    assert err.startswith("kvtrace: error: cannot read") and "\n" not in err
    assert not (tmp_path / "r").exists()


def test_stdin_is_captured_byte_exact_and_the_first_error_is_triaged_live(tmp_path: Path) -> None:
    data = ERROR_LOG.read_bytes()
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "attach", "--stdin", "--out", str(out), cwd=tmp_path, input=data)
    assert (out / "raw.log").read_bytes() == data
    assert proc.stdout == data  # echoed unless --quiet
    err = proc.stderr.decode()
    assert "kvtrace: TRIAGE:" in err
    assert proc.returncode == 0  # the capture is complete; what the log shows is the triage's business
    m = manifest(out)
    assert m["live"]["stats"]["errors"] >= 1
    assert m["live"]["triage"].startswith("kvtrace: TRIAGE:")


def test_until_error_stops_after_the_grace_period(tmp_path: Path, py: str) -> None:
    child = write_script(tmp_path / "fails_then_hangs.py", """
        import os, sys, time
        os.write(2, open(sys.argv[1], "rb").read())
        time.sleep(600)
    """)
    out = tmp_path / "s"
    t0 = time.monotonic()
    proc = run_kvtrace("capture", "run", "--quiet", "--until-error", "--grace", "1", "--stop-wait", "2",
                       "--out", str(out), "--", py, str(child), str(ERROR_LOG), cwd=tmp_path, timeout=60)
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 1
    m = manifest(out)
    assert m["stop_reason"] == "until-error"
    assert m["program"]["signals_sent"] == ["SIGINT"]
    # Everything it printed, then its own KeyboardInterrupt traceback after the polite SIGINT.
    assert (out / "raw.log").read_bytes().startswith(ERROR_LOG.read_bytes())
    assert "kvtrace: TRIAGE:" in proc.stderr.decode()  # printed even with --quiet


class _SwapHandler(http.server.BaseHTTPRequestHandler):
    """llama-swap's /logs/stream/{model} endpoint: a chunked text stream (stands in for the Go binary)."""

    lines: list[bytes] = []
    seen_paths: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.seen_paths.append(self.path)
        if not self.path.startswith("/logs/stream/my-model"):
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for line in self.lines:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
            time.sleep(0.002)
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def swap_server() -> Iterator[str]:
    _SwapHandler.lines = OK_LOG.read_bytes().splitlines(keepends=True)
    _SwapHandler.seen_paths = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SwapHandler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_llama_swap_stream_is_captured_with_the_dropped_lines_warning(tmp_path: Path, swap_server: str) -> None:
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "attach", "--llama-swap", swap_server, "--model", "my-model", "--quiet",
                       "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "llama-swap drops log lines when a reader falls behind" in proc.stderr.decode()
    assert _SwapHandler.seen_paths == ["/logs/stream/my-model?no-history"]
    assert (out / "raw.log").read_bytes() == OK_LOG.read_bytes()
    m = manifest(out)
    assert m["attach"]["source"] == "llama-swap" and "drops log lines" in m["attach"]["warning"]


def test_llama_swap_unknown_model_is_a_one_line_error(tmp_path: Path, swap_server: str) -> None:
    proc = run_kvtrace("capture", "attach", "--llama-swap", swap_server, "--model", "other", "--root",
                       str(tmp_path / "r"), cwd=tmp_path)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.decode().splitlines() if "error" in ln]
    assert lines == [f"kvtrace: error: llama-swap answered HTTP 404 for {swap_server}/logs/stream/other?no-history"]


def test_attach_wants_exactly_one_source(tmp_path: Path) -> None:
    proc = run_kvtrace("capture", "attach", "--stdin", "--file", "x.log", cwd=tmp_path)
    assert proc.returncode == 2
    assert "give exactly one of" in proc.stderr.decode()


def test_stdin_redirected_from_a_file(tmp_path: Path) -> None:
    # A regular file on stdin cannot be spliced: the capture falls back to reading it.
    out = tmp_path / "s"
    with open(OK_LOG, "rb") as f:
        proc = subprocess.run(kvtrace_argv() + ["capture", "attach", "--stdin", "--quiet", "--out", str(out)],
                              stdin=f, capture_output=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert (out / "raw.log").read_bytes() == OK_LOG.read_bytes()


def test_follow_from_end_skips_what_is_already_there(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"old line\n")
    out = tmp_path / "s"
    w = start_kvtrace("capture", "attach", "--file", str(log), "--follow", "--from-end", "--quiet", "--timeout",
                      "20", "--out", str(out), cwd=tmp_path)
    try:
        wait_for(lambda: (out / "manifest.json").exists(), what="capture start")
        time.sleep(0.5)
        with open(log, "ab") as f:
            f.write(b"new line\n")
        wait_for(file_contains(out / "raw.log", b"new line\n"), what="appended line")
        w.send_signal(signal.SIGTERM)
        w.wait(30)
    finally:
        w.kill()
    assert (out / "raw.log").read_bytes() == b"new line\n"
    assert w.returncode == 128 + signal.SIGTERM


def test_any_url_that_streams_a_log_is_captured(tmp_path: Path, swap_server: str) -> None:
    out = tmp_path / "s"
    url = f"{swap_server}/logs/stream/my-model"
    proc = run_kvtrace("capture", "attach", "--url", url, "--quiet", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "llama-swap" not in proc.stderr.decode()
    assert _SwapHandler.seen_paths == ["/logs/stream/my-model"]
    assert (out / "raw.log").read_bytes() == OK_LOG.read_bytes()
    assert manifest(out)["attach"] == {"source": "url", "url": url}


def test_the_library_returns_the_outcome_and_prints_no_summary(tmp_path: Path,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    from kvtrace import capture

    out = tmp_path / "s"
    outcome = capture.run_attach(capture.FileSource(OK_LOG), capture.CaptureOptions(out=out))
    assert (outcome.reason, outcome.exit_code, outcome.session) == ("end of input", 0, out)
    assert outcome.bytes == OK_LOG.stat().st_size and outcome.startup_lines is None
    assert outcome.manifest["attach"] == {"source": "file", "path": str(OK_LOG), "follow": False, "from_end": False}
    said = capfd.readouterr()
    assert said.out == "" and said.err == f"kvtrace: session: {out}\n"  # what happens; the end is the caller's
