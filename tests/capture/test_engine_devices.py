"""The embedded engine on two real llama.cpp RPC devices on one CPU: `kvtrace capture engine --devices 2` serves
them from the engine's own llama.cpp (capture/engine/rpc_server.py) on loopback, splits the target over them and
puts the drafter where `--draft-device` says, as the seed report's multi-GPU DFlash layout had it.

Each capture runs the real command in its own process (llama.cpp names a process's RPC devices RPC0, RPC1, ...
in the order it registers them), and is checked against its ground truth as the one-device captures are
(tests/analyze/reader/test_engine_truth.py), and for the layout llama.cpp itself printed."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kvtrace import analyze
from kvtrace.analyze.reader.session import free_port, new_session
from kvtrace.analyze.views.report import markdown_report
from kvtrace.capture.engine import EngineConfig, run_engine
from kvtrace.capture.engine.rpc_server import command
from kvtrace.capture.models import ensure_models, ensure_upstream_drafter
from kvtrace.capture.rpc import LOOPBACK, rpc_servers

from .capture_helpers import run_kvtrace, start_kvtrace, wait_for

pytestmark = pytest.mark.engine

DFLASH, EAGLE3, SIMPLE = "draft-dflash", "draft-eagle3", "draft-simple"
FAULTS = ("stale-drafter", "no-rollback", "none")
# llama.cpp's own lines (src/llama.cpp, src/llama-model.cpp at 0c1e57098), as the engine's callback wrote them
USING = re.compile(rb"llama_prepare_model_devices: using device (\w+) \((127\.0\.0\.1:\d+)\) \(unknown id\) - "
                   rb"\d+ MiB free\n")
ASSIGNED = re.compile(rb"load_tensors: layer +(\d+) assigned to device (\w+), is_swa = \d\n")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cache = tmp_path_factory.mktemp("device-models")
    ensure_models(cache, seed=0)
    for kind in ("dflash", "eagle3"):
        ensure_upstream_drafter(kind, cache, seed=0)
    return {**os.environ, "KVTRACE_CACHE": str(cache)}


def engine(env: dict[str, str], out: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[bytes]:
    done = run_kvtrace("capture", "engine", "--out", str(out), "--json", *args, cwd=out.parent, env=env, timeout=300)
    if ok:
        assert done.returncode == 0, done.stderr.decode()
    return done


def loads(session: Path) -> list[dict[str, object]]:
    """Each model load in raw.log, in order (target, then drafter): its devices and where its layers went."""
    raw = (session / "raw.log").read_bytes()
    parts = raw.split(b"llama_model_loader: loaded meta data")[1:]
    out = []
    for part in parts:
        layers: dict[str, list[int]] = {}
        for layer, dev in ASSIGNED.findall(part):
            layers.setdefault(dev.decode(), []).append(int(layer))
        out.append({"using": [(d.decode(), e.decode()) for d, e in USING.findall(part)], "layers": layers})
    return out


def listening(endpoint: str) -> bool:
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def manifest(session: Path) -> dict:
    return json.loads((session / "manifest.json").read_text())


def check_truth(session: Path, fault: str) -> analyze.ParseResult:
    """What the one-device captures are held to: every decode found with its positions and its context, and
    each refused one with llama.cpp's exact X and Y (tests/analyze/reader/test_engine_truth.py)."""
    r = analyze.parse(session)
    gt = pd.read_parquet(session / "ground_truth.parquet")
    m = gt.merge(r.batches, on="line", how="left", suffixes=("_gt", ""))
    assert len(r.batches) == len(gt) and m.batch.notna().all()
    assert (m.pos_min == m.pos_min_gt).all() and (m.pos_max == m.pos_max_gt).all()
    assert (m.ok == (m.ret == 0)).all()
    assert (m.context.astype(str) == m.context_gt).mean() >= 0.99
    failed = gt[gt.ret != 0].reset_index(drop=True)
    if fault == "none":
        assert failed.empty and r.errors.empty and r.verdict.kind == "draft_stats_only"
        return r
    errors = r.errors[r.errors.kind == "inconsistent_positions"].reset_index(drop=True)
    assert len(failed) > 0 and len(errors) == len(failed)
    stored = [row.drafter_kv_max if row.context == "drafter" else row.target_kv_max for row in failed.itertuples()]
    assert list(errors.batch_start) == list(failed.pos_min) and list(errors.last_pos) == stored
    assert r.verdict.kind == "inconsistent_positions" and r.verdict.component == "drafter"
    return r


# -- the device program ---------------------------------------------------------------------------------


def test_rpc_device_is_the_engines_own_llama_cpp_on_loopback_only(tmp_path: Path) -> None:
    with rpc_servers(2, command(), log_dir=tmp_path) as servers:
        assert all(e.startswith(f"{LOOPBACK}:") for e in servers.endpoints) and all(map(listening, servers.endpoints))
        procs = list(servers.procs)
    assert all(p.poll() is not None for p in procs) and not any(map(listening, servers.endpoints))
    said = (tmp_path / "rpc0.log").read_text()
    assert "Starting RPC server v7.0.0" in said and "CPU" in said  # this llama.cpp's protocol, its CPU device
    refused = subprocess.run([*command(), "-H", "0.0.0.0", "-p", str(free_port())], capture_output=True, timeout=60)
    assert refused.returncode == 2 and refused.stderr.decode().count("\n") == 1
    assert b"not a loopback address" in refused.stderr


# -- every fault and speculative type on two devices ------------------------------------------------------


CASES = [(spec, fault) for spec in (DFLASH, EAGLE3, SIMPLE) for fault in FAULTS]


@pytest.mark.parametrize(("spec", "fault"), CASES, ids=[f"{s.removeprefix('draft-')}-{f}" for s, f in CASES])
def test_two_devices_match_the_ground_truth_and_show_the_layout(env: dict[str, str], tmp_path: Path, spec: str,
                                                                  fault: str) -> None:
    session = tmp_path / "s"
    done = engine(env, session, "--devices", "2", "--spec-type", spec, "--fault", fault, "--requests", "2",
                  "--cycles", "8", "-ts", "1,1", "--draft-device", "RPC1")
    summary = json.loads(done.stdout)
    rpc = summary["layout"]["rpc"]
    assert [d["device"] for d in rpc] == ["RPC0", "RPC1"] and all(d["started_here"] for d in rpc)
    assert (summary["layout"]["target"], summary["layout"]["drafter"]) == (["RPC0", "RPC1"], ["RPC1"])
    assert not any(map(listening, [d["endpoint"] for d in rpc])), "the devices are stopped with the command"
    # llama.cpp's own lines: the target over both devices, split by layer, the drafter's layers all on RPC1
    target, drafter = loads(session)
    endpoints = [(d["device"], d["endpoint"]) for d in rpc]
    assert target["using"] == endpoints and drafter["using"] == endpoints[1:]
    assert set(target["layers"]) == {"RPC0", "RPC1"} and set(drafter["layers"]) == {"RPC1"}
    result = check_truth(session, fault)
    # and the same decodes as on one device: the devices compute with the same ggml, so every position, cache
    # bound, acceptance and refusal is as on the CPU (only the log's line numbers differ)
    one = run_engine(EngineConfig(spec_type=spec, fault=fault, requests=2, cycles=8,
                                  cache_dir=Path(env["KVTRACE_CACHE"])), new_session("engine", out=tmp_path / "one"))
    two, alone = (pd.read_parquet(p / "ground_truth.parquet").drop(columns="line") for p in (session, one.session))
    pd.testing.assert_frame_equal(two, alone)
    # the reader, the report and the manifest name the devices and where the drafter sits
    meta = result.meta
    assert [g["device"] for g in meta["gpus"]] == ["RPC0", "RPC1"]
    assert [g["name"] for g in meta["gpus"]] == [e for _, e in endpoints]
    place = meta["placement"]
    assert (place["split_mode"], place["tensor_split"], place["draft_device"]) == ("layer", "1,1", "RPC1")
    assert all(place["target"]["devices"][d].get("n_layers") for d in ("RPC0", "RPC1"))
    assert [d for d, v in place["drafter"]["devices"].items() if v.get("n_layers")] == ["RPC1"]
    md = markdown_report(result)
    assert "| RPC1 | RPC |" in md and "| drafter | RPC1 |" in md and "drafter device asked for: RPC1" in md
    assert manifest(session)["device"]["layout"] == summary["layout"]


# -- the multi-device options, by what they change in llama.cpp's own lines --------------------------------


def short(env: dict[str, str], out: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[bytes]:
    """A healthy capture just long enough to load both models on the devices."""
    return engine(env, out, "--fault", "none", "--requests", "1", "--cycles", "2", *args, ok=ok)


def test_n_gpu_layers_decides_what_the_devices_hold(env: dict[str, str], tmp_path: Path) -> None:
    short(env, tmp_path / "all", "--devices", "2")  # -ngl defaults to all with --devices
    short(env, tmp_path / "none", "--devices", "2", "-ngl", "0")
    short(env, tmp_path / "one", "--devices", "2", "-ngl", "1")
    every = loads(tmp_path / "all")[0]["layers"]
    assert set(every) == {"RPC0", "RPC1"} and "CPU" not in every
    assert set(loads(tmp_path / "none")[0]["layers"]) == {"CPU"}
    one = loads(tmp_path / "one")[0]["layers"]
    assert sum(len(v) for d, v in one.items() if d != "CPU") == 1 and "CPU" in one
    assert manifest(tmp_path / "none")["device"]["layout"]["target"] == ["CPU"]
    assert manifest(tmp_path / "all")["device"]["ran_on"] == ["RPC0", "RPC1"]


def test_tensor_split_moves_the_target_s_layers(env: dict[str, str], tmp_path: Path) -> None:
    short(env, tmp_path / "even", "--devices", "2", "--tensor-split", "1,1")
    short(env, tmp_path / "first", "--devices", "2", "--tensor-split", "1,0")
    short(env, tmp_path / "second", "--devices", "2", "-ts", "0,1")
    even = loads(tmp_path / "even")[0]["layers"]
    assert len(even["RPC0"]) and len(even["RPC1"])
    assert set(loads(tmp_path / "first")[0]["layers"]) == {"RPC0"}
    assert set(loads(tmp_path / "second")[0]["layers"]) == {"RPC1"}
    assert analyze.parse(tmp_path / "first").meta["placement"]["tensor_split"] == "1,0"


def test_split_mode_none_puts_the_target_on_the_main_gpu(env: dict[str, str], tmp_path: Path) -> None:
    short(env, tmp_path / "mg1", "--devices", "2", "--split-mode", "none", "--main-gpu", "1")
    short(env, tmp_path / "mg0", "--devices", "2", "-sm", "none")
    for name, device in (("mg1", "RPC1"), ("mg0", "RPC0")):
        target = loads(tmp_path / name)[0]
        assert [d for d, _ in target["using"]] == [device] and set(target["layers"]) == {device}, name
    assert analyze.parse(tmp_path / "mg1").meta["placement"]["split_mode"] == "none"
    assert manifest(tmp_path / "mg1")["device"]["layout"]["target"] == ["RPC1"]
    short(env, tmp_path / "devd", "--devices", "2", "-sm", "none", "-mg", "1", "-devd", "RPC0", "--spec-type", SIMPLE)
    assert [d for d, _ in loads(tmp_path / "devd")[1]["using"]] == ["RPC0"]
    bad = short(env, tmp_path / "mg5", "--devices", "2", "-sm", "none", "-mg", "5", ok=False)
    assert bad.returncode == 2 and bad.stderr.decode().count("\n") == 1
    assert b"invalid value for main_gpu: 5 (available devices: 2)" in (tmp_path / "mg5" / "raw.log").read_bytes()


def test_tensor_split_runs_both_models_on_one_meta_device(env: dict[str, str], tmp_path: Path) -> None:
    """--split-mode tensor: llama.cpp makes one Meta() device of both RPC devices and splits every layer's
    tensors over them; the drafter shares it only as a whole (a DFlash drafter on RPC1 alone would make ggml
    abort the process, as away from the output head)."""
    engine(env, tmp_path / "t", "--devices", "2", "-sm", "tensor", "--fault", "stale-drafter", "--requests", "2",
           "--cycles", "4")
    raw = (tmp_path / "t" / "raw.log").read_bytes()
    assert raw.count(b"llama_prepare_model_devices: creating a Meta device with 2 devices") == 2
    assert set(re.findall(rb"layer +\d+ assigned to device (\S+), is_swa", raw)) == {b"Meta()"}
    check_truth(tmp_path / "t", "stale-drafter")
    bad = short(env, tmp_path / "devd", "--devices", "2", "-sm", "tensor", "-devd", "RPC1", ok=False)
    assert bad.returncode == 2 and bad.stderr.decode().count("\n") == 1
    assert "with --split-mode tensor a draft-dflash drafter" in bad.stderr.decode()


def test_row_split_is_refused_by_rpc_devices_in_one_line(env: dict[str, str], tmp_path: Path) -> None:
    bad = short(env, tmp_path / "row", "--devices", "2", "--split-mode", "row", ok=False)
    err = bad.stderr.decode()
    assert bad.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "does not support split buffers" in err, err
    endpoints = [d["endpoint"] for d in manifest(tmp_path / "row")["device"]["layout"]["rpc"]]
    assert len(endpoints) == 2 and not any(map(listening, endpoints))


def test_draft_device_places_the_drafter(env: dict[str, str], tmp_path: Path) -> None:
    short(env, tmp_path / "rpc0", "--devices", "2", "--spec-type", SIMPLE, "--draft-device", "RPC0")
    short(env, tmp_path / "cpu", "--devices", "2", "--spec-type", SIMPLE, "-devd", "none")
    short(env, tmp_path / "same", "--devices", "2")
    drafter = loads(tmp_path / "rpc0")[1]
    assert [d for d, _ in drafter["using"]] == ["RPC0"] and set(drafter["layers"]) == {"RPC0"}
    drafter = loads(tmp_path / "cpu")[1]
    assert drafter["using"] == [] and set(drafter["layers"]) == {"CPU"}
    assert manifest(tmp_path / "cpu")["device"]["layout"]["drafter"] == ["CPU"]
    drafter = loads(tmp_path / "same")[1]  # no --draft-device: the target's devices, as llama-server does
    assert [d for d, _ in drafter["using"]] == ["RPC0", "RPC1"]
    bad = short(env, tmp_path / "rpc7", "--devices", "2", "--draft-device", "RPC7", ok=False)
    assert bad.returncode == 2 and bad.stderr.decode() == (
        "kvtrace: --draft-device RPC7: no such device in this run (it has RPC0, RPC1; none = the CPU)\n")
    assert not (tmp_path / "rpc7").exists()


@pytest.mark.parametrize("spec", [DFLASH, EAGLE3])
def test_a_hidden_state_drafter_away_from_the_output_head_is_one_line(env: dict[str, str], tmp_path: Path,
                                                                      spec: str) -> None:
    """DFlash and EAGLE3 drafters compute with the target's output head (ctx_other): on a device the drafter does
    not have, ggml aborts the whole process. The engine reads where llama.cpp put it and refuses instead."""
    bad = short(env, tmp_path / "s", "--devices", "2", "--spec-type", spec, "--draft-device", "RPC0", ok=False)
    assert bad.returncode == 2 and bad.stderr.decode() == (
        f"kvtrace: --draft-device RPC0: a {spec} drafter computes with the target's output head, which llama.cpp put "
        "on RPC1; put the drafter there (ggml would abort the process)\n")
    assert b"layer   2 assigned to device RPC1" in (tmp_path / "s" / "raw.log").read_bytes()
    endpoints = [d["endpoint"] for d in manifest(tmp_path / "s")["device"]["layout"]["rpc"]]
    assert len(endpoints) == 2 and not any(map(listening, endpoints)), "stopped on the way out of a refusal too"


def test_rpc_takes_the_users_own_devices_and_leaves_them_running(env: dict[str, str], tmp_path: Path) -> None:
    with rpc_servers(2, command()) as servers:
        done = short(env, tmp_path / "own", "--rpc", servers.arg, "--draft-device", "RPC1")
        layout = json.loads(done.stdout)["layout"]
        assert [(d["device"], d["endpoint"], d["started_here"]) for d in layout["rpc"]] == [
            ("RPC0", servers.endpoints[0], False), ("RPC1", servers.endpoints[1], False)]
        assert all(map(listening, servers.endpoints)), "the user's servers are theirs to stop"
        target, drafter = loads(tmp_path / "own")
        assert [e for _, e in target["using"]] == servers.endpoints and set(drafter["layers"]) == {"RPC1"}
        flags = analyze.parse(tmp_path / "own").meta["flags"]
        assert flags["--rpc"] == servers.arg and flags["-devd"] == "RPC1"


@pytest.mark.parametrize(("args", "message"), [
    (("--rpc", "10.1.2.3:50052"), "kvtrace: --rpc 10.1.2.3:50052: only loopback addresses (an RPC server serves "
     "anyone who reaches it)\n"),
    (("--rpc", "127.0.0.1:50052", "--devices", "2"), "kvtrace: --devices starts its own RPC devices: give it or "
     "--rpc, not both\n"),
    (("--draft-device", "RPC1"), "kvtrace: --draft-device names one of the run's devices: give --devices N or --rpc "
     "too\n"),
])  # fmt: skip
def test_device_settings_that_cannot_work_are_one_line(env: dict[str, str], tmp_path: Path, args: tuple[str, ...],
                                                       message: str) -> None:
    bad = short(env, tmp_path / "s", *args, ok=False)
    assert bad.returncode == 2 and bad.stderr.decode() == message
    assert not (tmp_path / "s").exists()


# -- the devices never outlive the command ---------------------------------------------------------------


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _decoding(session: Path) -> bool:
    try:
        return manifest(session)["outcome"]["status"] == "running" and (
            b"input batch info" in (session / "raw.log").read_bytes())
    except (OSError, ValueError, KeyError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_devices_are_stopped_when_the_command_is_signalled(env: dict[str, str], tmp_path: Path,
                                                             sig: signal.Signals) -> None:
    session = tmp_path / "s"
    proc = start_kvtrace("capture", "engine", "--devices", "2", "--out", str(session), "--fault", "none",
                         "--requests", "1", "--cycles", "200", "--pace", "0.5", cwd=tmp_path, env=env)
    try:
        wait_for(lambda: _decoding(session), timeout=120, what="the capture's first decodes")
        layout = manifest(session)["device"]["layout"]
        endpoints = [d["endpoint"] for d in layout["rpc"]]
        devices = _children(proc.pid)
        assert len(devices) == 2 and all(map(listening, endpoints))
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    wait_for(lambda: not any(map(_alive, devices)), timeout=30, what="the devices to stop")
    assert not any(map(listening, endpoints))
    if sig != signal.SIGKILL:  # written up on the way out
        assert proc.returncode == 128 + sig and manifest(session)["outcome"]["status"] == f"stopped by {sig.name}"
        assert err.decode() == f"kvtrace: stopped by {sig.name}; {session} holds what it captured\n"


# -- the demo --------------------------------------------------------------------------------------------


def test_demo_on_two_devices_reproduces_the_seed_layout(env: dict[str, str], tmp_path: Path) -> None:
    done = run_kvtrace("demo", "--devices", "2", "--no-dashboard", "--out", "demo", cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    out, err = done.stdout.decode(), done.stderr.decode()
    assert re.search(r"verdict: +inconsistent_positions \(drafter, decided by line \d+\)", out), out
    assert re.search(r"devices: RPC0 127\.0\.0\.1:\d+, RPC1 127\.0\.0\.1:\d+ \(started here\); target on RPC0, "
                     r"RPC1; drafter on RPC1\n", err), err
    session = tmp_path / "demo"
    result = check_truth(session, "stale-drafter")
    place = result.meta["placement"]
    assert (place["split_mode"], place["tensor_split"], place["draft_device"]) == ("layer", "1,1", "RPC1")
    assert manifest(session)["engine"]["spec_type"] == DFLASH


def test_dashboard_names_the_devices_and_where_the_drafter_sits(env: dict[str, str], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The real app opened on a two-device session (as `kvtrace dashboard SESSION` opens it): its environment
    panel lists RPC0 and RPC1 by endpoint, the layout line, and the drafter's layers on RPC1 only."""
    from streamlit.testing.v1 import AppTest

    from kvtrace.analyze.dashboard.launch import OPEN_ENV

    session = tmp_path / "s"
    done = short(env, session, "--devices", "2", "-ts", "1,1", "-devd", "RPC1")
    rpc = json.loads(done.stdout)["layout"]["rpc"]
    monkeypatch.setenv(OPEN_ENV, str(session))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app.py"), default_timeout=120)
    at.run()
    assert not at.exception
    frames = [df.value.to_dict("records") for df in at.dataframe]
    listed = next(f for f in frames if f and "backend" in f[0])
    assert [(r["device"], r["backend"], r["description"]) for r in listed if r["backend"] == "RPC"] == [
        (d["device"], "RPC", d["endpoint"]) for d in rpc]
    placed = next(f for f in frames if f and "model" in f[0])
    assert {r["device"] for r in placed if r["model"] == "drafter" and r["layers"]} == {"RPC1"}
    assert {r["device"] for r in placed if r["model"] == "target" and r["layers"]} == {"RPC0", "RPC1"}
    assert any("drafter device asked for: RPC1" in t.value for t in at.text)
