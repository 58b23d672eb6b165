"""The devices an engine run uses, and which of them each model gets.

`--devices N` starts N llama.cpp RPC devices on loopback (capture/engine/rpc_server.py: the engine's own
llama.cpp, so the same RPC protocol) and always stops them; `--rpc` takes the user's own. Each is registered
with llama.cpp as its own programs do for `--rpc`, and named by it (`RPC0`, `RPC1`, ... in the order of
registration within the process). The target gets every device of the run (split by `--split-mode` and
`--tensor-split`), the drafter the one `--draft-device` names, as `-devd` does for llama-server.

ggml keeps a registered RPC device for the rest of the process and llama.cpp would use every one it knows:
once a process has any, each model is given this run's devices explicitly, so an earlier run's stopped
server is never asked for anything (ggml-rpc aborts the process on a server it cannot reach).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kvtrace.capture.engine.config import EngineConfig, EngineError
from kvtrace.capture.engine.rpc_server import NoRpcBackend, command, load_ggml, rpc_proc
from kvtrace.capture.gpus import query_gpus
from kvtrace.capture.rpc import RpcError, RpcServers, start

KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}  # enum ggml_backend_dev_type
NO_DEVICE = "none"  # --draft-device none: the drafter on the CPU, as llama-server's -devd none
# endpoint -> its devices, registered once per process (ggml cannot forget one)
_REGISTERED: dict[str, list[int]] = {}


@dataclass(slots=True)
class Device:
    name: str  # llama.cpp's: RPC1, CUDA0
    description: str  # an RPC device's is its endpoint
    kind: str
    handle: int  # ggml_backend_dev_t
    memory_mib: int | None = None  # asked only of this run's devices (an old RPC one may be gone)
    free_mib: int | None = None

    def entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "description": self.description, "type": self.kind}
        if self.memory_mib is not None:
            out |= {"memory_mib": self.memory_mib, "free_mib": self.free_mib}
        return out


@dataclass(slots=True)
class RunDevices:
    """This run's devices: its RPC devices in `--rpc` order (the started ones last), the other devices llama.cpp
    sees, and where the drafter goes."""

    rpc: list[Device] = field(default_factory=list)
    others: list[Device] = field(default_factory=list)
    started: int = 0  # how many of the RPC devices this run started itself
    draft_device: str = ""
    servers: RpcServers | None = None

    def _offload(self) -> list[Device]:
        # llama.cpp's own default order: RPC servers first, then the GPUs
        return self.rpc + [d for d in self.others if d.kind in ("gpu", "igpu")]

    def target(self) -> list[int] | None:
        """The target's devices; None: llama.cpp's default (every device, where no RPC device was ever known)."""
        return [d.handle for d in self._offload()] if _REGISTERED else None

    def drafter(self) -> list[int] | None:
        if not self.draft_device:
            return self.target()
        if self.draft_device == NO_DEVICE:
            return []
        return [d.handle for d in self._offload() if d.name == self.draft_device]

    def layout(self, config: EngineConfig) -> dict[str, Any]:
        """Which RPC devices the run had and which of them each model was given (empty: no RPC device)."""
        if not self.rpc:
            return {}
        first_started = len(self.rpc) - self.started
        return {"rpc": [{"device": d.name, "endpoint": d.description, "started_here": i >= first_started}
                        for i, d in enumerate(self.rpc)],
                "target": self.names(config, self.target()), "drafter": self.names(config, self.drafter())}

    def names(self, config: EngineConfig, handles: list[int] | None) -> list[str]:
        """The devices a model given these puts its offloaded layers on (["CPU"]: none); with --split-mode
        none, only the main one (llama.cpp drops the others)."""
        if config.n_gpu_layers == 0 or not handles:
            return ["CPU"]
        by_handle = {d.handle: d.name for d in self._offload()}
        names = [by_handle[h] for h in handles]
        if config.split_mode == "none" and len(names) > 1 and config.main_gpu < len(names):
            return [names[config.main_gpu]]
        return names

    def manifest(self, config: EngineConfig) -> dict[str, Any]:
        import llama_cpp

        offload = bool(llama_cpp.llama_supports_gpu_offload())
        used = [d.name for d in self._offload()]
        ran_on = used if offload and used and config.n_gpu_layers != 0 else ["CPU"]
        out: dict[str, Any] = {"ran_on": ran_on, "gpu_offload_supported": offload,
                               "devices": [d.entry() for d in self.others + self.rpc]}
        if layout := self.layout(config):
            out["layout"] = layout
        return out | query_gpus(os.environ)


def _ggml() -> ctypes.CDLL:
    lib = load_ggml()
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(lib, fn).restype = ctypes.c_char_p
        getattr(lib, fn).argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_memory.restype = None
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.POINTER(ctypes.c_size_t)]
    lib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    return lib


def _device(lib: ctypes.CDLL, handle: int, memory: bool) -> Device:
    dev = Device(name=(lib.ggml_backend_dev_name(handle) or b"").decode(errors="replace"),
                 description=(lib.ggml_backend_dev_description(handle) or b"").decode(errors="replace"),
                 kind=KINDS.get(lib.ggml_backend_dev_type(handle), "other"), handle=handle)
    if memory:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        lib.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
        dev.memory_mib, dev.free_mib = total.value >> 20, free.value >> 20
    return dev


def register_rpc(endpoints: list[str]) -> list[int]:
    """Register RPC servers as llama.cpp devices (what `--rpc` does in llama.cpp's programs); their handles."""
    if not endpoints:
        return []
    try:
        lib = _ggml()
        add = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(rpc_proc(lib, "ggml_backend_rpc_add_server"))
    except NoRpcBackend as exc:
        raise EngineError(f"RPC devices need llama.cpp's RPC backend: {exc}") from None
    handles: list[int] = []
    for endpoint in endpoints:
        if endpoint not in _REGISTERED:
            host, _, port = endpoint.rpartition(":")
            try:  # ggml-rpc aborts the process on a server it cannot connect to: ask first
                socket.create_connection((host, int(port)), timeout=5).close()
            except (OSError, ValueError):
                raise EngineError(f"cannot reach the RPC server {endpoint}") from None
            reg = add(endpoint.encode())
            if not reg:
                raise EngineError(f"cannot reach the RPC server {endpoint}")
            lib.ggml_backend_register(reg)
            _REGISTERED[endpoint] = [lib.ggml_backend_reg_dev_get(reg, i)
                                     for i in range(lib.ggml_backend_reg_dev_count(reg))]
        handles += _REGISTERED[endpoint]
    return handles


def resolve(endpoints: list[str], draft_device: str = "", started: int = 0) -> RunDevices:
    """This run's devices (the RPC ones registered first) and a check that the drafter's device is one of them."""
    ordered = {h: i for i, h in enumerate(register_rpc(endpoints))}
    known = {h for hs in _REGISTERED.values() for h in hs}
    lib = _ggml()
    run = RunDevices(started=started, draft_device=draft_device)
    for i in range(lib.ggml_backend_dev_count()):
        handle = lib.ggml_backend_dev_get(i)
        if handle in ordered:
            run.rpc.append(_device(lib, handle, memory=True))
        elif handle not in known:  # an earlier run's RPC device is not this run's
            run.others.append(_device(lib, handle, memory=False))
    run.rpc.sort(key=lambda d: ordered[d.handle])
    names = [d.name for d in run._offload()]
    if draft_device and draft_device != NO_DEVICE and draft_device not in names:
        have = ", ".join(names) if names else "no device but the CPU"
        raise EngineError(f"--draft-device {draft_device}: no such device in this run (it has {have}; "
                          f"{NO_DEVICE} = the CPU)")
    return run


@contextlib.contextmanager
def open_devices(config: EngineConfig) -> Iterator[RunDevices]:
    """The run's devices for the duration of the block: `config.devices` RPC devices started on loopback (stopped
    afterwards, whatever happens), after the user's `config.rpc` ones."""
    servers: RpcServers | None = None
    try:
        endpoints = list(config.rpc)
        if config.devices:
            try:
                rpc_proc(load_ggml(), "ggml_backend_rpc_start_server")  # say so before starting anything
                servers = start(config.devices, command(), threads=config.n_threads)
            except NoRpcBackend as exc:
                raise EngineError(f"--devices needs llama.cpp's RPC backend: {exc}") from None
            except RpcError as exc:
                raise EngineError(f"cannot start the RPC devices: {exc}") from None
            endpoints += servers.endpoints
        run = resolve(endpoints, config.draft_device, started=config.devices)
        run.servers = servers
        yield run
    finally:
        if servers is not None:
            servers.stop()
