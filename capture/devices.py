"""The devices a llama.cpp program itself sees: its `--list-devices` output, parsed, with the raw text.

Works the same for CUDA, ROCm, Vulkan, Metal, RPC and the CPU (each build lists what its backends find), so
the manifest records the devices even where there is no `nvidia-smi`. With `--rpc` the program connects to
the RPC servers to list them: the probe is time-limited, and an unreachable one is a one-line error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from kvtrace.capture.process import probe

# `  RPC0: 127.0.0.1:50152 (24105 MiB, 24105 MiB free)`, `  CUDA0: NVIDIA GeForce RTX 3080 (11910 MiB, 11000 MiB free)`
_DEVICE = re.compile(r"^\s*(?P<device>[A-Za-z]\w*?\d*)\s*: (?P<name>\S.*?) "
                     r"\((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)")
# flags that change which devices the program sees; their values go to the probe too
_DEVICE_FLAGS = ("--rpc",)
PROBE_TIMEOUT_S = 20.0


def device_flags(argv: Sequence[str]) -> list[str]:
    """`--rpc HOST:PORT,...` from a command line (both spellings), to list the same devices."""
    out: list[str] = []
    for i, tok in enumerate(argv):
        name, eq, value = tok.partition("=")
        if name in _DEVICE_FLAGS:
            if eq:
                out += [name, value]
            elif i + 1 < len(argv):
                out += [name, argv[i + 1]]
    return out


def rpc_endpoints(argv: Sequence[str]) -> list[str]:
    flags = device_flags(argv)
    return [e for i in range(1, len(flags), 2) for e in flags[i].split(",") if e]


def parse_devices(text: str) -> list[dict[str, Any]]:
    """Each device line of a `--list-devices` output (llama.cpp's device name, description, MiB)."""
    out = []
    for line in text.splitlines():
        m = _DEVICE.match(line)
        if m is not None:
            dev = m["device"]
            out.append({"device": dev, "backend": dev.rstrip("0123456789") or dev, "name": m["name"],
                        "memory_mib": int(m["total"]), "free_mib": int(m["free"])})
    return out


def list_devices(program: str, argv: Sequence[str], env: Mapping[str, str],
                 help_text: str | None = None) -> dict[str, Any] | None:
    """The program's own device list for the manifest, or None where its `--help` lists no `--list-devices`.

    `error` is set (one line) when the program could not list them: it timed out (an RPC server that never
    answers), or an RPC endpoint given with `--rpc` is missing from the list."""
    if help_text is None or "--list-devices" not in help_text:  # an older build, or not a llama.cpp program
        return None
    cmd = [program, *device_flags(argv), "--list-devices"]
    text = probe(cmd, env, timeout_s=PROBE_TIMEOUT_S)
    if text is None:
        return {"command": cmd, "raw": "", "devices": [],
                "error": f"`{' '.join(cmd[1:])}` gave no answer within {PROBE_TIMEOUT_S:.0f} s"}
    devices = parse_devices(text)
    result: dict[str, Any] = {"command": cmd, "raw": text[-4000:], "devices": devices}
    listed = {d["name"] for d in devices if d["backend"] == "RPC"}
    missing = [e for e in rpc_endpoints(argv) if e not in listed]
    if missing:
        # llama.cpp aborts with `<source path>:547: Failed to connect to HOST:PORT`: keep the message only
        said = next((ln[ln.lower().index("failed to connect"):].strip() for ln in text.splitlines()
                     if "failed to connect" in ln.lower()), "")
        result["error"] = (f"cannot reach the RPC server{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
                           + (f": {said[:160]}" if said else ""))
    return result
