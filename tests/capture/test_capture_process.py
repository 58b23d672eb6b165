"""`kvtrace capture run` against small child programs that misbehave in the ways real servers do."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kvtrace.analyze.reader.session import free_port, load_chunks
from tests.capture.capture_helpers import (
    end_lines,
    file_contains,
    kvtrace_argv,
    manifest,
    pid_alive,
    run_kvtrace,
    start_kvtrace,
    wait_for,
    write_script,
)

BURST = """
import os, sys
n, copy_path = int(sys.argv[1]), sys.argv[2]
with open(copy_path, "wb") as copy:
    block, fd = [], 1
    for i in range(n):
        tag = b"out" if fd == 1 else b"err"
        block.append(b"%s line %07d of the burst, some payload to make it longer\\n" % (tag, i))
        if len(block) == 4096:
            data = b"".join(block)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            copy.write(data)
            block = []
            fd = 2 if fd == 1 else 1  # stderr and stdout interleave; one pipe keeps their order
    data = b"".join(block)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    copy.write(data)
"""


def test_burst_of_a_million_lines_is_byte_exact(tmp_path: Path, py: str) -> None:
    child = write_script(tmp_path / "burst.py", BURST)
    copy = tmp_path / "what-the-child-wrote.log"
    out = tmp_path / "s"
    proc = run_kvtrace(
        "capture",
        "run",
        "--quiet",
        "--out",
        str(out),
        "--",
        py,
        str(child),
        "1000000",
        str(copy),
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    raw = (out / "raw.log").read_bytes()
    expected = copy.read_bytes()
    assert raw.count(b"\n") == 1_000_000
    assert raw == expected  # none lost, order kept, byte-exact
    chunks = pq.read_table(out / "chunks.parquet").to_pandas()
    assert not (out / "chunks.journal").exists()  # folded into chunks.parquet
    assert chunks["nbytes"].sum() == len(raw)
    assert (chunks["offset"].diff().dropna() > 0).all()
    assert chunks["t"].is_monotonic_increasing
    m = manifest(out)
    assert m["program"]["returncode"] == 0
    assert m["stop_reason"] == "program exited"
    assert m["bytes"] == len(raw)


def test_the_program_writes_raw_log_itself_and_helpers_after_it_are_kept(tmp_path: Path, py: str) -> None:
    """No pipe between the program and the disk (a burst runs at `CMD > file` speed); stdout and stderr are
    raw.log, one file position, so their order is the order written. A helper the program leaves behind
    writes on after it exits: the capture waits for it (as it would for a pipe's last writer)."""
    child = write_script(tmp_path / "where.py", """
        import os, subprocess, sys, time
        os.write(1, (os.readlink("/proc/self/fd/1") + "\\n").encode())
        os.write(2, (os.readlink("/proc/self/fd/2") + "\\n").encode())
        subprocess.Popen([sys.executable, "-c", "import os, time; time.sleep(0.2); os.write(2, b'helper\\\\n')"])
    """)
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "run", "--quiet", "--out", str(out), "--", py, str(child), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()
    raw = (out / "raw.log").read_bytes()
    lines = raw.decode().splitlines()
    assert lines == [str((out / "raw.log").resolve())] * 2 + ["helper"]
    m = manifest(out)
    assert m["bytes"] == len(raw) and m["program"]["returncode"] == 0
    chunks = load_chunks(out)
    assert int(chunks["nbytes"].sum()) == len(raw)


def test_crash_mid_line_keeps_the_partial_line(tmp_path: Path, py: str) -> None:
    child = write_script(
        tmp_path / "crash.py",
        """
        import os
        os.write(2, b"srv  load_model: loading model\\n")
        os.write(1, b"half a line with no newl")
        os.abort()
    """,
    )
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "run", "--out", str(out), "--", py, str(child), cwd=tmp_path)
    assert proc.returncode == 1
    assert (out / "raw.log").read_bytes() == b"srv  load_model: loading model\nhalf a line with no newl"
    m = manifest(out)
    assert m["program"]["signal"] == "SIGABRT"
    assert m["exit_code"] == 1
    assert b"SIGABRT" in proc.stderr


def test_never_healthy_gives_a_clear_message_and_a_manifest(tmp_path: Path, py: str) -> None:
    child = write_script(
        tmp_path / "sleepy.py",
        """
        import sys, time
        print("pretending to load a model", flush=True)
        time.sleep(600)
    """,
    )
    port = free_port()
    out = tmp_path / "s"
    t0 = time.monotonic()
    proc = run_kvtrace(
        "capture",
        "run",
        "--ping",
        "2",
        "--health-timeout",
        "1.5",
        "--stop-wait",
        "2",
        "--out",
        str(out),
        "--",
        py,
        str(child),
        "--port",
        str(port),
        cwd=tmp_path,
        timeout=60,
    )
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 1
    err = proc.stderr.decode()
    assert f"no healthy answer from http://127.0.0.1:{port}/health within 1.5 s" in err
    assert "Traceback" not in err
    m = manifest(out)
    assert m["stop_reason"] == "ping failed"
    assert m["ping"]["healthy"] is False and m["ping"]["sent"] == 0
    assert m["program"]["signals_sent"][0] == "SIGINT"
    assert not pid_alive(m["program"]["pid"])
    assert b"pretending to load a model" in (out / "raw.log").read_bytes()


POLITE = """
import signal, sys, time, os
def bye(signum, frame):
    os.write(1, b"child: got %s, shutting down\\n" % signal.Signals(signum).name.encode())
    sys.exit(0)
signal.signal(signal.SIGINT, bye)
signal.signal(signal.SIGTERM, bye)
os.write(1, b"child: ready\\n")
while True:
    time.sleep(0.1)
"""

STUBBORN = """
import signal, time, os
signal.signal(signal.SIGINT, lambda *a: os.write(1, b"child: ignoring SIGINT\\n"))
signal.signal(signal.SIGTERM, lambda *a: os.write(1, b"child: ignoring SIGTERM\\n"))
os.write(1, b"child: ready\\n")
while True:
    time.sleep(0.1)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_the_wrapper_stops_the_child_and_writes_the_manifest(
    tmp_path: Path, py: str, sig: signal.Signals
) -> None:
    child = write_script(tmp_path / "polite.py", POLITE)
    out = tmp_path / "s"
    wrapper = start_kvtrace(
        "capture", "run", "--quiet", "--out", str(out), "--", py, str(child), cwd=tmp_path
    )
    try:
        wait_for(file_contains(out / "raw.log", b"child: ready"), what="child start")
        child_pid = manifest(out)["program"]["pid"]
        wrapper.send_signal(sig)
        wrapper.wait(30)
    finally:
        wrapper.kill()
    assert wrapper.returncode == 128 + int(sig)
    m = manifest(out)
    assert m["stop_reason"] == f"signal {sig.name}"
    assert m["program"]["signals_sent"] == ["SIGINT"]  # polite first, and it was enough
    assert m["program"]["returncode"] == 0
    assert "end" in m
    assert not pid_alive(child_pid)
    assert b"child: got SIGINT, shutting down" in (out / "raw.log").read_bytes()
    assert (out / "chunks.parquet").exists()


def test_a_wrapper_started_with_sigint_ignored_still_stops_the_program_politely(tmp_path: Path, py: str) -> None:
    """Started as a background job or under `nohup ... &` (SIGINT ignored, and inherited), the wrapper still
    gives the program SIGINT's default action, so its polite stop works."""
    child = write_script(tmp_path / "plain.py", """
        import os, time
        os.write(1, b"child: ready\\n")
        time.sleep(600)
    """)  # no handler of its own: Python's KeyboardInterrupt, as long as SIGINT is not ignored
    out = tmp_path / "s"
    wrapper = start_kvtrace("capture", "run", "--quiet", "--stop-wait", "3", "--out", str(out), "--", py, str(child),
                            cwd=tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        wait_for(file_contains(out / "raw.log", b"child: ready"), what="child start")
        wrapper.send_signal(signal.SIGTERM)
        wrapper.wait(30)
    finally:
        wrapper.kill()
    m = manifest(out)
    assert m["program"]["signals_sent"] == ["SIGINT"]
    assert b"KeyboardInterrupt" in (out / "raw.log").read_bytes()


def test_ctrl_c_in_the_terminal_keeps_the_live_summary_whole(tmp_path: Path, py: str) -> None:
    """A terminal's Ctrl-C reaches the wrapper's whole process group, the live parse included: the live
    parse ignores it and reads the log to its end, so the summary covers all of it."""
    child = write_script(tmp_path / "polite.py", POLITE)
    out = tmp_path / "s"
    wrapper = start_kvtrace("capture", "run", "--quiet", "--out", str(out), "--", py, str(child), cwd=tmp_path,
                            start_new_session=True)
    try:
        wait_for(file_contains(out / "raw.log", b"child: ready"), what="child start")
        time.sleep(1.0)  # the live parse is running
        os.killpg(wrapper.pid, signal.SIGINT)
        wrapper.wait(30)
    finally:
        wrapper.kill()
    m = manifest(out)
    assert m["stop_reason"] == "signal SIGINT"
    assert m["live"]["complete"] is True, m["live"]
    assert m["live"]["stats"]["bytes_parsed"] == (out / "raw.log").stat().st_size


def test_a_stubborn_child_is_stopped_firmly_within_bounded_waits(tmp_path: Path, py: str) -> None:
    child = write_script(tmp_path / "stubborn.py", STUBBORN)
    out = tmp_path / "s"
    wrapper = start_kvtrace(
        "capture",
        "run",
        "--quiet",
        "--stop-wait",
        "1",
        "--timeout",
        "2",
        "--out",
        str(out),
        "--",
        py,
        str(child),
        cwd=tmp_path,
    )
    try:
        wrapper.wait(30)
    finally:
        wrapper.kill()
    m = manifest(out)
    assert m["stop_reason"] == "timeout"
    assert m["program"]["signals_sent"] == ["SIGINT", "SIGTERM", "SIGKILL"]
    assert m["program"]["signal"] == "SIGKILL"
    raw = (out / "raw.log").read_bytes()
    assert b"child: ignoring SIGINT" in raw and b"child: ignoring SIGTERM" in raw
    assert not pid_alive(m["program"]["pid"])


def test_kill_9_of_the_wrapper_loses_nothing_received(tmp_path: Path, py: str) -> None:
    fixture = (
        Path(__file__).parents[1] / "fixtures" / "corpus" / "01_beellama-27-dflash-drafter-consecutive.log"
    )
    child = write_script(
        tmp_path / "replay.py",
        """
        import os, sys, time
        data = open(sys.argv[1], "rb").read()
        while True:  # a real log, replayed line by line for ever
            for line in data.splitlines(keepends=True):
                os.write(2, line)
            time.sleep(0.01)
    """,
    )
    out = tmp_path / "s"
    wrapper = start_kvtrace(
        "capture", "run", "--quiet", "--out", str(out), "--", py, str(child), str(fixture), cwd=tmp_path
    )
    try:
        data = fixture.read_bytes()
        # Three replays in raw.log, and the wrapper has noted their arrival: the program writes raw.log itself,
        # so on a loaded machine the file can hold them before the wrapper's first look at it.
        wait_for(
            lambda: (out / "raw.log").exists() and (out / "raw.log").stat().st_size > 3 * len(data)
            and len(load_chunks(out)) > 0,
            what="three replays captured",
        )
        child_pid = manifest(out)["program"]["pid"]
        os.kill(wrapper.pid, signal.SIGKILL)
        wrapper.wait(10)
    finally:
        wrapper.kill()
    # The child follows its parent (no orphaned server left running).
    wait_for(lambda: not pid_alive(child_pid), what="child to exit after the wrapper died")
    raw = (out / "raw.log").read_bytes()
    full, rest = divmod(len(raw), len(data))
    assert full >= 3
    assert raw == data * full + data[:rest]  # everything that arrived, in order, nothing garbled
    m = manifest(out)
    assert m["program"]["pid"] == child_pid and "end" not in m  # the start was recorded before the kill
    # The arrival times survive too: the journal the killed capture left behind.
    chunks = load_chunks(out)
    assert len(chunks) > 0
    assert (chunks["offset"].iloc[1:].to_numpy() == (chunks["offset"] + chunks["nbytes"]).iloc[:-1].to_numpy()).all()
    covered = int(chunks["offset"].iloc[-1] + chunks["nbytes"].iloc[-1])
    assert 0 <= len(raw) - covered <= 1 << 20  # at most the one chunk the kill interrupted

    from kvtrace import analyze

    result = analyze.parse(out / "raw.log")
    assert result.lines >= raw.count(b"\n")
    assert len(result.errors) > 0  # this log's position errors are all there, each replay's


def test_missing_program_is_a_one_line_error_and_starts_nothing(tmp_path: Path) -> None:
    proc = run_kvtrace(
        "capture", "run", "--out", str(tmp_path / "s"), "--", "no-such-llama-server-xyz", cwd=tmp_path
    )
    assert proc.returncode == 2
    assert proc.stderr.decode().strip() == "kvtrace: error: program not found: no-such-llama-server-xyz"
    assert not (tmp_path / "s").exists()


def test_debug_environment_is_set_and_can_be_turned_off(tmp_path: Path, py: str) -> None:
    child = write_script(
        tmp_path / "env.py",
        """
        import os
        for k in ("LLAMA_BATCH_DEBUG", "LLAMA_KV_CACHE_DEBUG", "GGML_DFLASH_DEBUG", "MY_TOKEN"):
            print(k, os.environ.get(k), flush=True)
    """,
    )
    out = tmp_path / "s"
    proc = run_kvtrace(
        "capture",
        "run",
        "--out",
        str(out),
        "--kv-debug",
        "off",
        "--batch-debug",
        "2",
        "--env",
        "MY_TOKEN=hunter2",
        "--",
        py,
        str(child),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    raw = (out / "raw.log").read_text()
    assert "LLAMA_BATCH_DEBUG 2" in raw
    assert "LLAMA_KV_CACHE_DEBUG None" in raw
    assert "GGML_DFLASH_DEBUG 1" in raw
    assert "MY_TOKEN hunter2" in raw
    text = (out / "manifest.json").read_text()
    assert "hunter2" not in text
    m = manifest(out)
    assert m["env_set"]["MY_TOKEN"] == "***"
    assert m["env_unset"] == ["LLAMA_KV_CACHE_DEBUG"]


def test_status_line_updates_in_place_on_a_terminal(tmp_path: Path, py: str) -> None:
    # The program writes until the status line has been drawn (the test says so with a file), at most 20 s:
    # on a loaded machine the live parse takes seconds to start, and a fixed short program ended before it.
    child = write_script(tmp_path / "slow.py", """
        import os, time
        for i in range(133):
            os.write(2, b"0.00.%03d.000 D find_slot: stream[0], n = %5d, used = %5d, head = %5d, size =   512, "
                        b"n_swa = 0\\n" % (i % 1000, i, i, i))
            time.sleep(0.15)
            if i >= 11 and os.path.exists("drawn"):
                break
    """)
    master, slave = pty.openpty()
    proc = subprocess.Popen(kvtrace_argv() + ["capture", "run", "--out", str(tmp_path / "s"), "--", py,
                                              str(child)], cwd=tmp_path, stdout=slave, stderr=slave)
    os.close(slave)
    seen = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not data:
            break
        seen += data
        if b"\r\x1b[Kkvtrace: " in seen and b"target pos" in seen:
            (tmp_path / "drawn").touch()
    proc.wait(30)
    os.close(master)
    assert proc.returncode == 0
    assert b"\r\x1b[Kkvtrace: " in seen  # drawn in place, between the echoed lines
    assert b" lines " in seen and b"target pos" in seen
    assert b"find_slot: stream[0], n =    11" in seen  # the echo


def test_json_summary_for_scripts(tmp_path: Path, py: str) -> None:
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "run", "--json", "--out", str(out), "--", py, "-c", "print('hello')",
                       cwd=tmp_path)
    assert proc.returncode == 0
    summary = json.loads(proc.stdout)  # only the summary: the log is not echoed with --json
    assert summary["session"] == str(out) and summary["stop_reason"] == "program exited"
    assert summary["returncode"] == 0 and summary["bytes"] == len(b"hello\n")


def test_out_folder_holding_a_capture_is_refused(tmp_path: Path, py: str) -> None:
    out = tmp_path / "s"
    assert run_kvtrace("capture", "run", "--out", str(out), "--", py, "-c", "print(1)", cwd=tmp_path).returncode == 0
    again = run_kvtrace("capture", "run", "--out", str(out), "--", py, "-c", "print(2)", cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr.decode().strip() == f"kvtrace: error: {out} already holds a capture (raw.log); choose another --out"
    assert (out / "raw.log").read_bytes() == b"1\n"


def test_a_second_ctrl_c_stops_the_program_at_once(tmp_path: Path, py: str) -> None:
    child = write_script(tmp_path / "stubborn.py", STUBBORN)
    out = tmp_path / "s"
    wrapper = start_kvtrace("capture", "run", "--quiet", "--stop-wait", "60", "--out", str(out), "--", py,
                            str(child), cwd=tmp_path)
    try:
        wait_for(file_contains(out / "raw.log", b"child: ready"), what="child start")
        t0 = time.monotonic()
        wrapper.send_signal(signal.SIGINT)
        wait_for(file_contains(out / "raw.log", b"child: ignoring SIGINT"), what="the polite stop")
        wrapper.send_signal(signal.SIGINT)
        wrapper.wait(30)
        assert time.monotonic() - t0 < 20  # not the 60 s polite wait
    finally:
        wrapper.kill()
    m = manifest(out)
    assert m["signals_received"] == ["SIGINT", "SIGINT"]
    assert m["program"]["signal"] == "SIGKILL"
    assert not pid_alive(m["program"]["pid"])


@pytest.mark.parametrize(("live", "why"), [
    ({"complete": False, "failed": "MemoryError", "stats": {"bytes_parsed": 1_000_000}},
     "the live parse stopped: MemoryError"),
    ({"complete": False, "failed": None, "stats": {"bytes_parsed": 1_000_000}},
     "the log came faster than it could be parsed"),
])
def test_the_end_says_why_the_live_summary_is_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], live: dict[str, object], why: str
) -> None:
    from kvtrace.analyze.cli.capture import report_outcome
    from kvtrace.analyze.reader.session import new_session
    from kvtrace.capture.runner import Outcome

    session = new_session("run", out=tmp_path / "s")
    report_outcome(Outcome("program exited", 0, 0, bytes=3_000_000, manifest={"live": live}, session=session.path),
                   as_json=False)
    assert f"kvtrace: the live summary covers 1.0 of 3.0 MB ({why}); raw.log is complete\n" in capsys.readouterr().err


def test_a_program_that_fails_at_start_up_shows_its_last_lines_and_no_bug_report_advice(
    tmp_path: Path, py: str
) -> None:
    child = write_script(tmp_path / "bad_flag.py", """
        import sys
        for i in range(1, 13):
            print(f"loading step {i}", flush=True)
        sys.stderr.write("error: invalid argument: --no-such-flag\\n")
        sys.exit(1)
    """)
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "run", "--quiet", "--out", str(out), "--", py, str(child), cwd=tmp_path)
    assert proc.returncode == 1
    size = (out / "raw.log").stat().st_size
    assert end_lines(proc.stderr, "kvtrace: stopped") == [
        f"kvtrace: stopped (program exited); program exit code 1; {size:,} bytes in {out}/raw.log",
        "kvtrace: the program exited during start-up; the last lines it printed:",
        *(f"kvtrace:   | loading step {i}" for i in range(4, 13)),
        "kvtrace:   | error: invalid argument: --no-such-flag",
    ]  # and no advice to attach a log that holds nothing to triage


def test_start_up_lines_are_plain_text_and_in_the_json_summary(tmp_path: Path, py: str) -> None:
    child = write_script(tmp_path / "colours.py", """
        import os, sys
        os.write(2, b"\\x1b[31merror:\\x1b[0m cannot open model\\r\\n")
        sys.exit(3)
    """)
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "run", "--json", "--out", str(out), "--", py, str(child), cwd=tmp_path)
    assert proc.returncode == 1
    assert end_lines(proc.stderr, "kvtrace: the program exited")[:2] == [
        "kvtrace: the program exited during start-up; the last lines it printed:",
        "kvtrace:   | error: cannot open model",
    ]
    summary = json.loads(proc.stdout)
    assert summary["startup_lines"] == ["error: cannot open model"] and summary["returncode"] == 3


def test_a_program_that_decoded_before_failing_gets_the_bug_report_advice(tmp_path: Path, py: str) -> None:
    log = Path(__file__).parents[2] / "samples" / "stale-drafter" / "raw.log"  # batches, then the failure
    child = write_script(tmp_path / "fails_late.py", """
        import os, sys
        os.write(2, open(sys.argv[1], "rb").read())
        sys.exit(1)
    """)
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "run", "--quiet", "--out", str(out), "--", py, str(child), str(log), cwd=tmp_path)
    assert proc.returncode == 1
    end = end_lines(proc.stderr, "kvtrace: stopped")
    assert not any("start-up" in line for line in end)
    assert end[-1] == (f"kvtrace: attach raw.log and manifest.json from {out} to a bug report; "
                       f"next: kvtrace triage {out}/raw.log")


PING_REFUSED = """
import http.server, json, sys
port = int(sys.argv[sys.argv.index("--port") + 1])

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"error": {"code": 500, "message": "the model exploded", "type": "server_error"}})
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, fmt, *args):
        sys.stderr.write("srv  log_server_r: " + (fmt % args) + "\\n")

print("server is listening", flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_a_failed_ping_says_the_first_failures_status_and_the_servers_message(tmp_path: Path, py: str) -> None:
    server = write_script(tmp_path / "refuses.py", PING_REFUSED)
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "run", "--ping", "2", "--stop-wait", "2", "--quiet", "--out", str(out), "--",
                       py, str(server), "--port", str(free_port()), cwd=tmp_path, timeout=60)
    assert proc.returncode == 1
    first = "kvtrace: error: 2 of 2 requests failed; the first (request 0): HTTP 500: the model exploded"
    assert first in proc.stderr.decode().splitlines()
    assert manifest(out)["ping"]["error"] == first.removeprefix("kvtrace: error: ")
    assert not any("start-up" in line for line in proc.stderr.decode().splitlines())  # it served /health


@pytest.mark.parametrize(("body", "message"), [
    ('{"error": {"code": 400, "message": "the request exceeds the available context size", "type": "x"}}',
     "the request exceeds the available context size"),
    ('{"error": "model not found"}', "model not found"),
    ('{"error": {"code": 500}}', '{"error": {"code": 500}}'),
    ("Internal Server Error\n\n  try again later", "Internal Server Error try again later"),
])
def test_a_servers_error_answer_is_read_for_its_message(body: str, message: str) -> None:
    from kvtrace.capture.ping import server_message

    assert server_message(body) == message
