"""The dashboard's environment panel shows the devices and where the target and the drafter sat (AppTest: real
app.py, real reader)."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvtrace.analyze.dashboard.launch import OPEN_ENV
from tests.analyze.reader.test_devices import RPC_LOG

ROOT = Path(__file__).resolve().parents[3]
SEED = ROOT / "tests" / "fixtures" / "corpus" / "00_beellama-28-multigpu-dflash-seed.log"


@pytest.fixture(autouse=True)
def _no_open_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OPEN_ENV, raising=False)


def _frames(name: str, data: bytes) -> list[list[dict[str, str]]]:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.run()
    at.sidebar.file_uploader[0].set_value([(name, data, "text/plain")])
    at.run()
    assert not at.exception
    return [df.value.to_dict("records") for df in at.dataframe]


def test_environment_panel_lists_the_seed_reports_two_gpus() -> None:
    frames = _frames(SEED.name, SEED.read_bytes())
    assert [{"device": "CUDA0", "backend": "CUDA", "description": "NVIDIA GeForce RTX 3080", "memory": "11910 MiB"},
            {"device": "CUDA1", "backend": "CUDA", "description": "NVIDIA GeForce RTX 3060",
             "memory": "11911 MiB"}] in frames


def test_environment_panel_places_target_and_drafter_on_rpc_devices() -> None:
    frames = _frames("rpc.log", RPC_LOG.encode())
    placement = next(f for f in frames if f and "model" in f[0])
    assert {(r["model"], r["device"], r["layers"]) for r in placement} >= {
        ("target", "RPC0", "0-1"), ("target", "RPC1", "2"), ("drafter", "RPC1", "0")}
    assert any(f and f[0].get("device") == "RPC0" and f[0].get("description") == "127.0.0.1:50152" for f in frames)
