"""Two real llama.cpp devices on one CPU: two `ggml-rpc-server`s on loopback (capture/rpc.py) and a real
llama-server b11434 (`make server`, built with -DGGML_RPC=ON) that splits the tiny target over them and puts
the drafter where it is told. The healthy two-device runs are also in the scenario matrix
(tests/tools/test_scenarios.py); here: what the reader, the report and the manifest make of them, and the
ways such a setup breaks."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from kvtrace import analyze
from kvtrace.analyze.findings.signatures import match_signature
from kvtrace.analyze.reader.session import free_port
from kvtrace.analyze.views.report import markdown_report
from kvtrace.capture.devices import list_devices
from kvtrace.capture.models import ensure_models
from kvtrace.capture.rpc import LOOPBACK, find_rpc_server, rpc_servers
from tests.capture.capture_helpers import NEEDS_SERVER, run_kvtrace
from tools.scenarios import BY_NAME, TWO_DEVICES, Scenario, run_scenario

pytestmark = NEEDS_SERVER

# ggml-rpc's words for a device that went away, by the variant the reader gives each
RPC_LOSS = {
    "rpc_lost": "Remote RPC server crashed or returned malformed response",
    "rpc_io": " failed (bytes_",
    "rpc_connect": "Failed to connect to",
}


@pytest.fixture(scope="module")
def rpc_binary(llama_server: Path) -> Path:
    path = find_rpc_server(llama_server)
    if path is None:
        pytest.fail("ggml-rpc-server is not beside llama-server: `make server` builds it with -DGGML_RPC=ON")
    return path


def _listening(endpoint: str) -> bool:
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            return True
    except OSError:
        return False


def test_rpc_servers_listen_on_loopback_only_and_are_stopped(rpc_binary: Path) -> None:
    with rpc_servers(2, rpc_binary) as servers:
        assert len(servers.endpoints) == 2 and len(set(servers.endpoints)) == 2
        assert all(e.startswith(f"{LOOPBACK}:") for e in servers.endpoints)
        assert all(_listening(e) for e in servers.endpoints)
        procs = list(servers.procs)
    assert all(p.poll() is not None for p in procs)
    assert not any(_listening(e) for e in servers.endpoints)


def test_the_program_lists_both_rpc_devices(llama_server: Path, rpc_binary: Path) -> None:
    help_text = "--list-devices"  # b11434 has it (checked below through the real output)
    with rpc_servers(2, rpc_binary) as servers:
        found = list_devices(str(llama_server), [str(llama_server), "--rpc", servers.arg], dict(os.environ),
                             help_text)
    assert found is not None and "error" not in found, found
    rpc = [d for d in found["devices"] if d["backend"] == "RPC"]
    assert [(d["device"], d["name"]) for d in rpc] == [("RPC0", servers.endpoints[0]), ("RPC1", servers.endpoints[1])]
    assert all(d["memory_mib"] > 0 for d in rpc) and "RPC0" in found["raw"]


@pytest.fixture(scope="module")
def devd_run(llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, analyze.ParseResult]:
    run = run_scenario(BY_NAME["draft-dflash-2dev-devd"], tmp_path_factory.mktemp("two") / "devd", llama_server,
                       limit=150)
    assert run.ok, run.reason
    return run.session, analyze.parse(run.session)


def test_reader_places_target_over_both_devices_and_the_drafter_on_rpc1(
        devd_run: tuple[Path, analyze.ParseResult]) -> None:
    _, result = devd_run
    meta = result.meta
    assert [g["device"] for g in meta["gpus"]] == ["RPC0", "RPC1"] and meta["n_gpus"] == 2
    assert "draft-dflash" in meta["spec_impls"]
    place = meta["placement"]
    assert (place["split_mode"], place["tensor_split"], place["draft_device"]) == ("layer", "1,1", "RPC1")
    target, drafter = place["target"]["devices"], place["drafter"]["devices"]
    assert target["RPC0"].get("n_layers") and target["RPC1"].get("n_layers")
    assert [d for d, v in drafter.items() if v.get("n_layers")] == ["RPC1"]
    assert result.verdict.kind == "draft_stats_only"


def test_report_and_manifest_show_the_devices(devd_run: tuple[Path, analyze.ParseResult]) -> None:
    session, result = devd_run
    md = markdown_report(result)
    assert "**Devices**" in md and "| RPC1 | RPC |" in md and "| drafter | RPC1 |" in md
    manifest = json.loads((session / "manifest.json").read_text())
    listed = manifest["devices"]
    assert [d["device"] for d in listed["devices"] if d["backend"] == "RPC"] == ["RPC0", "RPC1"]
    assert "--list-devices" in listed["command"] and "error" not in listed


def test_row_split_is_refused_by_rpc_devices_a_start_up_failure(llama_server: Path, tmp_path: Path) -> None:
    row = Scenario("row-split", "draft-dflash", ("-c", "512", "-np", "1", "-ngl", "99", "-sm", "row"), requests=1,
                   rpc_devices=2)
    run = run_scenario(row, tmp_path / "row", llama_server, limit=90)
    assert not run.ok and "\n" not in run.reason and "split buffers" in run.reason, run.reason
    result = analyze.parse(run.session)
    assert result.verdict.kind == "other" and "start-up failure" in result.verdict.summary
    m = match_signature(result)
    assert m.name == "model_load_failed" and any("--split-mode layer" in s for s in m.steps)
    assert [g["device"] for g in result.meta["gpus"]] == ["RPC0", "RPC1"]


def test_a_device_lost_mid_run_keeps_the_log_and_is_named(llama_server: Path, tmp_path: Path) -> None:
    lost = Scenario("rpc-dies", "draft-dflash", ("-c", "512", "-np", "1", *TWO_DEVICES), requests=4,
                    concurrency=1, rpc_devices=2, rpc_die_after=1)
    run = run_scenario(lost, tmp_path / "lost", llama_server, limit=120)
    assert not run.ok and "\n" not in run.reason
    assert run.requests[0].ok and not all(r.ok for r in run.requests)
    raw = (run.session / "raw.log").read_bytes()
    assert b"load_tensors" in raw  # the whole capture is kept, start-up included
    result = analyze.parse(run.session)
    assert result.verdict.kind != "draft_stats_only" and len(result.errors) >= 1, result.verdict.summary
    # How the server says so depends on what it was doing when the device went: mid-send or mid-receive
    # (ggml-rpc's `send failed`/`recv failed`, then its abort) or opening a new connection. Each line it
    # printed is read as its own failure, and the verdict quotes one of them.
    said = {variant for variant, words in RPC_LOSS.items() if words.encode() in raw}
    assert said, "the server's log says the device went away"
    assert said <= set(result.errors["variant"]), (said, result.errors["variant"].tolist())
    text = result.verdict.summary + " ".join(str(e) for e in result.errors["evidence"])
    assert any(RPC_LOSS[v] in text for v in said), result.verdict.summary


def test_a_wrong_rpc_address_is_one_line_and_no_hang(llama_server: Path, tmp_path: Path) -> None:
    pair = ensure_models()
    closed = free_port()  # nothing listens there
    start = time.monotonic()
    proc = run_kvtrace("capture", "run", "--quiet", "--out", str(tmp_path / "s"), "--", str(llama_server),
                       "-m", str(pair.target), "--rpc", f"127.0.0.1:{closed}", "-ngl", "99",
                       "--host", "127.0.0.1", "--port", str(free_port()), cwd=tmp_path, timeout=120)
    assert time.monotonic() - start < 60
    err = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and f"127.0.0.1:{closed}" in err[0], err
    assert "Traceback" not in proc.stderr.decode()
