"""The llama.cpp layer: models, contexts, batches and KV calls through llama-cpp-python's ctypes API, and the
devices llama.cpp sees. Only this module and the loop touch llama.cpp."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np

from capture.engine.config import SPLIT_MODES, EngineConfig, EngineError
from capture.gpus import query_gpus

# Set before the contexts exist: llama.cpp reads both once, with getenv, when a context is created.
BATCH_DEBUG_ENV = "LLAMA_BATCH_DEBUG"
KV_DEBUG_ENV = "LLAMA_KV_CACHE_DEBUG"
SEQ = 0  # the one sequence a server slot uses


class Context:
    """A model plus its context, memory handle and a reusable batch."""

    def __init__(self, llama: Any, name: str, path: Path, n_ctx: int, config: EngineConfig) -> None:
        self.L = llama
        self.name = name
        mp = llama.llama_model_default_params()
        mp.n_gpu_layers = config.n_gpu_layers
        mp.split_mode = SPLIT_MODES[config.split_mode]
        mp.main_gpu = config.main_gpu
        if config.tensor_split:
            n_dev = llama.llama_max_devices()
            values = list(config.tensor_split)[:n_dev] + [0.0] * max(0, n_dev - len(config.tensor_split))
            self._tensor_split = (ctypes.c_float * n_dev)(*values)  # kept alive while the model loads
            mp.tensor_split = self._tensor_split
        self.model = llama.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise EngineError(f"llama.cpp could not load the {name} model {path} (see raw.log)")
        cp = llama.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = config.n_batch
        cp.n_ubatch = config.n_batch
        cp.n_seq_max = 1
        cp.n_threads = config.n_threads
        cp.n_threads_batch = config.n_threads
        cp.no_perf = False
        self.ctx = llama.llama_init_from_model(self.model, cp)
        if not self.ctx:
            llama.llama_model_free(self.model)
            raise EngineError(f"llama.cpp could not create the {name} context (see raw.log)")
        self.n_ctx = llama.llama_n_ctx(self.ctx)
        self.mem = llama.llama_get_memory(self.ctx)
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)
        self.batch = llama.llama_batch_init(config.n_batch, 0, 1)

    def kv_range(self) -> tuple[int, int]:
        return self.L.llama_memory_seq_pos_min(self.mem, SEQ), self.L.llama_memory_seq_pos_max(self.mem, SEQ)

    def fill(self, tokens: list[int], pos0: int, all_logits: bool) -> None:
        b = self.batch
        n = len(tokens)
        b.n_tokens = n
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = SEQ
            b.logits[i] = all_logits or i == n - 1

    def logits(self, i: int) -> np.ndarray:
        ptr = self.L.llama_get_logits_ith(self.ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def seq_rm(self, p0: int, p1: int = -1) -> None:
        self.L.llama_memory_seq_rm(self.mem, SEQ, p0, p1)

    def clear(self) -> None:
        self.L.llama_memory_clear(self.mem, True)

    def close(self) -> None:
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


def device_info(config: EngineConfig) -> dict[str, Any]:
    """The backends llama.cpp sees and which one ran the layers (CPU unless offload is real)."""
    import llama_cpp

    devices: list[dict[str, str]] = []
    try:
        from llama_cpp import _ggml

        lib = _ggml.libggml
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
            getattr(lib, fn).restype = ctypes.c_char_p
            getattr(lib, fn).argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        kinds = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
        for i in range(lib.ggml_backend_dev_count()):
            dev = lib.ggml_backend_dev_get(i)
            devices.append(
                {
                    "name": (lib.ggml_backend_dev_name(dev) or b"").decode(errors="replace"),
                    "description": (lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                    "type": kinds.get(lib.ggml_backend_dev_type(dev), "other"),
                }
            )
    except (AttributeError, OSError):  # an older or stripped ggml: say what is known
        pass
    offload = bool(llama_cpp.llama_supports_gpu_offload())
    gpus = [d["name"] for d in devices if d["type"] in ("gpu", "igpu")]
    ran_on = gpus if offload and gpus and config.n_gpu_layers != 0 else ["CPU"]
    return {"ran_on": ran_on, "gpu_offload_supported": offload, "devices": devices, **query_gpus(os.environ)}
