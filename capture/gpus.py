"""The GPUs a capture ran on, from nvidia-smi when it is installed (the multi-GPU failures need this)."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

_FIELDS = ("index", "uuid", "name", "memory.total", "driver_version", "pci.bus_id", "compute_cap")


@dataclass(slots=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total: str
    driver_version: str
    pci_bus_id: str
    compute_cap: str
    visible: bool  # False when CUDA_VISIBLE_DEVICES hides it from the program


def parse_nvidia_smi_csv(text: str) -> list[Gpu]:
    gpus: list[Gpu] = []
    for row in csv.reader(io.StringIO(text)):
        cells = [c.strip() for c in row]
        if len(cells) < len(_FIELDS) or not cells[0].isdigit():
            continue
        gpus.append(Gpu(int(cells[0]), cells[1], cells[2], cells[3], cells[4], cells[5], cells[6], True))
    return gpus


def apply_visible_devices(gpus: list[Gpu], visible: str | None) -> list[Gpu]:
    """Mark what CUDA_VISIBLE_DEVICES hides; keep the order it gives (that order is CUDA's device order)."""
    if visible is None:
        return gpus
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    ordered: list[Gpu] = []
    for w in wanted:
        for g in gpus:
            if (w.isdigit() and g.index == int(w)) or (not w.isdigit() and g.uuid.startswith(w)):
                if g not in ordered:
                    ordered.append(g)
                break
        else:
            break  # CUDA stops at the first entry that names no device
    for g in gpus:
        g.visible = g in ordered
    return ordered + [g for g in gpus if g not in ordered]


def query_gpus(env: Mapping[str, str]) -> dict[str, Any]:
    """What the manifest records: the GPU list, or why there is none. Never raises."""
    exe = shutil.which("nvidia-smi")
    result: dict[str, Any] = {"cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES")}
    if exe is None:
        result["nvidia_smi"] = "not found"
        result["gpus"] = []
        return result
    try:
        proc = subprocess.run(
            [exe, f"--query-gpu={','.join(_FIELDS)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=15,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        result["nvidia_smi"] = f"failed: {exc}"
        result["gpus"] = []
        return result
    if proc.returncode != 0:
        result["nvidia_smi"] = f"exit {proc.returncode}: {proc.stderr.strip()[:200]}"
        result["gpus"] = []
        return result
    gpus = apply_visible_devices(parse_nvidia_smi_csv(proc.stdout), env.get("CUDA_VISIBLE_DEVICES"))
    result["nvidia_smi"] = "ok"
    result["gpus"] = [asdict(g) for g in gpus]
    return result
