"""The device layout a log shows: the devices llama.cpp saw, and where the target's and the drafter's layers
and buffers went.

llama.cpp names a device by backend and index (`CUDA0`, `ROCm1`, `Vulkan0`, `RPC1`, `Metal`, `CPU`) in its
device list (`common_param: - RPC0 : 127.0.0.1:50152 (24105 MiB, 24105 MiB free)`, `--list-devices`),
in `using device ...` before each model load, in `load_tensors: layer N assigned to device ...` and in the
per-buffer size lines; older builds print `ggml_cuda_init` and `Device N: ...` instead. Model loads are
told apart by their order: newer servers first measure every model in a no-alloc pass (`load_mode =
none`), which places nothing; the first real load is the target's, the one after the draft model is
announced (or the second) the drafter's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvtrace.analyze.reader.records import Meta

# the kinds of the pattern table's device entries, handled here rather than in the walker
LAYOUT_KINDS = frozenset({"device", "use_device", "model_start", "load_mode", "layer_device", "kv_layer_device",
                          "buffer", "offloaded"})


def backend_of(device: str) -> str:
    """`RPC1` -> `RPC`, `CUDA0` -> `CUDA`, `Metal` -> `Metal`, `CPU_Mapped` -> `CPU`."""
    base = device.split("[", 1)[0].split("_", 1)[0]
    return base.rstrip("0123456789") or base


def device_of_buffer(buffer: str, endpoints: dict[str, str] | None = None) -> str:
    """The device a buffer lives on: host buffers (`CPU_Mapped`, `CUDA_Host`, `CPU_REPACK`) are the CPU's,
    an RPC buffer `RPC0[127.0.0.1:50152]` is the device of that address (b11434 prints `RPC0` for all)."""
    base, _, rest = buffer.partition("[")
    if rest and endpoints and (dev := endpoints.get(rest.rstrip("]"))):
        return dev
    if base.startswith("CPU") or base.endswith("_Host") or "_Mapped" in base:
        return "CPU"
    return base.split("_", 1)[0]


def add_device(devices: list[dict[str, Any]], entry: dict[str, Any]) -> None:
    """Add or complete one device in `meta["gpus"]`, keyed by its llama.cpp name (the CPU is not listed)."""
    name = entry.get("device") or ""
    if backend_of(name) == "CPU":
        return
    for d in devices:
        if (name and d.get("device") == name) or (not d.get("device") and not name and d["index"] == entry["index"]
                                                   and d.get("name") == entry.get("name")):
            for k, v in entry.items():
                if v not in ("", None) and d.get(k) in ("", None):
                    d[k] = v
            return
    devices.append({k: v for k, v in entry.items() if v not in ("", None)})


def ranges(values: list[int]) -> str:
    """[0, 1, 2, 5] -> `0-2, 5`."""
    out: list[str] = []
    for v in sorted(set(values)):
        if out and v == int(out[-1].rsplit("-", 1)[-1]) + 1:
            out[-1] = f"{out[-1].split('-', 1)[0]}-{v}"
        else:
            out.append(str(v))
    return ", ".join(out)


@dataclass(slots=True)
class ModelLoad:
    """One model load: the devices it was given and where its layers and buffers went."""

    path: str = ""
    after_draft: bool = False  # the draft model was announced before this load began
    dry: bool = False  # a no-alloc measuring pass: nothing was placed
    orphan: bool = False  # lines read before any load began (one piece of a split read)
    devices: list[str] = field(default_factory=list)
    layers: dict[str, list[int]] = field(default_factory=dict)
    kv_layers: dict[str, list[int]] = field(default_factory=dict)
    buffers: dict[str, dict[str, float]] = field(default_factory=dict)  # buffer as printed -> {kind: MiB}
    offloaded: str = ""

    def used(self) -> bool:
        return bool(self.layers or self.kv_layers or self.buffers or self.offloaded)

    def summary(self, endpoints: dict[str, str] | None = None) -> dict[str, Any]:
        """Per device: its layers, KV layers and buffer sizes, in the order the devices first appear.
        `endpoints` maps an RPC server's address to its device: b11434 names every RPC buffer `RPC0[addr]`."""
        per: dict[str, dict[str, Any]] = {d: {} for d in self.devices}
        for dev, layers in self.layers.items():
            per.setdefault(dev, {}).update(layers=ranges(layers), n_layers=len(set(layers)))
        for dev, layers in self.kv_layers.items():
            per.setdefault(dev, {})["kv_layers"] = ranges(layers)
        for buffer, sizes in self.buffers.items():
            dev = device_of_buffer(buffer, endpoints)
            for kind, mib in sizes.items():
                key = f"{kind.lower()}_mib"
                per.setdefault(dev, {})[key] = round(per.get(dev, {}).get(key, 0.0) + mib, 2)
        out: dict[str, Any] = {"devices": per}
        if self.path:
            out["model"] = self.path
        if self.offloaded:
            out["offloaded"] = self.offloaded
        return out


@dataclass(slots=True)
class Layout:
    loads: list[ModelLoad] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # `using device` lines printed before the next load

    def _current(self) -> ModelLoad:
        if not self.loads:
            self.loads.append(ModelLoad(orphan=True))
        return self.loads[-1]

    def feed(self, kind: str, g: dict[str, str], draft_seen: bool) -> None:
        if kind == "use_device":
            # b11434 prints them after the model's `loaded meta data` line, older builds before it
            load = self.loads[-1] if self.loads and not self.loads[-1].used() else None
            devices = load.devices if load is not None else self.pending
            if g["device"] not in devices:
                devices.append(g["device"])
        elif kind == "model_start":
            self.loads.append(ModelLoad(path=g.get("path", ""), after_draft=draft_seen, devices=self.pending))
            self.pending = []
        elif kind == "load_mode":
            load = self._current()
            if load.used():  # a load whose `loaded meta data` line the log lacks
                load = ModelLoad(after_draft=draft_seen)
                self.loads.append(load)
            load.dry = g.get("mode") == "none"
        elif kind in ("layer_device", "kv_layer_device"):
            load = self._current()
            target = load.layers if kind == "layer_device" else load.kv_layers
            target.setdefault(g["device"], []).append(int(g["layer"]))
        elif kind == "buffer":
            buffer, what, mib = g["buffer"], g.get("what") or "model", float(g["mib"])
            load = self._current()
            earlier = (m.buffers.get(buffer, {}).get(what) for m in self.loads if m is not load)
            if what == "compute" and mib in earlier:
                return  # an earlier context's graph reserved again while serving: not this load's
            load.buffers.setdefault(buffer, {})[what] = mib  # a buffer printed again (re-reserved): its last size
        elif kind == "offloaded":
            self._current().offloaded = f"{g['done']}/{g['total']}"

    def models(self) -> tuple[ModelLoad | None, ModelLoad | None]:
        """The target's load and the drafter's (None where the log has none)."""
        real = [m for m in self.loads if not m.dry and (m.used() or m.devices)]
        if not real:
            return None, None
        target = next((m for m in real if not m.after_draft), real[0])
        rest = [m for m in real if m is not target]
        drafter = next((m for m in rest if m.after_draft), rest[0] if rest else None)
        return target, drafter


def placement(layout: Layout, flags: dict[str, str | bool], known: dict[str, Any],
              gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """meta["placement"]: the split mode and tensor split (from the flags the log shows), and per model the
    devices that hold its layers and buffers. `known` is what a fork printed itself (beellama's device
    counts), kept."""
    out = dict(known)
    for key, names in (("split_mode", ("--split-mode", "-sm")), ("tensor_split", ("--tensor-split", "-ts")),
                       ("main_gpu", ("--main-gpu", "-mg")), ("device", ("--device", "-dev")),
                       ("draft_device", ("--spec-draft-device", "--device-draft", "-devd"))):
        value = next((flags[n] for n in names if n in flags), None)
        if value not in (None, True):
            out[key] = str(value)
    target, drafter = layout.models()
    endpoints = {str(g.get("name")): str(g["device"]) for g in gpus if g.get("backend") == "RPC" and g.get("device")}
    for name, load in (("target", target), ("drafter", drafter)):
        if load is None:
            continue
        summary = load.summary(endpoints)
        out[name] = summary
        holding = [d for d, v in summary["devices"].items() if v.get("n_layers") or v.get("kv_layers")]
        out.setdefault(f"{name}_devices", len(holding) or len(summary["devices"]))
    return out


def devices_holding(placement: dict[str, Any], model: str) -> list[str]:
    """The devices that hold a model's layers (or its KV, or, for a fork's summary, any buffer)."""
    per = (placement.get(model) or {}).get("devices") or {}
    held = [d for d, v in per.items() if v.get("n_layers") or v.get("kv_layers")]
    return held or [d for d, v in per.items() if v]


def device_rows(meta: Meta) -> list[dict[str, str]]:
    """One row per device the log lists, then the CPU where a model's layers or buffers sat on it."""
    rows = [{"device": str(g.get("device") or g.get("index", "")), "backend": str(g.get("backend", "")),
             "description": str(g.get("name", "")),
             "memory": f"{g['memory_mib']} MiB" if g.get("memory_mib") else ""} for g in meta.get("gpus") or ()]
    place = meta.get("placement") or {}
    if any("CPU" in ((place.get(m) or {}).get("devices") or {}) for m in ("target", "drafter")):
        rows.append({"device": "CPU", "backend": "CPU", "description": "", "memory": ""})
    return rows


def placement_rows(meta: Meta) -> list[dict[str, str]]:
    """One row per model and device: its layers, its KV layers and its buffers."""
    rows = []
    for model in ("target", "drafter"):
        for dev, v in (((meta.get("placement") or {}).get(model) or {}).get("devices") or {}).items():
            rows.append({"model": model, "device": str(dev), "layers": str(v.get("layers", "")),
                         "KV layers": str(v.get("kv_layers", "")),
                         "buffers (MiB)": ", ".join(f"{k[:-4]} {v[k]:g}" for k in sorted(v) if k.endswith("_mib"))})
    return rows


def layout_line(meta: Meta) -> str:
    """`split mode: layer, tensor split: 1,1, drafter device: RPC1` (only what the log says)."""
    place = meta.get("placement") or {}
    parts = [f"{label}: {place[key]}" for key, label in (
        ("split_mode", "split mode"), ("tensor_split", "tensor split"), ("main_gpu", "main GPU"),
        ("device", "devices asked for"), ("draft_device", "drafter device asked for"),
        ("target_devices", "devices holding the target"), ("drafter_devices", "devices holding the drafter"))
        if place.get(key) not in (None, "")]
    return ", ".join(parts)
