"""What kvtrace reads from and adds to a llama.cpp command line; GPU listing."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from kvtrace.capture.gpus import apply_visible_devices, parse_nvidia_smi_csv, query_gpus
from kvtrace.capture.llama_args import (
    add_log_flags,
    endpoint,
    is_llama_program,
    redact_argv,
    redact_env,
    relevant_env,
    triage_flags,
)

HELP_NEW = "-v, --verbose\n--log-prefix, --no-log-prefix\n--log-timestamps, --no-log-timestamps\n--log-colors [on|off]"
HELP_OLD = "-v, --verbose\n--log-prefix\n--log-timestamps\n"  # before --log-colors existed


def test_llama_programs_are_recognised() -> None:
    for name in ("llama-server", "/opt/beellama.cpp/build/bin/llama-server", "llama-cli", "llama-server.exe",
                 "ik_llama-server", "beellama-server"):
        assert is_llama_program(name), name
    for name in ("python3", "/usr/bin/true", "llamafile-ish-tool", "vllm"):
        assert not is_llama_program(name), name


def test_flags_are_added_unless_chosen() -> None:
    argv = ["llama-server", "-m", "m.gguf"]
    assert add_log_flags(argv, {}, HELP_NEW).added == ["-v", "--log-prefix", "--log-timestamps", "--log-colors",
                                                      "off"]
    chosen = ["llama-server", "-lv", "4", "--no-log-prefix", "--log-colors=on"]
    assert add_log_flags(chosen, {}, HELP_NEW).added == ["--log-timestamps"]
    assert add_log_flags(argv, {"LLAMA_ARG_LOG_TIMESTAMPS": "0", "LLAMA_LOG_VERBOSITY": "5"}, HELP_NEW).added == [
        "--log-prefix", "--log-colors", "off"]


def test_a_flag_this_build_does_not_know_is_left_out() -> None:
    aug = add_log_flags(["llama-server"], {}, HELP_OLD)
    assert aug.added == ["-v", "--log-prefix", "--log-timestamps"]
    assert aug.skipped == ["--log-colors"]


def test_triage_flags_from_the_seed_command() -> None:
    argv = ["llama-server", "--port", "5800", "-hf", "unsloth/Qwen3.6-27B-GGUF:Q4_K_S", "--spec-draft-model",
            "d.gguf", "--spec-type", "dflash", "--spec-draft-ngl", "all", "--jinja", "--flash-attn", "on",
            "--no-mmap", "--mlock", "--fit-target", "512", "--cache-type-k", "turbo4", "--cache-type-v",
            "turbo3_tcq", "--parallel", "1", "--kv-unified", "--ctx-size", "32000", "-sm", "layer",
            "-ts", "3,2", "-ngl=99"]
    flags = triage_flags(argv)
    assert flags == {
        "port": "5800", "hf_repo": "unsloth/Qwen3.6-27B-GGUF:Q4_K_S", "model_draft": "d.gguf",
        "spec_type": "dflash", "n_gpu_layers_draft": "all", "flash_attn": "on", "mmap": False, "mlock": True,
        "fit_target": "512", "cache_type_k": "turbo4", "cache_type_v": "turbo3_tcq", "parallel": "1",
        "kv_unified": True, "ctx_size": "32000", "split_mode": "layer", "tensor_split": "3,2",
    }
    # -ngl=99 is not llama.cpp syntax for a short flag: not read as -ngl
    assert "n_gpu_layers" not in flags
    assert triage_flags(["llama-server", "-fa", "-c", "4096"]) == {"flash_attn": "on", "ctx_size": "4096"}


def test_endpoint() -> None:
    assert endpoint(["llama-server"]) == ("127.0.0.1", 8080)
    assert endpoint(["llama-server", "--host", "0.0.0.0", "--port=9001"]) == ("127.0.0.1", 9001)
    assert endpoint(["llama-server"], {"LLAMA_ARG_PORT": "7000", "LLAMA_ARG_HOST": "::1"}) == ("::1", 7000)


def test_secrets_are_redacted() -> None:
    argv = ["llama-server", "--api-key", "k1", "--api-key=k2", "--hf-token", "hf_x", "--api-key-file", "keys.txt",
            "-mu", "https://user:pw@example.org/m.gguf", "-m", "model.gguf"]
    assert redact_argv(argv) == ["llama-server", "--api-key", "***", "--api-key=***", "--hf-token", "***",
                                 "--api-key-file", "keys.txt", "-mu", "https://***@example.org/m.gguf", "-m",
                                 "model.gguf"]
    env = {"HF_TOKEN": "a", "OPENAI_API_KEY": "b", "DB_PASSWORD": "c", "MY_SECRET": "d", "CUDA_VISIBLE_DEVICES": "0"}
    assert redact_env(env) == {"HF_TOKEN": "***", "OPENAI_API_KEY": "***", "DB_PASSWORD": "***",
                               "MY_SECRET": "***", "CUDA_VISIBLE_DEVICES": "0"}
    assert relevant_env({"LLAMA_API_KEY": "z", "GGML_CUDA_X": "1", "HOME": "/root", "PATH": "/bin"}) == {
        "GGML_CUDA_X": "1", "LLAMA_API_KEY": "***"}


# As `nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version,pci.bus_id,compute_cap
# --format=csv,noheader,nounits` prints it on the seed report's two-GPU machine.
SMI = """0, GPU-5e3c1a2b-0000-1111-2222-333344445555, NVIDIA GeForce RTX 3060, 12288, 595.71.05, 00000000:04:00.0, 8.6
1, GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff, NVIDIA GeForce RTX 3080, 12288, 595.71.05, 00000000:07:00.0, 8.6
"""


def test_gpus_and_cuda_visible_devices() -> None:
    gpus = parse_nvidia_smi_csv(SMI)
    assert [g.name for g in gpus] == ["NVIDIA GeForce RTX 3060", "NVIDIA GeForce RTX 3080"]
    assert gpus[1].pci_bus_id == "00000000:07:00.0" and gpus[0].memory_total == "12288"
    ordered = apply_visible_devices(parse_nvidia_smi_csv(SMI), "1,0")
    assert [g.index for g in ordered] == [1, 0] and all(g.visible for g in ordered)
    only = apply_visible_devices(parse_nvidia_smi_csv(SMI), "GPU-9f8e")
    assert [(g.index, g.visible) for g in only] == [(1, True), (0, False)]
    none = apply_visible_devices(parse_nvidia_smi_csv(SMI), "")
    assert not any(g.visible for g in none)
    assert all(g.visible for g in apply_visible_devices(parse_nvidia_smi_csv(SMI), None))


def _fake_smi(folder: Path, body: str) -> None:
    """An `nvidia-smi` on PATH that runs `body` (Python), for each state the manifest can record."""
    path = folder / "nvidia-smi"
    path.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize("state", ["not found", "ok", "exit"])
def test_each_nvidia_smi_state_is_recorded_as_itself(state: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if state == "ok":
        _fake_smi(tmp_path, f"sys.stdout.write({SMI!r})")
    elif state == "exit":
        _fake_smi(tmp_path, "sys.stderr.write('NVIDIA-SMI has failed: no driver\\n'); sys.exit(9)")
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing else on PATH: no machine's own nvidia-smi
    got = query_gpus({"CUDA_VISIBLE_DEVICES": "1"})
    assert got["cuda_visible_devices"] == "1"
    if state == "not found":
        assert (got["nvidia_smi"], got["gpus"]) == ("not found", [])
    elif state == "ok":
        assert got["nvidia_smi"] == "ok"
        assert [(g["index"], g["visible"]) for g in got["gpus"]] == [(1, True), (0, False)]  # CUDA's order
    else:
        assert (got["nvidia_smi"], got["gpus"]) == ("exit 9: NVIDIA-SMI has failed: no driver", [])
