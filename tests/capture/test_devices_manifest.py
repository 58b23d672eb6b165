"""The devices a llama.cpp program lists itself (`--list-devices`), as the manifest records them. The real
llama-server with two RPC devices is in test_two_devices.py; here a small program that answers like b11434
(its wording measured: `RPC0: 127.0.0.1:50152 (24105 MiB, 24105 MiB free)`)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from kvtrace.analyze.reader.session import free_port
from kvtrace.capture.devices import device_flags, list_devices, parse_devices, rpc_endpoints
from tests.capture.capture_helpers import manifest, run_kvtrace

LISTING = """\
load_backend: loaded RPC backend from /x/libggml-rpc.so
Available devices:
  RPC0: 127.0.0.1:50152 (24105 MiB, 24105 MiB free)
  RPC1: 127.0.0.1:50153 (24105 MiB, 24000 MiB free)
  CUDA0: NVIDIA GeForce RTX 3080 (11910 MiB, 11000 MiB free)
"""


def test_parse_the_device_list_and_the_rpc_flags() -> None:
    assert [(d["device"], d["backend"], d["name"], d["memory_mib"], d["free_mib"]) for d in parse_devices(LISTING)] == [
        ("RPC0", "RPC", "127.0.0.1:50152", 24105, 24105), ("RPC1", "RPC", "127.0.0.1:50153", 24105, 24000),
        ("CUDA0", "CUDA", "NVIDIA GeForce RTX 3080", 11910, 11000)]
    argv = ["llama-server", "-m", "m.gguf", "--rpc", "127.0.0.1:1,127.0.0.1:2", "-ngl", "99"]
    assert device_flags(argv) == ["--rpc", "127.0.0.1:1,127.0.0.1:2"]
    assert rpc_endpoints(["llama-server", "--rpc=127.0.0.1:3"]) == ["127.0.0.1:3"]


def _fake_llama(tmp_path: Path, listing: str) -> Path:
    """An executable named like a llama.cpp program: --help names --list-devices, which prints `listing`."""
    path = tmp_path / "llama-fake-server"
    path.write_text(f"""#!{sys.executable}
import sys, time
if "--help" in sys.argv:
    print("--list-devices  print a list of available devices and exit")
elif "--version" in sys.argv:
    print("version: 1 (abc1234)")
elif "--list-devices" in sys.argv:
    print({listing!r}, end="")
else:
    print("srv  main: fake server", flush=True)
""")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_an_rpc_server_missing_from_the_list_is_one_line(tmp_path: Path) -> None:
    fake = _fake_llama(tmp_path, LISTING)
    found = list_devices(str(fake), [str(fake), "--rpc", "127.0.0.1:50152,127.0.0.1:9"], dict(os.environ),
                         "--list-devices")
    assert found is not None and found["error"].startswith("cannot reach the RPC server 127.0.0.1:9")
    assert list_devices(str(fake), [str(fake)], dict(os.environ), "--help without it") is None


def test_the_manifest_records_the_listed_devices(tmp_path: Path) -> None:
    fake = _fake_llama(tmp_path, LISTING)
    proc = run_kvtrace("capture", "run", "--quiet", "--out", str(tmp_path / "s"), "--", str(fake),
                       "--rpc", "127.0.0.1:50152,127.0.0.1:50153", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr.decode()  # the fake exits 0 at once: a complete capture
    devices = manifest(tmp_path / "s")["devices"]
    assert [d["device"] for d in devices["devices"]] == ["RPC0", "RPC1", "CUDA0"]
    assert "Available devices:" in devices["raw"] and devices["command"][-1] == "--list-devices"


def test_a_wrong_rpc_address_stops_the_capture_with_one_line(tmp_path: Path) -> None:
    fake = _fake_llama(tmp_path, "Available devices:\n  CPU: x (1 MiB, 1 MiB free)\n")
    proc = run_kvtrace("capture", "run", "--quiet", "--out", str(tmp_path / "s"), "--", str(fake),
                       "--rpc", "127.0.0.1:9", cwd=tmp_path)
    err = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "cannot reach the RPC server 127.0.0.1:9" in err[0], err
    assert not (tmp_path / "s" / "raw.log").exists()


def test_engine_rpc_refuses_a_server_nothing_listens_on_in_one_line(tmp_path: Path) -> None:
    """`kvtrace capture engine --rpc`: `make setup` builds llama-cpp-python with the RPC backend, so the engine
    asks the server and refuses one nothing listens on (ggml-rpc itself would abort the process). Nothing is
    captured."""
    closed = free_port()
    proc = run_kvtrace("capture", "engine", "--rpc", f"127.0.0.1:{closed}", "--out", str(tmp_path / "s"),
                       cwd=tmp_path, timeout=120)
    err = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 2 and err == [f"kvtrace: cannot reach the RPC server 127.0.0.1:{closed}"], err
    assert not (tmp_path / "s").exists()
