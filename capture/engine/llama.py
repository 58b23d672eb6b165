"""The llama.cpp layer: models, contexts, batches and KV calls through llama-cpp-python's ctypes API. Only this
module, the loop and the devices (capture/engine/devices.py) touch llama.cpp."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np

from kvtrace.analyze.reader.session import RAW_LOG
from kvtrace.capture.engine.config import SPLIT_MODES, EngineConfig, EngineError

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
                 other: Context | None = None, devices: list[int] | None = None, main_gpu: int | None = None) -> None:
        """`devices`: the ggml devices the model may use (None: llama.cpp's default, every device it knows);
        `main_gpu`: an index into them (default: config.main_gpu)."""
        self.L = llama
        self.name = name
        mp = llama.llama_model_default_params()
        mp.n_gpu_layers = config.n_gpu_layers
        mp.split_mode = SPLIT_MODES[config.split_mode]
        mp.main_gpu = config.main_gpu if main_gpu is None else main_gpu
        if devices is not None:  # NULL-terminated; kept alive while the model loads
            self._devices = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
            mp.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        if config.tensor_split:
            n_dev = llama.llama_max_devices()
            values = list(config.tensor_split)[:n_dev] + [0.0] * max(0, n_dev - len(config.tensor_split))
            self._tensor_split = (ctypes.c_float * n_dev)(*values)  # kept alive while the model loads
            mp.tensor_split = self._tensor_split
        self.model = llama.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise EngineError(f"llama.cpp could not load the {name} model {path.name} (see {RAW_LOG})")
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
