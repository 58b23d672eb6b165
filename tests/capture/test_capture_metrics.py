"""The server's /metrics beside its log: --metrics added when the build lists it, scraped into metrics.parquet,
and a server without the endpoint, or one that dies, leaves the capture as it is with one line saying so."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from kvtrace.analyze.reader.session import free_port
from kvtrace.capture import llama_args
from kvtrace.capture.metrics import parse_metrics
from kvtrace.capture.models import ensure_models
from tests.capture.capture_helpers import NEEDS_SERVER, manifest, run_kvtrace, start_kvtrace, wait_for, write_script

EXPOSITION = """\
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 72
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 2
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 0
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
"""
HELP = "-v, --verbose\n--log-prefix\n--log-timestamps\n--log-colors [on|off|auto]\n--metrics  enable prometheus\n"

# A stand-in llama-server: lists the flags it takes in --help, serves /metrics when given --metrics (501
# otherwise, as llama-server does), prints one `accepted N/M draft tokens` line per step and counts it.
FAKE_SERVER = r'''
import http.server, sys, threading, time
args = sys.argv[1:]
if "--version" in args:
    print("version: 1 (fake)"); sys.exit(0)
if "--help" in args:
    print(HELP_TEXT); sys.exit(0)
port = int(args[args.index("--port") + 1])
steps = int(args[args.index("--steps") + 1])
counts = {"draft_tokens": 0, "accepted_tokens": 0, "drafts": 0}
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/metrics" and "--metrics" in args:
            body = "".join(f"# TYPE llamacpp:spec_decode_num_{k}_total counter\nllamacpp:spec_decode_num_{k}_total {v}\n"
                           for k, v in counts.items()).encode()
            self.send_response(200)
        else:
            body = b'{"error": "This server does not support metrics endpoint."}'
            self.send_response(501)
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
for i in range(steps):
    n = i % 4
    print(f"0.00.{i:03d}.000 I slot   operator(): id  0 | task 0 | accepted {n:2d}/ 3 draft tokens", flush=True)
    counts["draft_tokens"] += 3; counts["accepted_tokens"] += n; counts["drafts"] += 1
    time.sleep(0.1)
print("done", flush=True)
time.sleep(float(args[args.index("--linger") + 1]) if "--linger" in args else 0)  # serving until stopped
'''.replace("HELP_TEXT", repr("HELP_PLACEHOLDER"))


def fake_server(tmp_path: Path, help_text: str = HELP) -> Path:
    """An executable named llama-server (so kvtrace treats it as llama.cpp's) running FAKE_SERVER."""
    body = f"#!{sys.executable}\n" + FAKE_SERVER.replace("HELP_PLACEHOLDER", help_text.replace("\n", "\\n"))
    path = write_script(tmp_path / "llama-server", body)
    path.chmod(0o755)
    return path


def test_the_exposition_is_parsed_into_long_rows() -> None:
    rows = parse_metrics(EXPOSITION, 12.5)
    assert [(r.name, json.loads(r.labels), r.value) for r in rows] == [
        ("llamacpp:spec_decode_num_draft_tokens_total", {}, 72.0),
        ("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", {"position": "0"}, 2.0),
        ("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", {"position": "1"}, 0.0),
        ("llamacpp:requests_processing", {}, 1.0),
    ]
    assert {r.t for r in rows} == {12.5}


@pytest.mark.parametrize(("argv", "env", "help_text", "added"), [
    (["llama-server", "-m", "m.gguf"], {}, HELP, True),
    (["llama-server", "-m", "m.gguf"], {}, "-v\n--log-prefix\n", False),  # this build does not list it
    (["llama-server", "-m", "m.gguf"], {}, None, False),  # --help unknown: never handed a flag it may reject
    (["llama-server", "--metrics"], {}, HELP, False),  # the user's own
    (["llama-server"], {"LLAMA_ARG_ENDPOINT_METRICS": "1"}, HELP, False),
    (["llama-server"], {"LLAMA_ARG_ENDPOINT_METRICS": "0"}, HELP, True),
    (["llama-server"], {}, "--metrics-file PATH\n", False),  # another flag that merely starts alike
])
def test_metrics_flag_is_added_only_where_the_build_lists_it(argv: list[str], env: dict[str, str],
                                                             help_text: str | None, added: bool) -> None:
    out = llama_args.add_metrics_flag(argv, env, help_text)
    assert out == ([*argv, "--metrics"] if added else argv)
    assert llama_args.serves_metrics(out, env) is (added or "--metrics" in argv or env.get(
        "LLAMA_ARG_ENDPOINT_METRICS") == "1")


def test_a_wrapped_server_gets_metrics_and_its_counters_match_the_log(tmp_path: Path) -> None:
    server = fake_server(tmp_path)
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "run", "--quiet", "--timeout", "5", "--out", str(out), "--", str(server), "--port",
                       str(free_port()), "--steps", "25", "--linger", "60", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    err = proc.stderr.decode()
    assert manifest(out)["stop_reason"] == "timeout"  # the last scrape came before the server was stopped
    assert "kvtrace: added for parseable debug output: -v --log-prefix --log-timestamps --log-colors off " \
           "--metrics" in err.splitlines()
    m = manifest(out)
    assert m["effective_command"][-1] == "--metrics" and m["added_metrics_flag"] is True
    assert m["added_flags"] == ["-v", "--log-prefix", "--log-timestamps", "--log-colors", "off"]
    assert m["metrics"]["scrapes"] >= 2 and m["metrics"]["note"] is None and m["metrics"]["from_start"] is True
    df = pd.read_parquet(out / "metrics.parquet")
    assert list(df.columns) == ["t", "name", "labels", "value"]
    drafts = df[df["name"] == "llamacpp:spec_decode_num_drafts_total"].sort_values("t")
    assert drafts["value"].is_monotonic_increasing and drafts["value"].iloc[-1] == 25
    gaps = drafts["t"].diff().dropna()
    # about once a second; the last scrape is the one as the run ends, which may fall just after a periodic one
    assert gaps.iloc[:-1].between(0.5, 3.0).all() and gaps.iloc[-1] <= 3.0
    triage = run_kvtrace("triage", "--json", str(out), cwd=tmp_path)
    counters = json.loads(triage.stdout)["server_counters"]
    assert counters["drafts"] == {"log": 25, "server": 25}
    assert counters["draft_tokens"] == {"log": 75, "server": 75}
    assert counters["accepted_tokens"] == {"log": sum(i % 4 for i in range(25)), "server": sum(i % 4 for i in range(25))}
    assert counters["agree"] is True and counters["window"] == "whole run"


def test_no_metrics_leaves_the_flag_out_and_scrapes_nothing(tmp_path: Path) -> None:
    server = fake_server(tmp_path)
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "run", "--quiet", "--no-metrics", "--out", str(out), "--", str(server),
                       "--port", str(free_port()), "--steps", "3", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    m = manifest(out)
    assert "--metrics" not in m["effective_command"] and "metrics" not in m
    assert not (out / "metrics.parquet").exists()
    assert _metrics_lines(proc.stderr) == []


def test_a_build_without_metrics_is_not_handed_the_flag(tmp_path: Path) -> None:
    server = fake_server(tmp_path, help_text="-v\n--log-prefix\n--log-timestamps\n--log-colors\n")
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "run", "--quiet", "--out", str(out), "--", str(server), "--port",
                       str(free_port()), "--steps", "3", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    m = manifest(out)
    assert "--metrics" not in m["effective_command"] and m["added_metrics_flag"] is False and "metrics" not in m


def _attach_with_server(tmp_path: Path, url: str, seconds: float) -> subprocess.CompletedProcess[bytes]:
    log = tmp_path / "server.log"
    log.write_text("0.00.001.000 I slot   operator(): id  0 | task 0 | accepted  1/ 3 draft tokens\n")
    return run_kvtrace("capture", "attach", "--quiet", "--file", str(log), "--follow", "--timeout", str(seconds),
                       "--server", url, "--out", str(tmp_path / "s"), cwd=tmp_path, timeout=60)


def _metrics_lines(stderr: bytes) -> list[str]:
    """kvtrace's lines about a server's /metrics (by its address: a session path may hold the word too)."""
    return [line for line in stderr.decode().splitlines() if re.search(r"https?://\S+/metrics", line)]


def test_a_server_without_the_endpoint_leaves_the_capture_with_one_line(tmp_path: Path) -> None:
    port = free_port()
    web = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _answers(port), what="http.server")
        proc = _attach_with_server(tmp_path, f"http://127.0.0.1:{port}", 2)
    finally:
        web.terminate()
        web.wait(10)
    assert proc.returncode == 0, proc.stderr.decode()
    said = _metrics_lines(proc.stderr)
    assert said == [f"kvtrace: the server has no http://127.0.0.1:{port}/metrics (HTTP 404): no server counters; "
                    "the log is captured as usual"], proc.stderr.decode()
    s = tmp_path / "s"
    assert (s / "raw.log").read_bytes() == (tmp_path / "server.log").read_bytes()
    assert not (s / "metrics.parquet").exists()
    assert manifest(s)["metrics"]["scrapes"] == 0 and manifest(s)["stop_reason"] == "timeout"


def test_nothing_listening_is_one_line_at_the_end(tmp_path: Path) -> None:
    port = free_port()
    proc = _attach_with_server(tmp_path, f"http://127.0.0.1:{port}", 1.5)
    assert proc.returncode == 0, proc.stderr.decode()
    assert _metrics_lines(proc.stderr) == [
        f"kvtrace: the server never answered http://127.0.0.1:{port}/metrics: no server counters; the log is "
        "captured as usual"]
    assert (tmp_path / "s" / "raw.log").stat().st_size > 0


def test_attach_server_wants_an_address(tmp_path: Path) -> None:
    proc = _attach_with_server(tmp_path, "127.0.0.1:8080", 1)
    assert proc.returncode == 2
    assert proc.stderr.decode().strip() == ("kvtrace: error: --server wants the server's address, e.g. "
                                            "http://127.0.0.1:8080 (got '127.0.0.1:8080')")


def _answers(port: int) -> bool:
    import httpx

    try:
        httpx.get(f"http://127.0.0.1:{port}/", timeout=1.0)
        return True
    except httpx.HTTPError:
        return False


def test_a_server_killed_mid_run_keeps_its_log_and_the_counters_so_far(tmp_path: Path) -> None:
    server = fake_server(tmp_path)
    out = tmp_path / "s"
    proc = start_kvtrace("capture", "run", "--quiet", "--out", str(out), "--", str(server), "--port",
                         str(free_port()), "--steps", "200", cwd=tmp_path)
    try:
        wait_for(lambda: (out / "manifest.json").exists() and "pid" in (manifest(out).get("program") or {}),
                 what="the program's pid")
        time.sleep(2.5)  # a few scrapes
        os.kill(manifest(out)["program"]["pid"], signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = _metrics_lines(err)
    assert len(said) == 1 and said[0].startswith("kvtrace: the program ended: the counters from"), err.decode()
    assert b"accepted" in (out / "raw.log").read_bytes()
    m = manifest(out)
    assert m["stop_reason"] == "program exited" and m["metrics"]["scrapes"] >= 1
    assert len(pd.read_parquet(out / "metrics.parquet")) >= 3


def needs_server(f: Callable[..., None]) -> Callable[..., None]:
    for mark in NEEDS_SERVER:
        f = mark(f)
    return f


@needs_server
def test_a_real_server_killed_mid_run_still_completes(llama_server: Path, tmp_path: Path) -> None:
    """llama-server b11434 gets --metrics from its own --help; killed with SIGKILL after a few scrapes, the
    capture ends with its log, the counters scraped so far and one line."""
    pair = ensure_models()
    out = tmp_path / "s"
    proc = start_kvtrace("capture", "run", "--quiet", "--out", str(out), "--", str(llama_server), "-m",
                         str(pair.target), "-c", "256", "-np", "1", "-t", "1", "-fit", "off", "--host", "127.0.0.1",
                         "--port", str(free_port()), cwd=tmp_path)
    try:
        wait_for(lambda: (out / "manifest.json").exists() and "pid" in (manifest(out).get("program") or {}),
                 timeout=60, what="the program's pid")
        assert "--metrics" in manifest(out)["effective_command"]
        wait_for(lambda: b"all slots are idle" in (out / "raw.log").read_bytes() or b"listening" in
                 (out / "raw.log").read_bytes(), timeout=120, what="the server to listen")
        time.sleep(2.5)
        os.kill(manifest(out)["program"]["pid"], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = _metrics_lines(err)
    assert len(said) == 1 and said[0].startswith("kvtrace: the program ended: the counters from"), err.decode()
    m = manifest(out)
    assert m["program"]["signal"] == "SIGKILL" and m["metrics"]["scrapes"] >= 1
    assert (out / "raw.log").stat().st_size > 0 and (out / "metrics.parquet").is_file()
