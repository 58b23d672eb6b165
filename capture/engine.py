"""The embedded engine: real target + drafter speculative decoding on llama-cpp-python's low-level API.

It plays one llama-server slot running DFlash-style drafting: each cycle the drafter decodes a block
`[id_last, mask x k]` at the target's position, the target verifies `[id_last, d1..dk]` in one batch,
the accepted prefix is kept, rejected positions are removed from both caches with
`llama_memory_seq_rm`, and the accepted tokens are committed to the drafter so that after every cycle
the drafter's max position equals the target's (the DFlash invariant). Several requests run in a row
on one sequence (new prompt, shared-prefix reuse, clear), which is where stale drafter state comes from.

Fault modes break the drafter's bookkeeping the way real bugs do, and real llama.cpp then refuses the
drafter batch with its real error:
- `stale-drafter`: from the first reset on, the target is rewound/cleared and fed the new prompt but the
  drafter is left alone; every later draft goes in at the target's position, so X stays stuck while Y
  climbs by one per cycle (the seed report);
- `no-rollback`: rejected draft positions stay in the drafter's cache, so the next draft has X >= Y;
- `none`: correct, for healthy traces.

The truth about every `llama_decode` call comes from the API, not the log, and goes to
`ground_truth.parquet` beside raw.log.
"""

from __future__ import annotations

import ctypes
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from capture import server_lines
from capture.gpus import query_gpus
from capture.llama_log import DEBUG, LlamaLogCapture, LogWriter
from capture.models import MASK_ID, N_SPECIAL, WORDS, ModelPair, resolve_models, sha256_file
from capture.server_lines import RequestTimings, ServerLines, SpecStats
from capture.session import GROUND_TRUTH, RAW_LOG, Session, now_iso, tool_version

FAULTS = ("none", "stale-drafter", "no-rollback")
DRAFTING = ("block", "chain")
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}
# Set before the contexts exist: llama.cpp reads both once, with getenv, when a context is created.
BATCH_DEBUG_ENV = "LLAMA_BATCH_DEBUG"
KV_DEBUG_ENV = "LLAMA_KV_CACHE_DEBUG"
GROUND_TRUTH_COLUMNS = (
    "decode",
    "line",
    "context",
    "seq_id",
    "n_tokens",
    "pos_min",
    "pos_max",
    "ret",
    "target_kv_min",
    "target_kv_max",
    "drafter_kv_min",
    "drafter_kv_max",
)
# Request kinds after the first ("new"), in turn: what a server slot sees between requests.
REQUEST_KINDS = ("continue", "clear", "partial")
SEQ = 0


class EngineError(RuntimeError):
    """The engine cannot run as asked; the message is one line for the user."""


@dataclass(slots=True)
class EngineConfig:
    fault: str = "none"
    requests: int = 3
    cycles: int = 32  # draft/verify cycles per request (a request also ends when its context is full)
    draft: int = 4  # k, tokens drafted per cycle
    seed: int = 0
    target: Path | None = None  # real GGUF paths; both or neither (then the generated tiny pair)
    drafter: Path | None = None
    cache_dir: Path | None = None
    log_prefix: bool = True  # new-scheme `M.SS.mmm.uuu L ` prefix on every entry
    kv_debug: bool = True  # LLAMA_KV_CACHE_DEBUG=1 (off: measure context attribution without find_slot)
    flavor: str = "fork"  # wording of the server/speculative lines: fork, fork-v0.2, upstream
    # block: DFlash, one drafter batch [id_last, mask x k] per cycle (the seed report's batch shape);
    # chain: draft-simple, k one-token drafter decodes (higher, chained acceptance)
    drafting: str = "block"
    prompt_words: tuple[int, int] = (24, 90)  # length range of the generated prompts, in words
    n_ctx_target: int = 8192
    n_ctx_drafter: int = 4096  # differs from the target's, as in real setups (its find_slot `size`)
    n_batch: int = 512
    n_threads: int = 1
    n_gpu_layers: int = 0
    split_mode: str = "layer"
    tensor_split: tuple[float, ...] = ()
    main_gpu: int = 0
    progress: bool = False

    def validate(self) -> None:
        if self.fault not in FAULTS:
            raise EngineError(f"unknown fault {self.fault!r} (choose from {', '.join(FAULTS)})")
        if self.flavor not in server_lines.FLAVORS:
            raise EngineError(f"unknown flavour {self.flavor!r} (choose from {', '.join(server_lines.FLAVORS)})")
        if self.drafting not in DRAFTING:
            raise EngineError(f"unknown drafting {self.drafting!r} (choose from {', '.join(DRAFTING)})")
        if self.split_mode not in SPLIT_MODES:
            raise EngineError(f"unknown split mode {self.split_mode!r} (choose from {', '.join(SPLIT_MODES)})")
        if self.requests < 1 or self.cycles < 1:
            raise EngineError("--requests and --cycles must be at least 1")
        if self.fault == "stale-drafter" and self.requests < 2:
            raise EngineError("stale-drafter needs at least 2 requests: the drafter goes stale at a reset")
        if not 1 <= self.draft <= min(64, self.n_batch - 1):
            raise EngineError(f"--draft must be between 1 and {min(64, self.n_batch - 1)}")
        if not 1 <= self.prompt_words[0] <= self.prompt_words[1]:
            raise EngineError("prompt_words must be a (min, max) range with 1 <= min <= max")
        if min(self.n_ctx_target, self.n_ctx_drafter) < 256:
            raise EngineError("context sizes must be at least 256")


@dataclass(slots=True)
class DecodeRecord:
    """One `llama_decode` call, as the API saw it (a row of ground_truth.parquet)."""

    decode: int
    line: int
    context: str
    seq_id: int
    n_tokens: int
    pos_min: int
    pos_max: int
    ret: int
    target_kv_min: int
    target_kv_max: int
    drafter_kv_min: int
    drafter_kv_max: int


@dataclass(slots=True)
class CycleRecord:
    """One draft/verify cycle: what was drafted and accepted, and both caches' max position after it."""

    request: int
    task: int
    cycle: int
    pos: int  # n_past at the start of the cycle: where the draft and verify batches start
    n_draft: int  # tokens drafted (0 when the drafter's batch was refused)
    n_accepted: int
    draft_ret: int
    target_kv_max: int
    drafter_kv_max: int


@dataclass(slots=True)
class EngineResult:
    session: Path
    config: EngineConfig
    decodes: list[DecodeRecord]
    cycles: list[CycleRecord]
    n_requests: int
    duration_s: float
    drafted: int
    accepted: int

    @property
    def n_decodes(self) -> int:
        return len(self.decodes)

    @property
    def n_failures(self) -> int:
        return sum(1 for d in self.decodes if d.ret != 0)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "session": str(self.session),
            "fault": self.config.fault,
            "requests": self.n_requests,
            "cycles": len(self.cycles),
            "decodes": self.n_decodes,
            "failures": self.n_failures,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": round(self.acceptance, 5),
            "duration_s": round(self.duration_s, 3),
        }


class _Context:
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


class _Slot:
    """The per-request state a server slot keeps."""

    def __init__(self) -> None:
        self.tokens: list[int] = []  # prompt + generated; all but the last are in the target's cache
        self.n_past = 0
        self.id_last = -1


def _prompt_text(rng: random.Random, n_words: int) -> str:
    # Mostly words, some punctuation that makes token pieces awkward in batch dumps, a few newlines.
    extras = ("),", ",", "(", ")", ":", "\n", ";", "=")
    parts = [rng.choice(WORDS) if rng.random() > 0.12 else rng.choice(extras) for _ in range(n_words)]
    return " ".join(parts)


class _Engine:
    def __init__(self, config: EngineConfig, models: ModelPair, writer: LogWriter) -> None:
        import llama_cpp

        self.L = llama_cpp
        self.cfg = config
        self.models = models
        self.w = writer
        self.lines = ServerLines(writer, config.flavor)
        self.stats = SpecStats()
        self.decodes: list[DecodeRecord] = []
        self.cycles: list[CycleRecord] = []
        self.rng = random.Random(config.seed)
        self.drafted = 0
        self.accepted = 0
        self.n_requests = 0
        self.target = _Context(llama_cpp, "target", models.target, config.n_ctx_target, config)
        try:
            self.drafter = _Context(llama_cpp, "drafter", models.drafter, config.n_ctx_drafter, config)
        except EngineError:
            self.target.close()
            raise
        if self.drafter.n_vocab != self.target.n_vocab:
            self.close()
            raise EngineError(
                f"target and drafter vocabularies differ ({self.target.n_vocab} vs {self.drafter.n_vocab} tokens)"
            )
        self.limit = min(self.target.n_ctx, self.drafter.n_ctx)
        self.banned = self._banned_tokens()
        self.mask = MASK_ID if models.generated else self._real_mask_token()
        self.drafter_in_sync = True  # false once the stale-drafter fault has left the drafter behind

    def close(self) -> None:
        self.drafter.close()
        self.target.close()

    # -- helpers -------------------------------------------------------------------------------
    def _banned_tokens(self) -> np.ndarray:
        """Tokens greedy sampling skips (the server's ignore_eos): control/end tokens, and the mask."""
        if self.models.generated:
            return np.arange(N_SPECIAL)
        L, v = self.L, self.target.vocab
        ids = [i for i in range(self.target.n_vocab) if L.llama_vocab_is_eog(v, i) or L.llama_vocab_is_control(v, i)]
        return np.array(ids, dtype=np.int64)

    def _real_mask_token(self) -> int:
        L, v = self.L, self.target.vocab
        for tok in (L.llama_vocab_pad(v), L.llama_vocab_eos(v), 0):
            if tok >= 0:
                return tok
        return 0

    def _argmax(self, ctx: _Context, i: int) -> int:
        logits = ctx.logits(i).copy()
        logits[self.banned] = -np.inf
        return int(np.argmax(logits))

    def _tokenize(self, text: str, add_special: bool) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (self.L.llama_token * n_max)()
        n = self.L.llama_tokenize(self.target.vocab, data, len(data), buf, n_max, add_special, False)
        if n < 0:
            raise EngineError("tokenizer overflow")
        return list(buf[:n])

    def decode(self, ctx: _Context, tokens: list[int], pos0: int, all_logits: bool) -> int:
        ctx.fill(tokens, pos0, all_logits)
        line = self.w.line
        ret = int(self.L.llama_decode(ctx.ctx, ctx.batch))
        t_min, t_max = self.target.kv_range()
        d_min, d_max = self.drafter.kv_range()
        self.decodes.append(
            DecodeRecord(
                len(self.decodes), line, ctx.name, SEQ, len(tokens), pos0, pos0 + len(tokens) - 1, ret,
                t_min, t_max, d_min, d_max,
            )
        )  # fmt: skip
        self.w.flush()  # a crash later still leaves everything up to this decode on disk
        return ret

    def _decode_prompt(self, ctx: _Context, tokens: list[int], n_past: int, task: int, show: bool) -> int:
        """Prompt tokens from n_past on, in n_batch chunks, logits for the last one only."""
        n_batch = self.cfg.n_batch
        for off in range(n_past, len(tokens), n_batch):
            chunk = tokens[off : off + n_batch]
            done = off + len(chunk) >= len(tokens)
            if show:
                self.lines.prompt_progress(task, off + len(chunk), len(chunk), (off + len(chunk)) / len(tokens), done)
            ret = self.decode(ctx, chunk, off, all_logits=False)
            if ret != 0:
                return ret
        return 0

    # -- one request ------------------------------------------------------------------------------
    def _next_prompt(self, index: int, slot: _Slot) -> tuple[str, list[int]]:
        kind = "new" if index == 0 else REQUEST_KINDS[(index - 1) % len(REQUEST_KINDS)]
        text = _prompt_text(self.rng, self.rng.randint(*self.cfg.prompt_words))
        if kind == "continue":
            prompt = slot.tokens + self._tokenize(" " + text, add_special=False)
        elif kind == "partial":
            prompt = slot.tokens[: max(1, len(slot.tokens) // 2)] + self._tokenize(" " + text, add_special=False)
        else:
            prompt = self._tokenize(text, add_special=True)
        if kind != "new" and len(prompt) + 4 * (self.cfg.draft + 1) >= self.limit:
            # The conversation outgrew the context: start afresh, as a client would.
            kind, prompt = "clear", self._tokenize(text, add_special=True)
        return kind, prompt

    def run_request(self, index: int, slot: _Slot, on_cycle: Callable[[], None]) -> None:
        cfg, T, D = self.cfg, self.target, self.drafter
        task = index
        self.n_requests += 1
        kind, prompt = self._next_prompt(index, slot)
        # Common prefix with what the cache holds; a "clear" request does not reuse (cache_prompt off).
        cached = slot.tokens[: slot.n_past]
        n_past = 0
        if kind in ("continue", "partial"):
            while n_past < min(len(cached), len(prompt)) and cached[n_past] == prompt[n_past]:
                n_past += 1
        n_past = min(n_past, len(prompt) - 1)  # the server evaluates at least one prompt token
        if cfg.fault == "stale-drafter" and index >= 1:
            # The fault: from this reset on, the target is rewound/cleared and fed, the drafter left alone.
            self.drafter_in_sync = False

        self.lines.new_prompt(task, T.n_ctx, 0, len(prompt))
        self.lines.cached(task, n_past)
        t0 = time.perf_counter()
        if n_past == 0:
            T.clear()
        else:
            T.seq_rm(n_past)
        if self.drafter_in_sync:
            if n_past == 0:
                D.clear()
            else:
                D.seq_rm(n_past)
        self.stats.n_begin += 1
        ret = self._decode_prompt(T, prompt, n_past, task, show=True)
        if ret != 0:
            self.lines.target_failed(0, cfg.n_batch, ret)
            slot.tokens, slot.n_past = [], 0
            return
        slot.id_last = self._argmax(T, -1)
        if self.drafter_in_sync:
            # Stand-in for DFlash's prefill capture: the drafter's cache covers the prompt too.
            tb = time.perf_counter()
            dret = self._decode_prompt(D, prompt, n_past, task, show=False)
            self.stats.t_begin_ms += (time.perf_counter() - tb) * 1e3
            if dret != 0:
                self.lines.commit_failed(dret, len(prompt) - n_past)
        t_prompt_ms = (time.perf_counter() - t0) * 1e3
        slot.tokens = prompt + [slot.id_last]
        slot.n_past = len(prompt)
        n_decoded = 1
        drafted = accepted = verify_steps = 0

        t1 = time.perf_counter()
        for c in range(cfg.cycles):
            if slot.n_past + cfg.draft + 2 > self.limit:
                break  # the slot's context is full: the request ends here, like hitting n_predict
            a, n_draft, ok = self._cycle(index, task, c, slot)
            on_cycle()
            if not ok:
                break
            n_decoded += a + 1
            drafted += n_draft
            accepted += a
            verify_steps += 1 if n_draft else 0
        t_gen_ms = (time.perf_counter() - t1) * 1e3
        self.drafted += drafted
        self.accepted += accepted
        perf = self.L.llama_perf_context(T.ctx)
        timings = RequestTimings(
            len(prompt) - n_past, t_prompt_ms, n_decoded, t_gen_ms, int(perf.n_reused), drafted, accepted, verify_steps
        )
        self.lines.print_timings(task, timings, self.stats)
        self.lines.release(task, slot.n_past, truncated=False)  # the prompt was never cut
        self.w.flush()

    def _cycle(self, index: int, task: int, c: int, slot: _Slot) -> tuple[int, int, bool]:
        """One draft/verify cycle. Returns (accepted, drafted, target ok)."""
        cfg, T, D, k = self.cfg, self.target, self.drafter, self.cfg.draft
        n_past, id_last = slot.n_past, slot.id_last
        rollback = cfg.fault != "no-rollback" and self.drafter_in_sync

        # Draft: the fork trims the drafter to committed_len first, then decodes the block there.
        t0 = time.perf_counter()
        if rollback:
            D.seq_rm(n_past)
        self.stats.n_gen_calls += 1
        drafts, dret = self._draft(n_past, id_last)
        if drafts:
            self.stats.n_gen_drafts += 1
            self.stats.n_gen_tokens += len(drafts)
        if dret != 0:
            self.lines.draft_failed(dret)
        self.stats.t_gen_ms += (time.perf_counter() - t0) * 1e3

        # Verify [id_last, d1..dk] in one target batch; with no draft this is a plain decode step.
        tret = self.decode(T, [id_last] + drafts, n_past, all_logits=True)
        if tret != 0:
            self.lines.target_failed(0, cfg.n_batch, tret)
            return 0, len(drafts), False
        a = 0
        while a < len(drafts) and self._argmax(T, a) == drafts[a]:
            a += 1
        new_token = self._argmax(T, a)

        if drafts:
            t1 = time.perf_counter()
            self.stats.n_acc_calls += 1
            self.stats.n_acc_tokens += a
            self.stats.n_acc_drafts += 1 if a else 0
            if len(self.stats.acc_per_pos) < k:
                self.stats.acc_per_pos += [0] * (k - len(self.stats.acc_per_pos))
            for j in range(a):
                self.stats.acc_per_pos[j] += 1
            T.seq_rm(n_past + a + 1)
            if self.drafter_in_sync:
                self._commit(n_past, drafts, a, rollback)
            self.stats.t_acc_ms += (time.perf_counter() - t1) * 1e3

        slot.tokens += drafts[:a] + [new_token]
        slot.n_past = n_past + a + 1
        slot.id_last = new_token
        if drafts:
            self.lines.accepted(task, a, len(drafts), slot.n_past)
        self.cycles.append(CycleRecord(index, task, c, n_past, len(drafts), a, dret, T.kv_range()[1], D.kv_range()[1]))
        return a, len(drafts), True

    def _draft(self, n_past: int, id_last: int) -> tuple[list[int], int]:
        """Draft k tokens starting at n_past. Returns (drafts, ret of the drafter decode)."""
        D, k = self.drafter, self.cfg.draft
        if self.cfg.drafting == "block":
            ret = self.decode(D, [id_last] + [self.mask] * k, n_past, all_logits=True)
            return ([self._argmax(D, j) for j in range(k)] if ret == 0 else []), ret
        drafts: list[int] = []
        token = id_last
        for j in range(k):
            ret = self.decode(D, [token], n_past + j, all_logits=True)
            if ret != 0:
                return drafts, ret
            token = self._argmax(D, 0)
            drafts.append(token)
        return drafts, 0

    def _commit(self, n_past: int, drafts: list[int], a: int, rollback: bool) -> None:
        """Roll the drafter back to the accepted prefix and commit what it lacks: it ends at the target's max.

        Without rollback (the no-rollback fault) the rejected positions stay: the block's masks count as
        committed, and the chain only gets the one position it never decoded.
        """
        D = self.drafter
        if self.cfg.drafting == "block":
            if not rollback:
                return
            # The block held masks after id_last: drop them, then feed the accepted tokens.
            D.seq_rm(n_past + 1)
            todo, pos = drafts[:a], n_past + 1
        else:
            # The chain holds id_last, d1..d(k-1): keep the accepted ones; dk was never decoded.
            if rollback:
                D.seq_rm(n_past + a + 1)
            todo, pos = (drafts[-1:], n_past + a) if a == len(drafts) else ([], 0)
        if todo:
            ret = self.decode(D, todo, pos, all_logits=False)
            if ret != 0:
                self.lines.commit_failed(ret, len(todo))

    def run(self) -> None:
        from tqdm import tqdm

        total = self.cfg.requests * self.cfg.cycles
        slot = _Slot()
        with tqdm(
            total=total, disable=not self.cfg.progress, file=sys.stderr, unit="cycle", desc="capture", leave=False
        ) as bar:
            for index in range(self.cfg.requests):
                self.run_request(index, slot, lambda: bar.update(1))
        self.lines.all_idle()


def _device_info(config: EngineConfig) -> dict[str, Any]:
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


def _model_entry(path: Path, models: ModelPair) -> dict[str, Any]:
    entry: dict[str, Any] = {"file": path.name, "sha256": sha256_file(path), "bytes": path.stat().st_size}
    if models.generated:
        entry |= {"generated": True, "seed": models.seed}
    else:
        entry["path"] = str(path)
    return entry


def _write_ground_truth(path: Path, decodes: list[DecodeRecord]) -> None:
    import pandas as pd

    frame = pd.DataFrame([asdict(d) for d in decodes], columns=list(GROUND_TRUTH_COLUMNS))
    frame = frame.astype({c: "int64" for c in GROUND_TRUTH_COLUMNS if c != "context"})
    frame["context"] = frame["context"].astype("string")
    frame.to_parquet(path, index=False)


def engine_models(config: EngineConfig) -> ModelPair:
    """The user's GGUF pair (checked) or the generated tiny pair (made on first use)."""
    try:
        return resolve_models(config.target, config.drafter, cache_dir=config.cache_dir, seed=config.seed)
    except (OSError, ValueError) as e:
        raise EngineError(str(e)) from None


def run_engine(config: EngineConfig, session: Session, models: ModelPair | None = None) -> EngineResult:
    """Run a capture into `session`: raw.log, ground_truth.parquet and manifest.json.

    Raises EngineError (one-line message) for settings or models that cannot be used.
    """
    config.validate()
    if models is None:
        models = engine_models(config)
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
            "models": {"target": _model_entry(models.target, models), "drafter": _model_entry(models.drafter, models)},
            "versions": {
                "kvtrace": tool_version(),
                "llama_cpp_python": llama_cpp.__version__,
                "llama_cpp": f"vendored by llama-cpp-python {llama_cpp.__version__}",
                "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
            },
            "env": {BATCH_DEBUG_ENV: "1", KV_DEBUG_ENV: "1" if config.kv_debug else None},
            "device": _device_info(config),
            "files": {"raw_log": RAW_LOG, "ground_truth": GROUND_TRUTH},
            "started": started,
            "outcome": {"status": "running"},
        }
    )
    saved = {name: os.environ.get(name) for name in (BATCH_DEBUG_ENV, KV_DEBUG_ENV)}
    os.environ[BATCH_DEBUG_ENV] = "1"
    if config.kv_debug:
        os.environ[KV_DEBUG_ENV] = "1"
    else:
        os.environ.pop(KV_DEBUG_ENV, None)
    writer = LogWriter(session.raw_log, prefix=config.log_prefix)
    t0 = time.perf_counter()
    engine: _Engine | None = None
    status = "error"
    try:
        llama_cpp.llama_backend_init()
        with LlamaLogCapture(writer):
            engine = _Engine(config, models, writer)
            try:
                engine.run()
            finally:
                engine.close()
        if writer.levels[DEBUG] == 0:
            raise EngineError("llama.cpp delivered no DEBUG-level lines, so raw.log has no batch dumps")
        status = "ok"
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
                "ended": now_iso(),
                "outcome": {
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
    )


_LEVEL_NAMES = {"none": 0, "debug": 1, "info": 2, "warn": 3, "error": 4, "cont": 5}
