"""What the embedded engine is asked to do: its settings and their checks, with no llama.cpp import (the
command line reads the choices from here without loading the engine)."""

from __future__ import annotations

import shlex
import signal
from dataclasses import dataclass
from pathlib import Path

from kvtrace.capture.engine.lines import FLAVORS
from kvtrace.capture.engine.llama_log import LOG_FORMATS
from kvtrace.capture.rpc import is_loopback

FAULTS = ("none", "stale-drafter", "no-rollback", "silent-stale", "stops-drafting", "drafter-lags")
# faults llama.cpp never refuses at their onset (the health findings' ground truth): they start at a chosen
# request and cycle (`fault_at`) and run on draft-simple and draft-dflash
SILENT_FAULTS = ("silent-stale", "stops-drafting", "drafter-lags")
DRAFTING = ("block", "chain")
# llama.cpp's own --spec-type names. draft-dflash and draft-eagle3: real `dflash` / `eagle3` drafters fed the
# target's layer inputs; draft-simple: a plain llama drafter (`drafting` picks its batch shape).
SPEC_TYPES = ("draft-dflash", "draft-eagle3", "draft-simple")
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}
MAX_DEVICES = 16  # GGML_RPC_MAX_SERVERS


class EngineError(RuntimeError):
    """The engine cannot run as asked; the message is one line for the user."""


class EngineStopped(Exception):
    """The run was asked to stop by a signal (request_stop); what it captured so far is written up."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


_STOP: list[int] = []  # signals received, for the loop to act on


def request_stop(signum: int, _frame: object = None) -> None:
    """A signal handler. A Python exception raised inside llama.cpp's log callback (where a signal's handler
    often runs, mid-decode) is dropped there, so the handler only records the signal, and the loop raises
    EngineStopped at its next decode (check_stop)."""
    _STOP.append(signum)


def check_stop() -> None:
    if _STOP:
        signum = _STOP[0]
        _STOP.clear()
        raise EngineStopped(signum)


@dataclass(slots=True)
class EngineConfig:
    fault: str = "none"
    spec_type: str = "draft-dflash"
    requests: int = 3
    cycles: int = 32  # draft/verify cycles per request (a request also ends when its context is full)
    draft: int = 3  # k, tokens drafted per cycle (upstream's --spec-draft-n-max default)
    seed: int = 0
    target: Path | None = None  # real GGUF paths; both or neither (then the generated tiny pair)
    drafter: Path | None = None
    cache_dir: Path | None = None
    log_prefix: bool = True  # new-scheme `M.SS.mmm.uuu L ` prefix on every entry (jsonl: `time` set, else 0)
    log_format: str = "text"  # jsonl: the objects b11434's --log-jsonl writes, one per log call
    kv_debug: bool = True  # LLAMA_KV_CACHE_DEBUG=1 (off: measure context attribution without find_slot)
    flavor: str = "fork"  # wording of the server/speculative lines: fork, fork-v0.2, upstream
    # draft-simple only. block: one plain-llama drafter batch [id_last, mask x k] per cycle (the seed
    # report's batch shape, without DFlash's graph); chain: k one-token drafter decodes
    drafting: str = "block"
    prompt_words: tuple[int, int] = (24, 90)  # length range of the generated prompts, in words
    n_ctx_target: int = 8192
    n_ctx_drafter: int = 4096  # differs from the target's, as in real setups (its find_slot `size`)
    n_batch: int = 512
    n_threads: int = 1
    n_gpu_layers: int = 0
    split_mode: str = "layer"
    tensor_split: tuple[float, ...] = ()
    main_gpu: int = 0
    rpc: tuple[str, ...] = ()  # the user's llama.cpp RPC servers (loopback HOST:PORT), each one more device
    devices: int = 0  # RPC devices the run starts on loopback itself (and always stops)
    draft_device: str = ""  # the drafter's device (RPC1; "none": the CPU); default: the target's devices
    progress: bool = False
    pace_s: float = 0.0  # sleep after each cycle, log flushed first: a capture slow enough to watch live
    # where a silent fault starts: (request, cycle); cycle None = a third of the way into the request
    # (stops-drafting starts at the request itself)
    fault_at: tuple[int, int | None] = (1, None)
    lag_cycles: int = 8  # drafter-lags: cycles the drafter's cache stays put before a draft goes in at the target's

    def fault_start(self) -> tuple[int, int]:
        """The (request, cycle) a silent fault starts at."""
        request, cycle = self.fault_at
        if self.fault == "stops-drafting":
            return request, 0
        return request, self.cycles // 3 if cycle is None else cycle

    def validate(self) -> None:
        if self.fault not in FAULTS:
            raise EngineError(f"unknown fault {self.fault!r} (choose from {', '.join(FAULTS)})")
        if self.flavor not in FLAVORS:
            raise EngineError(f"unknown flavour {self.flavor!r} (choose from {', '.join(FLAVORS)})")
        if self.log_format not in LOG_FORMATS:
            raise EngineError(f"unknown log format {self.log_format!r} (choose from {', '.join(LOG_FORMATS)})")
        if self.spec_type not in SPEC_TYPES:
            raise EngineError(f"unknown spec type {self.spec_type!r} (choose from {', '.join(SPEC_TYPES)})")
        if self.drafting not in DRAFTING:
            raise EngineError(f"unknown drafting {self.drafting!r} (choose from {', '.join(DRAFTING)})")
        if self.split_mode not in SPLIT_MODES:
            raise EngineError(f"unknown split mode {self.split_mode!r} (choose from {', '.join(SPLIT_MODES)})")
        if self.requests < 1 or self.cycles < 1:
            raise EngineError("--requests and --cycles must be at least 1")
        if self.fault == "stale-drafter" and self.requests < 2:
            raise EngineError("stale-drafter needs at least 2 requests: the drafter goes stale at a reset")
        if self.fault in SILENT_FAULTS:
            self._validate_silent()
        if not 1 <= self.draft <= min(64, self.n_batch - 1):
            raise EngineError(f"--draft must be between 1 and {min(64, self.n_batch - 1)}")
        if not 1 <= self.prompt_words[0] <= self.prompt_words[1]:
            raise EngineError("prompt_words must be a (min, max) range with 1 <= min <= max")
        if not 0 <= self.pace_s <= 60:
            raise EngineError("--pace must be between 0 and 60 seconds")
        if min(self.n_ctx_target, self.n_ctx_drafter) < 256:
            raise EngineError("context sizes must be at least 256")
        if not 0 <= self.devices <= MAX_DEVICES:
            raise EngineError(f"--devices must be between 0 and {MAX_DEVICES}")
        if self.devices and self.rpc:
            raise EngineError("--devices starts its own RPC devices: give it or --rpc, not both")
        for endpoint in self.rpc:
            host, _, port = endpoint.rpartition(":")
            if not port.isdigit() or not 0 < int(port) < 65536:
                raise EngineError(f"--rpc {endpoint}: not HOST:PORT")
            if not is_loopback(host):
                raise EngineError(f"--rpc {endpoint}: only loopback addresses (an RPC server serves anyone who "
                                  "reaches it)")
        if self.draft_device and not (self.devices or self.rpc):
            raise EngineError("--draft-device names one of the run's devices: give --devices N or --rpc too")

    def _validate_silent(self) -> None:
        if self.spec_type not in ("draft-simple", "draft-dflash"):
            raise EngineError(f"--fault {self.fault} runs on draft-simple and draft-dflash, not {self.spec_type}")
        request, cycle = self.fault_start()
        if not 0 <= request < self.requests or not 0 <= cycle < self.cycles:
            raise EngineError(f"--fault-at {request}:{cycle} is outside the run ({self.requests} requests of "
                              f"{self.cycles} cycles, both counted from 0)")
        if self.fault == "stops-drafting" and (request < 1 or self.requests - request < 2):
            raise EngineError("stops-drafting needs drafts first and two requests without: --fault-at 1 or later, "
                              "and at least two requests from there")
        if self.fault == "drafter-lags" and not 1 <= self.lag_cycles < self.cycles:
            raise EngineError("--lag-cycles must be at least 1 and below --cycles")

    def command_line(self) -> str:
        """The `kvtrace capture engine` command of this run, device flags in llama-server's spelling (`-ngl`,
        `-sm`, `-ts`, `-mg`, `-devd`): what the reader takes the layout flags from, as for a wrapped server."""
        args = ["kvtrace", "capture", "engine", "--spec-type", self.spec_type, "--fault", self.fault,
                "--requests", str(self.requests), "--cycles", str(self.cycles), "--draft", str(self.draft),
                "--seed", str(self.seed)]
        if self.target is not None and self.drafter is not None:
            args += ["--target", str(self.target), "--drafter", str(self.drafter)]
        if self.spec_type == "draft-simple":
            args += ["--drafting", self.drafting]
        if self.flavor != "fork":
            args += ["--flavor", self.flavor]
        if self.fault in SILENT_FAULTS:
            request, cycle = self.fault_start()
            args += ["--fault-at", f"{request}:{cycle}"]
            if self.fault == "drafter-lags":
                args += ["--lag-cycles", str(self.lag_cycles)]
        args += [] if self.kv_debug else ["--no-kv-debug"]
        args += [] if self.log_prefix else ["--no-log-prefix"]
        args += [] if self.log_format == "text" else ["--log-format", self.log_format]
        args += ["--threads", str(self.n_threads)]
        if self.devices:
            args += ["--devices", str(self.devices)]
        if self.rpc:
            args += ["--rpc", ",".join(self.rpc)]
        args += ["-ngl", str(self.n_gpu_layers), "-sm", self.split_mode]
        if self.tensor_split:
            args += ["-ts", ",".join(f"{v:g}" for v in self.tensor_split)]
        args += ["-mg", str(self.main_gpu)]
        if self.draft_device:
            args += ["-devd", self.draft_device]
        return shlex.join(args)




def require_llama_cpp() -> None:
    """The engine runs llama.cpp through llama-cpp-python, an extra that compiles llama.cpp on install."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        raise EngineError("the embedded engine needs llama-cpp-python: pip install 'kvtrace[engine]'")
