"""The session an engine capture writes: raw.log through llama.cpp's own log callback, ground_truth.parquet
from the API, and manifest.json (settings, models, versions, devices, outcome)."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvtrace.analyze.reader.session import (
    GROUND_TRUTH,
    KEY_COMMAND_LINE,
    KEY_ENDED,
    KEY_OUTCOME,
    KEY_PID,
    RAW_LOG,
    Session,
    now_iso,
    tool_version,
)
from kvtrace.capture.engine.config import EngineConfig, EngineError, EngineStopped
from kvtrace.capture.engine.devices import RunDevices, open_devices
from kvtrace.capture.engine.llama import BATCH_DEBUG_ENV, KV_DEBUG_ENV
from kvtrace.capture.engine.llama_log import DEBUG, LlamaLogCapture, LogWriter
from kvtrace.capture.engine.loop import Engine
from kvtrace.capture.engine.records import GROUND_TRUTH_COLUMNS, DecodeRecord, EngineResult
from kvtrace.capture.models import (
    ModelPair,
    ensure_shared_drafter,
    ensure_upstream_drafter,
    gguf_meta,
    resolve_models,
    sha256_file,
)


def model_entry(path: Path, models: ModelPair) -> dict[str, Any]:
    entry: dict[str, Any] = {"file": path.name, "sha256": sha256_file(path), "bytes": path.stat().st_size}
    if models.generated:
        entry |= {"generated": True, "seed": models.seed}
    else:
        entry["path"] = str(path)
    return entry


def _write_ground_truth(path: Path, decodes: list[DecodeRecord]) -> None:
    import pandas as pd

    frame = pd.DataFrame([asdict(d) for d in decodes], columns=list(GROUND_TRUTH_COLUMNS))
    text = ("context", "step", "fault")
    frame = frame.astype({c: "int64" for c in GROUND_TRUTH_COLUMNS if c not in text})
    for c in text:
        frame[c] = frame[c].astype("string")
    frame.to_parquet(path, index=False)


def engine_models(config: EngineConfig) -> ModelPair:
    """The user's GGUF pair or the generated tiny pair (made on first use), checked for the spec type."""
    try:
        pair = resolve_models(config.target, config.drafter, cache_dir=config.cache_dir, seed=config.seed)
        if pair.generated and config.spec_type in ("draft-dflash", "draft-eagle3"):
            kind = config.spec_type.removeprefix("draft-")
            drafter = ensure_upstream_drafter(kind, config.cache_dir, config.seed)
            pair = ModelPair(pair.target, drafter, generated=True, seed=config.seed)
        elif pair.generated:  # draft-simple: a drafter that accepts most drafts, so a collapse stands out
            drafter = ensure_shared_drafter(config.cache_dir, config.seed)
            pair = ModelPair(pair.target, drafter, generated=True, seed=config.seed)
        check_pair(config.spec_type, pair)
    except (OSError, ValueError) as e:
        raise EngineError(str(e)) from None
    return pair


def check_pair(spec_type: str, pair: ModelPair) -> None:
    """What llama.cpp would abort on or silently get wrong, said in one line before anything loads."""
    t, d = gguf_meta(pair.target), gguf_meta(pair.drafter)
    t_arch, d_arch = str(t.get("general.architecture")), str(d.get("general.architecture"))
    t_layers, t_embd = t.get(f"{t_arch}.block_count"), t.get(f"{t_arch}.embedding_length")
    d_embd = d.get(f"{d_arch}.embedding_length")
    if spec_type == "draft-simple":
        if d_arch in ("dflash", "eagle3"):
            raise EngineError(f"drafter {pair.drafter.name} is a {d_arch} model: use --spec-type draft-{d_arch}")
        return
    want = spec_type.removeprefix("draft-")
    if d_arch != want:
        article = "an" if want[0] in "aeiou" else "a"
        raise EngineError(f"--spec-type {spec_type} needs {article} {want} drafter; {pair.drafter.name} is {d_arch}")
    layers = d.get(f"{d_arch}.target_layers")
    if not isinstance(layers, list) or not layers:
        raise EngineError(f"drafter {pair.drafter.name} has no {d_arch}.target_layers")
    if isinstance(t_layers, int) and max(layers) >= t_layers:
        # llama.cpp would abort: GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null")
        raise EngineError(
            f"drafter {pair.drafter.name}: target_layers {layers} reach the target's n_layer = {t_layers} "
            f"(a {t_arch} target gives layer inputs 0..{t_layers - 1} only)"
        )
    if t_embd != d_embd or d.get(f"{d_arch}.target_hidden_size", t_embd) != t_embd:
        raise EngineError(f"target and drafter widths differ (n_embd {t_embd} vs {d_embd})")
    if want == "eagle3" and len(layers) != 3:
        raise EngineError(f"drafter {pair.drafter.name}: EAGLE3 needs 3 target layers, not {len(layers)}")
    if want == "dflash" and d.get("tokenizer.ggml.mask_token_id") is None:
        raise EngineError(f"drafter {pair.drafter.name} has no tokenizer.ggml.mask_token_id (DFlash's <mask>)")


def run_engine(config: EngineConfig, session: Session, models: ModelPair | None = None,
               devices: RunDevices | None = None) -> EngineResult:
    """Run a capture into `session`: raw.log, ground_truth.parquet and manifest.json. `devices` are the run's
    (open_devices); without them, the devices `config` asks for are opened for the run and closed after it.

    Raises EngineError (one-line message) for settings, models or devices that cannot be used.
    """
    config.validate()
    if models is None:
        models = engine_models(config)
    with contextlib.ExitStack() as stack:
        if devices is None:
            devices = stack.enter_context(open_devices(config))
        return _run(config, session, models, devices)


def _run(config: EngineConfig, session: Session, models: ModelPair, devices: RunDevices) -> EngineResult:
    import llama_cpp

    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    settings.pop("cache_dir")
    for key in ("target", "drafter"):
        settings[key] = getattr(models, key).name
    started = now_iso()
    session.write_manifest(
        {
            "kind": "engine",
            "engine": settings,
            "models": {"target": model_entry(models.target, models), "drafter": model_entry(models.drafter, models)},
            "versions": {
                "kvtrace": tool_version(),
                "llama_cpp_python": llama_cpp.__version__,
                "llama_cpp": f"vendored by llama-cpp-python {llama_cpp.__version__}",
                "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
            },
            "env": {BATCH_DEBUG_ENV: "1", KV_DEBUG_ENV: "1" if config.kv_debug else None},
            "device": devices.manifest(config),
            KEY_COMMAND_LINE: config.command_line(),  # the flags the log never prints (-sm, -ts, -devd)
            "files": {"raw_log": RAW_LOG, "ground_truth": GROUND_TRUTH},
            "started": started,
            KEY_OUTCOME: {"status": "running"},
            KEY_PID: os.getpid(),  # a live view tells a killed capture from a running one
        }
    )
    saved = {name: os.environ.get(name) for name in (BATCH_DEBUG_ENV, KV_DEBUG_ENV)}
    os.environ[BATCH_DEBUG_ENV] = "1"
    if config.kv_debug:
        os.environ[KV_DEBUG_ENV] = "1"
    else:
        os.environ.pop(KV_DEBUG_ENV, None)
    writer = LogWriter(session.raw_log, prefix=config.log_prefix, log_format=config.log_format)
    t0 = time.perf_counter()
    engine: Engine | None = None
    status = "error"
    try:
        llama_cpp.llama_backend_init()
        with LlamaLogCapture(writer):
            engine = Engine(config, models, writer, devices)
            try:
                engine.run()
            finally:
                engine.close()
        if writer.levels[DEBUG] == 0:
            raise EngineError(f"llama.cpp delivered no DEBUG-level lines, so {RAW_LOG} has no batch dumps")
        status = "ok"
    except EngineStopped as exc:
        status = str(exc)  # `stopped by SIGTERM`: what a live view shows as the reason it ended
        raise
    finally:
        writer.close()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        duration = time.perf_counter() - t0
        decodes = engine.decodes if engine else []
        if engine:
            _write_ground_truth(session.ground_truth, decodes)
        session.write_manifest(
            {
                KEY_ENDED: now_iso(),
                KEY_OUTCOME: {
                    "status": status,
                    "decodes": len(decodes),
                    "failures": sum(1 for d in decodes if d.ret != 0),
                    "requests": engine.n_requests if engine else 0,
                    "cycles": len(engine.cycles) if engine else 0,
                    "drafted": engine.drafted if engine else 0,
                    "accepted": engine.accepted if engine else 0,
                    "duration_s": round(duration, 3),
                    "raw_log_lines": writer.line - 1,
                    "log_levels": {name: writer.levels[lvl] for name, lvl in _LEVEL_NAMES.items()},
                },
            }
        )
    assert engine is not None
    return EngineResult(
        session.path,
        config,
        engine.decodes,
        engine.cycles,
        engine.n_requests,
        duration,
        engine.drafted,
        engine.accepted,
        devices.layout(config),
    )


_LEVEL_NAMES = {"none": 0, "debug": 1, "info": 2, "warn": 3, "error": 4, "cont": 5}
