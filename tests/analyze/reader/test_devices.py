"""The device layout from the log: devices, and where the target's and the drafter's layers and buffers sit.

Lines are built exactly to what llama.cpp prints (b11434's RPC lines as measured with two ggml-rpc-servers,
llama_model_load_from_file_impl's `using device`, the CUDA/ROCm/Vulkan/Metal init lines) or taken from the
labelled seed report."""

from __future__ import annotations

from pathlib import Path

from kvtrace import analyze
from kvtrace.analyze.findings.rules import env_of
from kvtrace.analyze.findings.signatures import match_signature
from kvtrace.analyze.reader.split import cut_points
from kvtrace.analyze.views.report import markdown_report
from tests.analyze.reader.formats import batch_dump

CORPUS = Path(__file__).parents[2] / "fixtures" / "corpus"

# b11434 with --rpc A,B -ngl 99 -sm layer -ts 1,1 -md dflash.gguf -devd RPC1: first the fit pass measures both
# models without allocating (load_mode = none, everything on the CPU), then the real loads
RPC_LOG = """\
0.00.002.976 I cmn  common_param: common_params_print_info: build 0 (unknown) with GNU 12.2.0 for Linux x86_64
0.00.002.986 I cmn  common_param: device_info:
0.00.002.994 I cmn  common_param:   - CPU     : AMD EPYC (24105 MiB, 24105 MiB free)
0.00.002.995 I cmn  common_param:   - RPC0    : 127.0.0.1:50152 (24105 MiB, 24105 MiB free)
0.00.002.996 I cmn  common_param:   - RPC1    : 127.0.0.1:50153 (24105 MiB, 24105 MiB free)
0.00.004.979 I srv    load_model: loading model 'models/tiny-target.gguf'
0.00.005.307 I common_params_fit_impl: getting device memory data for initial parameters:
0.00.005.990 I llama_model_loader: loaded meta data with 24 key-value pairs and 21 tensors from models/tiny-target.gguf (version GGUF V3 (latest))
0.00.006.684 I load_tensors: loading model tensors, this can take a while... (load_mode = none)
0.00.006.792 D load_tensors: layer   0 assigned to device CPU, is_swa = 0
0.00.007.948 I llama_kv_cache:        CPU KV buffer size =     0.00 MiB
0.00.008.000 I llama_prepare_model_devices: using device RPC0 (127.0.0.1:50152) (unknown id) - 24105 MiB free
0.00.008.001 I llama_prepare_model_devices: using device RPC1 (127.0.0.1:50153) (unknown id) - 24105 MiB free
0.00.008.002 I llama_model_loader: loaded meta data with 24 key-value pairs and 21 tensors from models/tiny-target.gguf (version GGUF V3 (latest))
0.00.008.684 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
0.00.008.792 D load_tensors: layer   0 assigned to device RPC0, is_swa = 0
0.00.008.800 D load_tensors: layer   1 assigned to device RPC0, is_swa = 0
0.00.008.801 D load_tensors: layer   2 assigned to device RPC1, is_swa = 0
0.00.009.188 I load_tensors: RPC0[127.0.0.1:50152] model buffer size =     0.31 MiB
0.00.009.189 I load_tensors:   CPU_Mapped model buffer size =     0.10 MiB
0.00.009.861 D llama_kv_cache: layer   0: dev = RPC0
0.00.009.939 D llama_kv_cache: layer   1: dev = RPC1
0.00.009.948 I llama_kv_cache: RPC0[127.0.0.1:50152] KV buffer size =     1.00 MiB
0.00.009.949 I llama_kv_cache: RPC1[127.0.0.1:50153] KV buffer size =     1.00 MiB
0.00.010.218 I sched_reserve:        CPU compute buffer size =     3.14 MiB
0.00.014.563 I common_speculative_init_result: loading draft model 'models/dflash.gguf'
0.00.014.564 I llama_prepare_model_devices: using device RPC1 (127.0.0.1:50153) (unknown id) - 24105 MiB free
0.00.014.565 I llama_model_loader: loaded meta data with 20 key-value pairs and 11 tensors from models/dflash.gguf (version GGUF V3 (latest))
0.00.014.994 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
0.00.014.995 D load_tensors: layer   0 assigned to device RPC1, is_swa = 0
0.00.015.205 I load_tensors: RPC1[127.0.0.1:50153] model buffer size =     0.33 MiB
0.00.015.435 I llama_kv_cache: RPC1[127.0.0.1:50153] KV buffer size =     0.50 MiB
0.00.018.199 I spec common_specu: adding speculative implementation 'draft-dflash'
"""


def test_rpc_devices_and_placement_of_target_and_drafter() -> None:
    meta = analyze.parse(RPC_LOG.encode()).meta
    assert meta["versions"][0]["build"] == "0" and meta["versions"][0]["commit"] == "unknown"
    assert "RPC" in meta["backends"] and "CPU" in meta["backends"]
    assert [(g["device"], g["backend"], g["name"], g["memory_mib"]) for g in meta["gpus"]] == [
        ("RPC0", "RPC", "127.0.0.1:50152", 24105), ("RPC1", "RPC", "127.0.0.1:50153", 24105)]
    assert meta["n_gpus"] == 2
    assert meta["spec_impls"] == ["draft-dflash"]
    target, drafter = meta["placement"]["target"], meta["placement"]["drafter"]
    # the no-alloc fit pass put nothing anywhere: the CPU layer it listed is not the target's
    assert target["devices"]["RPC0"]["layers"] == "0-1" and target["devices"]["RPC1"]["layers"] == "2"
    assert target["devices"]["RPC0"]["model_mib"] == 0.31 and target["devices"]["RPC1"]["kv_mib"] == 1.0
    assert "layers" not in target["devices"]["CPU"] and target["devices"]["CPU"]["compute_mib"] == 3.14
    assert target["model"] == "models/tiny-target.gguf" and drafter["model"] == "models/dflash.gguf"
    assert list(drafter["devices"]) == ["RPC1"] and drafter["devices"]["RPC1"]["kv_mib"] == 0.5
    assert meta["placement"]["target_devices"] == 2 and meta["placement"]["drafter_devices"] == 1


def test_split_mode_and_tensor_split_from_the_command_line() -> None:
    text = "llama-server --rpc 127.0.0.1:50152,127.0.0.1:50153 -ngl 99 -sm layer -ts 1,1 -devd RPC1\n" + RPC_LOG
    placement = analyze.parse(text.encode()).meta["placement"]
    assert (placement["split_mode"], placement["tensor_split"], placement["draft_device"]) == ("layer", "1,1", "RPC1")


def test_report_and_advice_name_the_devices_and_the_drafters() -> None:
    result = analyze.parse(RPC_LOG.encode())
    env = env_of(result)
    assert env.devices == ("RPC0", "RPC1") and env.drafter_devices == ("RPC1",)
    assert env.target_devices == ("RPC0", "RPC1")
    md = markdown_report(result)
    assert "| RPC1 | RPC | 127.0.0.1:50153 | 24105 MiB |" in md
    assert "| target | RPC0 | 0-1 |" in md and "| drafter | RPC1 | 0 |" in md


def test_seed_report_two_cuda_devices() -> None:
    result = analyze.parse(CORPUS / "00_beellama-28-multigpu-dflash-seed.log")
    gpus = result.meta["gpus"]
    assert [(g["device"], g["name"], g.get("memory_mib")) for g in gpus] == [
        ("CUDA0", "NVIDIA GeForce RTX 3080", 11910), ("CUDA1", "NVIDIA GeForce RTX 3060", 11911)]
    m = match_signature(result)
    single = [s for s in m.steps if "single GPU" in s]
    assert single and "2 devices (CUDA0, CUDA1)" in single[0]
    assert "| CUDA0 | CUDA | NVIDIA GeForce RTX 3080 | 11910 MiB |" in markdown_report(result)


def test_single_gpu_advice_only_with_more_than_one_device() -> None:
    one = RPC_LOG.replace("0.00.002.996 I cmn  common_param:   - RPC1    : 127.0.0.1:50153 (24105 MiB, 24105 MiB free)\n",
                          "").replace("RPC1", "RPC0").replace("50153", "50152")
    failing = ("\ninit: the tokens of sequence 0 in the input batch have inconsistent sequence positions:\n"
               " - the last position stored in the memory module of the context (i.e. the KV cache) for sequence 0 "
               "is X = 259\n - the tokens for sequence 0 in the input batch have a starting position of Y = 1361\n"
               " it is required that the sequence positions remain consecutive: Y = X + 1\n"
               "decode: failed to initialize batch\nllama_decode: failed to decode, ret = -1\n"
               "dflash: drafter decode failed with -1\n")
    two, single = analyze.parse((RPC_LOG + failing).encode()), analyze.parse((one + failing).encode())
    assert single.meta["n_gpus"] == 1 and two.meta["n_gpus"] == 2
    assert not [s for s in match_signature(single).steps if "single GPU" in s]
    steps = [s for s in match_signature(two).steps if "single GPU" in s]
    assert steps and "the drafter's layers are on RPC1" in steps[0]


def test_other_backends_wordings() -> None:
    cases = {
        "ggml_cuda_init: found 1 ROCm devices:\n  Device 0: AMD Radeon RX 7900 XTX, gfx1100 (0x1100), VMM: no, "
        "Wave Size: 32\n": ("ROCm0", "ROCm", "AMD Radeon RX 7900 XTX"),
        "ggml_vulkan: Found 1 Vulkan devices:\nggml_vulkan: 0 = AMD Radeon 890M Graphics (RADV GFX1150) (radv) | "
        "uma: 1 | fp16: 1 | warp size: 64 | shared memory: 65536 | int dot: 1 | matrix cores: KHR_coopmat\n":
            ("Vulkan0", "Vulkan", "AMD Radeon 890M Graphics"),
        "ggml_metal_device_init: GPU name:   Apple M2 Max\n": ("Metal", "Metal", "Apple M2 Max"),
        "llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 4090) - 23738 MiB free\n":
            ("CUDA0", "CUDA", "NVIDIA GeForce RTX 4090"),
        "Vulkan0: AMD Radeon 890M Graphics (RADV GFX1150) (30720 MiB, 29000 MiB free)\n":
            ("Vulkan0", "Vulkan", "AMD Radeon 890M Graphics (RADV GFX1150)"),
    }
    for text, (device, backend, name) in cases.items():
        meta = analyze.parse(text.encode()).meta
        assert [(g["device"], g["backend"], g["name"]) for g in meta["gpus"]] == [(device, backend, name)], text
        assert backend in meta["backends"], text


def test_older_offload_lines_place_the_target() -> None:
    text = ("llama_model_loader: loaded meta data with 30 key-value pairs and 291 tensors from m.gguf (version GGUF V3)\n"
            "llm_load_tensors: offloading 32 repeating layers to GPU\n"
            "llm_load_tensors: offloaded 33/33 layers to GPU\n"
            "llm_load_tensors:        CPU buffer size =    70.31 MiB\n"
            "llm_load_tensors:      CUDA0 buffer size =  3577.56 MiB\n"
            "llama_kv_cache_init:      CUDA0 KV buffer size =   256.00 MiB\n")
    target = analyze.parse(text.encode()).meta["placement"]["target"]
    assert target["offloaded"] == "33/33"
    assert target["devices"]["CUDA0"] == {"model_mib": 3577.56, "kv_mib": 256.0}


def test_split_buffers_refused_is_a_start_up_failure() -> None:
    text = RPC_LOG.split("0.00.008.792")[0] + (
        "0.00.008.900 E llama_model_load: error loading model: device RPC0 does not support split buffers\n"
        "0.00.008.901 E llama_model_load_from_file_impl: failed to load model\n"
        "0.00.008.950 E srv    load_model: failed to load model, 'models/tiny-target.gguf'\n"
        "0.00.009.000 E srv    llama_server: exiting due to model loading error\n")
    result = analyze.parse(text.encode())
    assert result.verdict.kind == "other" and "start-up failure" in result.verdict.summary
    assert "does not support split buffers" in result.verdict.summary
    m = match_signature(result)
    assert m.name == "model_load_failed"
    assert any("--split-mode layer" in s for s in m.steps)


def test_split_read_merges_the_layout(tmp_path: Path) -> None:
    """Pieces cut at batch dumps between the target's load, its buffers and the drafter's load: the merged
    layout equals the serial one."""
    lines = RPC_LOG.splitlines(keepends=True)
    at_kv = next(i for i, line in enumerate(lines) if "dev = RPC0" in line)
    at_draft = next(i for i, line in enumerate(lines) if "loading draft model" in line)
    dumps = ["".join(f"{x}\n" for x in batch_dump("0.00.009.500 D ", k, 4, 1)) for k in range(0, 40, 4)]
    text = "".join(lines[:at_kv] + dumps + lines[at_kv:at_draft] + dumps + lines[at_draft:])
    path = tmp_path / "raw.log"
    path.write_text(text)
    serial = analyze.parse(path)
    assert len(cut_points(path, path.stat().st_size // 600)) >= 3
    split = analyze.parse(path, piece_bytes=600)
    assert split.meta["placement"] == serial.meta["placement"]
    assert split.meta["gpus"] == serial.meta["gpus"]
    assert serial.meta["placement"]["target"]["devices"]["RPC1"]["kv_mib"] == 1.0


def test_an_rpc_device_lost_mid_run_is_named() -> None:
    """ggml-rpc's own lines when an RPC server goes away (its socket error, then RPC_STATUS_ASSERT's abort)."""
    text = RPC_LOG + "".join(f"{x}\n" for x in batch_dump("0.01.000.000 D ", 0, 4, 1)) + (
        "0.02.000.000 E send failed (bytes_sent=0, size_to_send=8)\n"
        "/build/llama.cpp/ggml/src/ggml-rpc/ggml-rpc.cpp:509: Remote RPC server crashed or returned malformed "
        "response\n")
    result = analyze.parse(text.encode())
    assert result.verdict.kind == "other" and "Remote RPC server crashed" in result.verdict.summary
    m = match_signature(result)
    assert m.name == "device_lost" and "RPC server stopped answering" in m.match.detail
    assert any("RPC0, RPC1" in s for s in m.steps)


SCENARIO_FIXTURES = Path(__file__).parents[2] / "fixtures" / "scenarios"


def test_real_two_device_captures() -> None:
    """Real llama-server b11434 captures over two ggml-rpc-servers (the scenario matrix's fixtures): b11434
    prints `using device` after the model's `loaded meta data` line and names every RPC buffer `RPC0[addr]`."""
    for name, drafter_on in (("draft-dflash-2dev-devd", ["RPC1"]), ("draft-dflash-2dev-layer", ["RPC0", "RPC1"]),
                             ("draft-simple-2dev-layer", ["RPC0", "RPC1"]), ("draft-dflash-2dev-kvu", ["RPC0", "RPC1"])):
        result = analyze.parse(SCENARIO_FIXTURES / f"{name}.log.gz")
        meta = result.meta
        assert [(g["device"], g["backend"]) for g in meta["gpus"]] == [("RPC0", "RPC"), ("RPC1", "RPC")], name
        assert all(g["name"].startswith("127.0.0.1:") and g["memory_mib"] > 0 for g in meta["gpus"]), name
        env = env_of(result)
        assert env.target_devices == ("RPC0", "RPC1") and list(env.drafter_devices) == drafter_on, name
        target = meta["placement"]["target"]["devices"]
        # each RPC buffer on the device of its own address
        assert target["RPC0"]["model_mib"] > 0 and target["RPC1"]["model_mib"] > 0, name
        assert "| RPC1 | RPC | 127.0.0.1:" in markdown_report(result), name


def test_one_device_captures_list_no_gpu() -> None:
    result = analyze.parse(SCENARIO_FIXTURES / "draft-dflash-1slot.log.gz")
    assert result.meta["gpus"] == [] and result.meta["n_gpus"] == 0
    assert list(result.meta["placement"]["target"]["devices"]) == ["CPU"]
