"""The llama.cpp layer: models, contexts, batches and KV calls through llama-cpp-python's ctypes API, and the
devices llama.cpp sees. Only this module and the loop touch llama.cpp."""

from __future__ import annotations

import ctypes
import os
import socket
from pathlib import Path
from typing import Any

import numpy as np

from capture.engine.config import SPLIT_MODES, EngineConfig, EngineError
from capture.gpus import query_gpus
from capture.session import RAW_LOG

# Set before the contexts exist: llama.cpp reads both once, with getenv, when a context is created.
BATCH_DEBUG_ENV = "LLAMA_BATCH_DEBUG"
KV_DEBUG_ENV = "LLAMA_KV_CACHE_DEBUG"
SEQ = 0  # the one sequence a server slot uses

# llama.cpp's staging API for hidden states (src/llama-ext.h) is exported by libllama.so but not declared
# `extern "C"` and not bound by llama-cpp-python: reach it under its C++-mangled names.
_LAYER_INP_SET = "_Z30llama_set_embeddings_layer_inpP13llama_contextjb"
_LAYER_INP_GET = "_Z30llama_get_embeddings_layer_inpP13llama_contextj"


def layer_input_api(llama: Any) -> tuple[Any, Any]:
    """(set, get) for the target's layer-input extraction: set(ctx, il, on), get(ctx, il) -> float*."""
    lib = llama.llama_cpp._lib
    try:
        set_fn, get_fn = getattr(lib, _LAYER_INP_SET), getattr(lib, _LAYER_INP_GET)
    except AttributeError:
        raise EngineError("this libllama has no layer-input extraction (llama-cpp-python 0.3.36 or newer)") from None
    set_fn.argtypes, set_fn.restype = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool], None
    get_fn.argtypes, get_fn.restype = [ctypes.c_void_p, ctypes.c_uint32], ctypes.POINTER(ctypes.c_float)
    return set_fn, get_fn


class Context:
    """A model plus its context, memory handle and a reusable batch."""

    def __init__(self, llama: Any, name: str, path: Path, n_ctx: int, config: EngineConfig,
                 other: Context | None = None) -> None:
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
            raise EngineError(f"llama.cpp could not load the {name} model {path} (see {RAW_LOG})")
        cp = llama.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = config.n_batch
        cp.n_ubatch = config.n_batch
        cp.n_seq_max = 1
        cp.n_threads = config.n_threads
        cp.n_threads_batch = config.n_threads
        cp.no_perf = False
        if other is not None:  # a DFlash drafter has no embeddings or output head: it uses the target's
            cp.ctx_other = other.ctx  # type: ignore[has-type]
        self.ctx = llama.llama_init_from_model(self.model, cp)
        if not self.ctx:
            llama.llama_model_free(self.model)
            raise EngineError(f"llama.cpp could not create the {name} context (see {RAW_LOG})")
        self.n_ctx = llama.llama_n_ctx(self.ctx)
        self.mem = llama.llama_get_memory(self.ctx)
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)
        self.n_embd = llama.llama_model_n_embd(self.model)
        self.batch = llama.llama_batch_init(config.n_batch, 0, 1)
        self.ext: Any = None  # llama_batch_ext for llama_process (DFlash drafter), made on first use
        self._pos = (ctypes.c_int32 * 4)()
        self._keep: np.ndarray | None = None

    def _ext(self) -> Any:
        if self.ext is None:
            self.ext = self.L.llama_batch_ext_init(self.ctx)
        self.L.llama_batch_ext_clear(self.ext)
        return self.ext

    def _set_pos(self, ext: Any, idx: int, pos: int) -> None:
        p = self._pos
        p[0] = p[1] = p[2] = pos  # llama.cpp's 4-slot position (M-RoPE sections), as common_batch sets it
        self.L.llama_batch_ext_set_pos(ext, idx, p)

    def process_tokens(self, tokens: list[int], pos0: int) -> int:
        """One llama_process(DECODE) of a token batch at pos0.., logits for every token."""
        L, ext = self.L, self._ext()
        for i, tok in enumerate(tokens):
            idx = L.llama_batch_ext_add_token(ext, SEQ, tok)
            self._set_pos(ext, idx, pos0 + i)
            L.llama_batch_ext_set_output_logits(ext, idx, True)
        return int(L.llama_process(self.ctx, L.LLAMA_PROCESS_TYPE_DECODE, ext))

    def process_embd(self, rows: np.ndarray, pos0: int, encode: bool = False) -> int:
        """One llama_process of an embedding batch (one row per position) at pos0..: DECODE without outputs
        (DFlash's injection), or ENCODE with every output (EAGLE3's fc encoder)."""
        L, ext = self.L, self._ext()
        rows = self._keep = np.ascontiguousarray(rows, dtype=np.float32)  # alive until the call returns
        for i in range(rows.shape[0]):
            idx = L.llama_batch_ext_add_embd(ext, SEQ, self._embd(rows, i))
            self._set_pos(ext, idx, pos0 + i)
            if encode:
                L.llama_batch_ext_set_output_logits(ext, idx, True)
        kind = L.LLAMA_PROCESS_TYPE_ENCODE if encode else L.LLAMA_PROCESS_TYPE_DECODE
        return int(L.llama_process(self.ctx, kind, ext))

    def process_pairs(self, tokens: list[int], rows: np.ndarray, pos0: int, output: bool) -> int:
        """One llama_process(DECODE) of tokens that each carry an embedding row too (EAGLE3's (token, g) pairs)."""
        L, ext = self.L, self._ext()
        rows = self._keep = np.ascontiguousarray(rows, dtype=np.float32)
        for i, tok in enumerate(tokens):
            idx = L.llama_batch_ext_add_token(ext, SEQ, tok)
            self._set_pos(ext, idx, pos0 + i)
            L.llama_batch_ext_set_embd_token(ext, idx, self._embd(rows, i))
            if output:
                L.llama_batch_ext_set_output_logits(ext, idx, True)
        return int(L.llama_process(self.ctx, L.LLAMA_PROCESS_TYPE_DECODE, ext))

    def _embd(self, rows: np.ndarray, i: int) -> Any:
        width = rows.shape[1]
        row = ctypes.cast(rows.ctypes.data + 4 * width * i, ctypes.POINTER(ctypes.c_float))
        return self.L.llama_embd(row, 1, width)

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
        if self.ext is not None:
            self.L.llama_batch_ext_free(self.ext)
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


def add_rpc_servers(endpoints: tuple[str, ...]) -> None:
    """Register llama.cpp RPC servers as devices (what `--rpc` does in llama.cpp's own programs), or say in one
    line that this llama-cpp-python has no RPC backend."""
    from llama_cpp import _ggml

    lib = _ggml.libggml
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise EngineError("--rpc needs llama.cpp's RPC backend, and this llama-cpp-python was built without it "
                          "(reinstall it with CMAKE_ARGS=\"-DGGML_RPC=ON\")")
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    add = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not add:
        raise EngineError("this llama.cpp's RPC backend has no ggml_backend_rpc_add_server: too old for --rpc")
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        try:  # ggml-rpc aborts the process on a server it cannot connect to: ask first
            socket.create_connection((host, int(port)), timeout=5).close()
        except (OSError, ValueError):
            raise EngineError(f"cannot reach the RPC server {endpoint}") from None
        server_reg = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(add)(endpoint.encode())
        if not server_reg:
            raise EngineError(f"cannot reach the RPC server {endpoint}")
        lib.ggml_backend_register(server_reg)


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
