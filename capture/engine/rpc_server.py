"""One llama.cpp RPC device on the engine's own llama.cpp: `python -m kvtrace.capture.engine.rpc_server -p PORT`.

llama-cpp-python built with `-DGGML_RPC=ON` ships libggml-rpc but not the `ggml-rpc-server` program (llama.cpp's
tools are not built as a subproject). This is that program's main() over the same library: the CPU device
served by `ggml_backend_rpc_start_server`, so the device always speaks the RPC protocol of the engine that
connects to it (a server from another llama.cpp may not). It loads ggml only, not llama_cpp's Python layer.

Loopback only: an RPC server computes whatever graph anyone who reaches it sends.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import signal
import sys
from pathlib import Path

from kvtrace.capture.rpc import LOOPBACK, is_loopback

CPU_DEVICE = 0  # enum ggml_backend_dev_type: GGML_BACKEND_DEVICE_TYPE_CPU


def command() -> list[str]:
    """How to start one (append `-p PORT`, `-H 127.0.0.1`, `-t N`, as for `ggml-rpc-server`)."""
    return [sys.executable, "-m", __name__]


class NoRpcBackend(RuntimeError):
    """This llama-cpp-python cannot serve an RPC device; the message is one line."""


def _lib_dir() -> Path:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise NoRpcBackend("llama-cpp-python is not installed: pip install 'kvtrace[engine]'")
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def load_ggml() -> ctypes.CDLL:
    """llama-cpp-python's own libggml (its backends are linked in, RPC among them when built with it)."""
    folder = _lib_dir()
    for name in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (folder / name).is_file():
            return ctypes.CDLL(str(folder / name), mode=ctypes.RTLD_GLOBAL)
    raise NoRpcBackend(f"no libggml in llama-cpp-python's {folder.name}/ folder")


def rpc_proc(lib: ctypes.CDLL, name: str) -> int:
    """A function of ggml's RPC backend by name, or NoRpcBackend where this build has none."""
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise NoRpcBackend("this llama-cpp-python was built without llama.cpp's RPC backend (make setup builds "
                           "it with -DGGML_RPC=ON)")
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    fn = lib.ggml_backend_reg_get_proc_address(reg, name.encode())
    if not fn:
        raise NoRpcBackend(f"this llama.cpp's RPC backend has no {name}")
    return int(fn)


def serve(host: str, port: int, threads: int) -> None:
    """Serve the CPU device until killed (ggml's server loop never returns unless it fails)."""
    lib = load_ggml()
    start = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                             ctypes.POINTER(ctypes.c_void_p))(rpc_proc(lib, "ggml_backend_rpc_start_server"))
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    cpu = lib.ggml_backend_dev_by_type(CPU_DEVICE)
    if not cpu:
        raise NoRpcBackend("ggml has no CPU device to serve")
    devices = (ctypes.c_void_p * 1)(cpu)
    start(f"{host}:{port}".encode(), None, threads, 1, devices)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvtrace.capture.engine.rpc_server",
                                     description="One llama.cpp RPC device (the CPU) on llama-cpp-python's ggml.")
    parser.add_argument("-H", "--host", default=LOOPBACK, help=f"loopback address to bind (default: {LOOPBACK})")
    parser.add_argument("-p", "--port", type=int, required=True)
    parser.add_argument("-t", "--threads", type=int, default=1, help="CPU threads of the device (default: 1)")
    args = parser.parse_args(argv)
    if not is_loopback(args.host):
        print(f"rpc_server: {args.host} is not a loopback address: an RPC device serves anyone who reaches it",
              file=sys.stderr)
        return 2
    if not 0 < args.port < 65536 or args.threads < 1:
        print("rpc_server: the port must be 1-65535 and the threads at least 1", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # ggml's accept loop never returns to Python: Ctrl-C ends it
    try:
        serve(args.host, args.port, args.threads)
    except (NoRpcBackend, OSError) as exc:
        print(f"rpc_server: {exc}", file=sys.stderr)
        return 2
    print(f"rpc_server: ggml's RPC server stopped on {args.host}:{args.port} (see the lines above)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
