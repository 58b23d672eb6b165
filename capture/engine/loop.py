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

Silent faults start at a chosen request and cycle and are never refused at their onset (the health findings'
ground truth, `fault` in ground_truth.parquet from the first decode they touch):
- `silent-stale`: the drafter is given a stale token instead of the target's (draft-simple: the token it drafts
  from and the accepted tokens it stores; DFlash: zero feature rows instead of the target's layer inputs) at the
  right positions, to the end of the run: no error, and a drafter that reads them stops matching the target;
- `stops-drafting`: from one request on the speculative step is skipped: no drafts, one token per step;
- `drafter-lags`: the drafter's cache stops advancing (no commits or injections; it drafts at its own end, so its
  positions stay consecutive) for `lag_cycles` cycles, then a draft goes in at the target's position and llama.cpp
  refuses it, as stale-drafter's do from then on.

The truth about every `llama_decode` call comes from the API, not the log, and goes to
`ground_truth.parquet` beside raw.log.
"""

from __future__ import annotations

import ctypes
import random
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvtrace.capture.engine.config import SILENT_FAULTS, EngineConfig, EngineError, check_stop
from kvtrace.capture.engine.lines import RequestTimings, ServerLines, SpecStats, spc_prefix
from kvtrace.capture.engine.llama import SEQ, Context, layer_input_api
from kvtrace.capture.engine.llama_log import LogWriter
from kvtrace.capture.engine.records import CycleRecord, DecodeRecord
from kvtrace.capture.models import MASK_ID, N_SPECIAL, WORDS, ModelPair, gguf_meta

if TYPE_CHECKING:
    from kvtrace.capture.engine.devices import RunDevices

# Request kinds after the first ("new"), in turn: what a server slot sees between requests.
REQUEST_KINDS = ("continue", "clear", "partial")
INJECT_FAILED = -1000  # _decode_prompt: the target's prompt went in, the drafter's injection of it did not


class Slot:
    """The per-request state a server slot keeps."""

    def __init__(self) -> None:
        self.tokens: list[int] = []  # prompt + generated; all but the last are in the target's cache
        self.n_past = 0
        self.id_last = -1


def prompt_text(rng: random.Random, n_words: int) -> str:
    # Mostly words, some punctuation that makes token pieces awkward in batch dumps, a few newlines.
    extras = ("),", ",", "(", ")", ":", "\n", ";", "=")
    parts = [rng.choice(WORDS) if rng.random() > 0.12 else rng.choice(extras) for _ in range(n_words)]
    return " ".join(parts)


class Engine:
    """One server slot's requests in a row: prompt, then draft/verify cycles, on real llama.cpp contexts."""

    def __init__(self, config: EngineConfig, models: ModelPair, writer: LogWriter,
                 devices: RunDevices | None = None) -> None:
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
        self.dflash = config.spec_type == "draft-dflash"
        self.eagle3 = config.spec_type == "draft-eagle3"
        self.hidden = self.dflash or self.eagle3  # drafters fed the target's layer inputs
        self.k = config.draft
        self.w.tap = []  # llama.cpp says where it put each of the target's layers
        try:
            self.target = self._load("target", models.target, config.n_ctx_target, None,
                                     devices.target() if devices else None)
            said = b"".join(self.w.tap)
        finally:
            self.w.tap = None
        try:
            # DFlash and EAGLE3 drafters read the target's token embeddings and output head through ctx_other.
            other = self.target if self.hidden else None
            if self.hidden and devices is not None and devices.rpc:
                self._check_output_head(said, devices.names(config, devices.drafter()))
            self.drafter = self._load("drafter", models.drafter, config.n_ctx_drafter, other,
                                      devices.drafter() if devices else None)
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
        self.fault_on = False  # a silent fault (SILENT_FAULTS) is in force
        self.stale_token = -1  # silent-stale: what the drafter is given instead of the target's tokens
        self.lagged = 0  # drafter-lags: cycles the drafter's cache has stayed put so far
        self.layer_ids: list[int] = []
        self.get_layer_inp: Any = None
        # EAGLE3's deferred boundary: the last target row's position and its g (encoder output), and the
        # rows of the last verify batch, for accept() to pick the accepted one
        self.pending_pos = -1
        self.pending_g = np.zeros(0, dtype=np.float32)
        self.verify_g = np.zeros((0, 0), dtype=np.float32)
        self.verify_pos_first = -1
        self.nextn: Any = None
        if self.dflash:
            self._start_dflash()
        elif self.eagle3:
            self._start_eagle3()

    def _load(self, name: str, path: Path, n_ctx: int, other: Context | None, devices: list[int] | None) -> Context:
        """A model and its context, or EngineError with llama.cpp's own reason (its first ERROR line)."""
        self.w.watch_errors()
        # --main-gpu indexes the target's devices; a drafter put on one device of its own has only index 0
        main_gpu = 0 if name == "drafter" and self.cfg.draft_device else None
        try:
            return Context(self.L, name, path, n_ctx, self.cfg, other, devices, main_gpu)
        except EngineError as exc:
            said = self.w.first_error
            raise EngineError(f"{exc}: {said}" if said else str(exc)) from None

    def _check_output_head(self, said: bytes, drafter_devices: list[str]) -> None:
        """A DFlash or EAGLE3 drafter computes with the target's output head: on a device the drafter does not
        have, ggml aborts the process (`pre-allocated tensor (output.weight) in a buffer ... that cannot run the
        operation`). Refused in one line instead; llama.cpp's `layer N assigned to device` for the output layer
        (N = n_layer) says where the head went."""
        n_layer = self.L.llama_model_n_layer(self.target.model)
        m = re.search(rb"layer +%d assigned to device ([\w.-]+)" % n_layer, said)
        head = m[1].decode() if m else "CPU"
        if head == "CPU":
            return
        if head == "Meta":  # --split-mode tensor: one Meta() device over the model's devices, shared only as a whole
            if self.cfg.draft_device:
                raise EngineError(
                    f"--draft-device {self.cfg.draft_device}: with --split-mode tensor a {self.cfg.spec_type} drafter "
                    "computes with the target's output head on a device made of all the target's devices; leave "
                    "--draft-device out (ggml would abort the process)")
        elif head not in drafter_devices:
            raise EngineError(
                f"--draft-device {self.cfg.draft_device}: a {self.cfg.spec_type} drafter computes with the target's "
                f"output head, which llama.cpp put on {head}; put the drafter there (ggml would abort the process)")

    def _start_dflash(self) -> None:
        """What common_speculative_impl_draft_dflash's constructor does: the drafter's <mask>, its block size,
        extraction of the target's layer inputs, and non-causal attention in the drafter."""
        L, meta = self.L, gguf_meta(self.models.drafter)
        layers, block = meta["dflash.target_layers"], meta.get("dflash.block_size", 16)
        assert isinstance(layers, list) and isinstance(block, int)  # engine_models checked the file
        self.layer_ids, block_size = [int(i) for i in layers], block
        self.mask = int(L.llama_vocab_mask(self.drafter.vocab))
        if self.k > block_size - 1:
            self.lines.dflash_clamp(self.k, block_size)
            self.k = block_size - 1
        set_layer_inp, self.get_layer_inp = layer_input_api(L)
        for il in self.layer_ids:
            set_layer_inp(self.target.ctx, il, True)
        L.llama_set_causal_attn(self.drafter.ctx, False)
        n_layer = L.llama_model_n_layer(self.target.model)
        self.lines.dflash_added(self.k, block_size, self.mask, self.layer_ids, self.target.n_embd, n_layer)

    def _start_eagle3(self) -> None:
        """common_speculative_impl_draft_eagle3's constructor: extraction of the three target layer inputs, and
        the drafter's nextn embeddings (g from the encoder, the pre-norm state of each draft)."""
        from llama_cpp import llama_cpp_ext

        meta = gguf_meta(self.models.drafter)
        layers = meta["eagle3.target_layers"]
        assert isinstance(layers, list)  # engine_models checked the file
        self.layer_ids = [int(i) for i in layers]
        set_layer_inp, self.get_layer_inp = layer_input_api(self.L)
        for il in sorted(set(self.layer_ids)):
            set_layer_inp(self.target.ctx, il, True)
        self.nextn = llama_cpp_ext
        llama_cpp_ext.llama_set_embeddings_nextn(self.drafter.ctx, True, True)
        self.lines.eagle3_added(self.k)

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

    def _argmax(self, ctx: Context, i: int) -> int:
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

    def decode(self, ctx: Context, tokens: list[int], pos0: int, all_logits: bool, step: str) -> int:
        ctx.fill(tokens, pos0, all_logits)
        line = self.w.line
        ret = int(self.L.llama_decode(ctx.ctx, ctx.batch))
        return self._record(ctx, line, len(tokens), pos0, ret, step)

    def _record(self, ctx: Context, line: int, n: int, pos0: int, ret: int, step: str) -> int:
        check_stop()  # after every decode: a stop asked for by a signal (config.request_stop)
        t_min, t_max = self.target.kv_range()
        d_min, d_max = self.drafter.kv_range()
        self.decodes.append(
            DecodeRecord(
                len(self.decodes), line, ctx.name, SEQ, n, pos0, pos0 + n - 1, ret, t_min, t_max, d_min, d_max, step,
                self.cfg.fault if self.fault_on else "",
            )
        )
        self.w.flush()  # a crash later still leaves everything up to this decode on disk
        return ret

    # -- DFlash: the drafter's two kinds of llama_process call ---------------------------------------
    def _inject(self, n: int, pos0: int) -> int:
        """process(): the target's layer inputs for the n tokens of its last batch go into the drafter's KV at
        the same positions, as one embedding batch (DFlash's fused fc -> hidden_norm -> K/V graph)."""
        rows = self._features(n)
        line = self.w.line
        ret = self.drafter.process_embd(rows, pos0)
        self._record(self.drafter, line, n, pos0, ret, "inject")
        if ret != 0:
            self.lines.inject_failed(ret, n)
        return ret

    def _features(self, n: int) -> np.ndarray:
        """The target's layer inputs for the n tokens of its last batch, one row of len(layer_ids) x n_embd each
        (silent-stale: zero rows, the target's missed)."""
        if self._silent("silent-stale"):
            return np.zeros((n, len(self.layer_ids) * self.target.n_embd), dtype=np.float32)
        return np.concatenate(
            [np.ctypeslib.as_array(self.get_layer_inp(self.target.ctx, il), shape=(n, self.target.n_embd))
             for il in self.layer_ids], axis=1,
        )  # fmt: skip

    def _process(self, tokens: list[int], pos0: int) -> int:
        """common_speculative_process() after a target batch: DFlash's injection or EAGLE3's encode + pairs."""
        return self._inject(len(tokens), pos0) if self.dflash else self._e3_process(tokens, pos0)

    def _e3_process(self, tokens: list[int], pos0: int) -> int:
        """EAGLE3 process(): encode the target's features into g rows (ENCODE at the drafter's next positions,
        no KV), then decode the pairs (token[k + 1], g[k]) at the target's positions pos0 + k, plus the deferred
        (token[0], g of the last boundary) when it lines up; the last row becomes the new deferred boundary."""
        D, n = self.drafter, len(tokens)
        line = self.w.line
        p_enc = D.kv_range()[1] + 1
        ret = D.process_embd(self._features(n), p_enc, encode=True)
        self._record(D, line, n, p_enc, ret, "encode")
        if ret != 0:
            self.lines.eagle3_failed("encode", ret, n, p_enc)
            return ret
        g = np.ctypeslib.as_array(self.nextn.llama_get_embeddings_nextn(D.ctx), shape=(n, D.n_embd)).copy()
        pair_tokens, pair_rows, p0 = tokens[1:], g[: n - 1], pos0
        if self.pending_pos >= 0 and self.pending_pos + 1 == pos0 and self.pending_pos > D.kv_range()[1]:
            pair_tokens, p0 = [tokens[0]] + pair_tokens, self.pending_pos
            pair_rows = np.concatenate([self.pending_g[None, :], pair_rows])
        self.verify_pos_first, self.pending_pos = pos0, pos0 + n - 1
        self.verify_g, self.pending_g = g, g[n - 1].copy()
        if not pair_tokens:
            return 0
        line = self.w.line
        ret = D.process_pairs(pair_tokens, pair_rows, p0, output=False)
        self._record(D, line, len(pair_tokens), p0, ret, "inject")
        if ret != 0:
            self.lines.eagle3_failed("inject", ret, len(pair_tokens), pos0)
        return ret

    def _e3_accept(self, a: int) -> None:
        if len(self.verify_g):
            i = min(a, len(self.verify_g) - 1)
            self.pending_pos, self.pending_g = self.verify_pos_first + i, self.verify_g[i].copy()

    def _e3_draft(self, id_last: int) -> tuple[list[int], int]:
        """EAGLE3 draft(): trim the drafter to the deferred boundary, decode (id_last, g) there, then one token at
        a time, each with the previous step's pre-norm state."""
        D = self.drafter
        if self.pending_pos < 0:
            return [], 0
        D.seq_rm(self.pending_pos)
        token, row, pos = id_last, self.pending_g[None, :], self.pending_pos
        drafts: list[int] = []
        for i in range(self.k):
            line = self.w.line
            ret = D.process_pairs([token], row, pos, output=True)
            self._record(D, line, 1, pos, ret, "draft")
            if ret != 0:
                self.lines.eagle3_failed("draft", ret, 1, pos, i)
                return drafts, ret
            token = self._argmax(D, 0)
            self.lines.draft_candidates(D.logits(0), i, self.banned, self._piece, prefix=spc_prefix("draft"))
            drafts.append(token)
            row = np.ctypeslib.as_array(self.nextn.llama_get_embeddings_nextn_ith(D.ctx, 0), shape=(1, D.n_embd)).copy()
            pos += 1
        return drafts, 0

    def _noise(self, n_past: int, id_last: int) -> tuple[list[int], int]:
        """draft(): the noise block [id_last, <mask> x k] at n_past.., read greedily at positions 1..k."""
        D, k = self.drafter, self.k
        line = self.w.line
        ret = D.process_tokens([id_last] + [self.mask] * k, n_past)
        self._record(D, line, k + 1, n_past, ret, "noise")
        if ret != 0:
            self.lines.draft_failed(ret, process=True)
            return [], ret
        drafts = []
        for j in range(1, k + 1):
            drafts.append(self._argmax(D, j))
            self.lines.draft_candidates(D.logits(j), j - 1, self.banned, self._piece)
        return drafts, 0

    def _piece(self, token: int) -> str:
        buf = ctypes.create_string_buffer(64)
        n = self.L.llama_token_to_piece(self.target.vocab, token, buf, len(buf), 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", "replace")

    def _decode_prompt(self, ctx: Context, tokens: list[int], n_past: int, task: int, show: bool) -> int:
        """Prompt tokens from n_past on, in n_batch chunks, logits for the last one only. With DFlash each target
        chunk is injected into the drafter right after it (the server calls process() on every batch)."""
        n_batch = self.cfg.n_batch
        for off in range(n_past, len(tokens), n_batch):
            chunk = tokens[off : off + n_batch]
            done = off + len(chunk) >= len(tokens)
            if show:
                self.lines.prompt_progress(task, off + len(chunk), len(chunk), (off + len(chunk)) / len(tokens), done)
            ret = self.decode(ctx, chunk, off, all_logits=False, step="prompt")
            if ret != 0:
                return ret
            feeds_drafter = self.hidden and ctx is self.target and self.drafter_in_sync
            if feeds_drafter and self._process(chunk, off) != 0 and self.lines.flavor == "upstream":
                return INJECT_FAILED  # upstream's server throws: the request ends
        return 0

    # -- one request ------------------------------------------------------------------------------
    def _next_prompt(self, index: int, slot: Slot) -> tuple[str, list[int]]:
        kind = "new" if index == 0 else REQUEST_KINDS[(index - 1) % len(REQUEST_KINDS)]
        text = prompt_text(self.rng, self.rng.randint(*self.cfg.prompt_words))
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

    def run_request(self, index: int, slot: Slot, on_cycle: Callable[[], None]) -> None:
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
        if cfg.fault == "stops-drafting" and index >= cfg.fault_start()[0]:
            self.fault_on = True

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
            if ret == INJECT_FAILED:
                self.lines.speculative_batch_failed()
            else:
                self.lines.target_failed(0, cfg.n_batch, ret)
            slot.tokens, slot.n_past = [], 0
            return
        slot.id_last = self._argmax(T, -1)
        if self.drafter_in_sync and not self.hidden and not self._silent("stops-drafting"):
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
            if slot.n_past + self.k + 2 > self.limit:
                break  # the slot's context is full: the request ends here, like hitting n_predict
            if cfg.fault in SILENT_FAULTS and not self.fault_on and (index, c) >= cfg.fault_start():
                self._fault_begins(slot)
            cycle = self._cycle_hidden if self.hidden else self._cycle
            a, n_draft, ok = cycle(index, task, c, slot)
            on_cycle()
            if cfg.pace_s:
                self.w.flush()  # what a live reader sees at once, as a server's unbuffered stderr
                end = time.monotonic() + cfg.pace_s
                while (left := end - time.monotonic()) > 0:  # in slices: a stop is not kept waiting
                    check_stop()
                    time.sleep(min(left, 0.1))
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

    def _cycle(self, index: int, task: int, c: int, slot: Slot) -> tuple[int, int, bool]:
        """One draft/verify cycle. Returns (accepted, drafted, target ok)."""
        cfg, T, D, k = self.cfg, self.target, self.drafter, self.cfg.draft
        n_past, id_last = slot.n_past, slot.id_last
        rollback = cfg.fault != "no-rollback" and self.drafter_in_sync

        # Draft: the fork trims the drafter to committed_len first, then decodes the block there.
        t0 = time.perf_counter()
        lag_at = D.kv_range()[1] + 1 if self._lagging() else None
        drafts: list[int]
        if self._silent("stops-drafting"):
            drafts, dret = [], 0  # the speculative step is skipped: the target decodes one token
        elif lag_at is not None:
            self.stats.n_gen_calls += 1
            drafts, dret = self._draft(lag_at, id_last)  # at its own end: consecutive, so nothing refuses it
        else:
            if rollback:
                D.seq_rm(n_past)
            self.stats.n_gen_calls += 1
            drafts, dret = self._draft(n_past, self.stale_token if self._silent("silent-stale") else id_last)
            self._lag_refused(dret)
        if drafts:
            self.stats.n_gen_drafts += 1
            self.stats.n_gen_tokens += len(drafts)
        if dret != 0:
            self.lines.draft_failed(dret)
        self.stats.t_gen_ms += (time.perf_counter() - t0) * 1e3

        verified = self._verify(id_last, drafts, n_past)
        if verified is None:
            return 0, len(drafts), False
        a, new_token = verified

        if drafts:
            t1 = time.perf_counter()
            self._count_accepted(a, k)
            T.seq_rm(n_past + a + 1)
            if lag_at is not None:
                D.seq_rm(lag_at)  # the draft goes, nothing is committed: the drafter's cache stays where it was
            elif self.drafter_in_sync:
                self._commit(n_past, drafts, a, rollback)
            self.stats.t_acc_ms += (time.perf_counter() - t1) * 1e3

        self._advance(slot, task, drafts, a, new_token)
        self.cycles.append(CycleRecord(index, task, c, n_past, len(drafts), a, dret, T.kv_range()[1], D.kv_range()[1]))
        return a, len(drafts), True

    def _cycle_hidden(self, index: int, task: int, c: int, slot: Slot) -> tuple[int, int, bool]:
        """One server-slot cycle with a real DFlash or EAGLE3 drafter. Returns (accepted, drafted, request goes on).

        draft() (DFlash: the noise block at n_past; EAGLE3: a chain from its deferred boundary), then the server
        drops what drafting put at n_past and after (seq_rm(ctx_dft, n_past, -1)); the target verifies
        [id_last, d1..dk] in one batch; process(): its layer inputs go into the drafter at the same positions;
        then the rejected positions leave both caches (the slot's common_memory::seq_rm) and accept() runs.
        """
        cfg, T, D = self.cfg, self.target, self.drafter
        n_past, id_last = slot.n_past, slot.id_last
        trim = cfg.fault != "no-rollback" and self.drafter_in_sync

        t0 = time.perf_counter()
        lag_at = D.kv_range()[1] + 1 if self._lagging() else None
        drafts: list[int]
        if self._silent("stops-drafting"):
            drafts, dret = [], 0  # the speculative step is skipped; process() still mirrors the target
        elif lag_at is not None:
            self.stats.n_gen_calls += 1
            drafts, dret = self._noise(lag_at, id_last)  # at its own end: consecutive, so nothing refuses it
            D.seq_rm(lag_at)
            trim = False
        else:
            self.stats.n_gen_calls += 1
            drafts, dret = self._noise(n_past, id_last) if self.dflash else self._e3_draft(id_last)
            self._lag_refused(dret)
            trim = trim and self.drafter_in_sync
        if trim:
            D.seq_rm(n_past)
        if drafts:
            self.stats.n_gen_drafts += 1
            self.stats.n_gen_tokens += len(drafts)
        self.stats.t_gen_ms += (time.perf_counter() - t0) * 1e3

        verified = self._verify(id_last, drafts, n_past)  # read before the drafter runs (its logits stay valid)
        if verified is None:
            return 0, len(drafts), False
        a, new_token = verified
        # drafter-lags: no injection, the drafter's cache stops advancing
        iret = 0 if lag_at is not None else self._process([id_last] + drafts, n_past)
        if iret != 0 and self.lines.flavor == "upstream":
            self.lines.speculative_batch_failed()
            self.cycles.append(CycleRecord(index, task, c, n_past, len(drafts), 0, dret, *self._maxes()))
            slot.tokens, slot.n_past = [], 0  # the request ends with an error; the slot starts afresh
            return 0, len(drafts), False

        if drafts:
            t1 = time.perf_counter()
            self._count_accepted(a, len(drafts))
            self.stats.t_acc_ms += (time.perf_counter() - t1) * 1e3
        T.seq_rm(n_past + a + 1)
        if trim:
            D.seq_rm(n_past + a + 1)
        if self.eagle3:
            self._e3_accept(a)
        self._advance(slot, task, drafts, a, new_token)
        self.cycles.append(CycleRecord(index, task, c, n_past, len(drafts), a, dret, *self._maxes()))
        return a, len(drafts), True

    # -- silent faults -------------------------------------------------------------------------------
    def _silent(self, fault: str) -> bool:
        return self.fault_on and self.cfg.fault == fault

    def _fault_begins(self, slot: Slot) -> None:
        """A silent fault's onset: from the next decode on, ground_truth.parquet names it."""
        self.fault_on = True
        if self.cfg.fault == "silent-stale":
            # a token of this conversation, not the one the target gives now: stale, at the right positions
            older = [t for t in slot.tokens[1:] if t != slot.id_last]
            self.stale_token = older[len(older) // 2] if older else int(self.banned.max()) + 1

    def _lagging(self) -> bool:
        """drafter-lags, still in the stretch where the drafter's cache stays put (counting this cycle)."""
        if not self._silent("drafter-lags") or not self.drafter_in_sync or self.lagged >= self.cfg.lag_cycles:
            return False
        self.lagged += 1
        return True

    def _lag_refused(self, dret: int) -> None:
        """drafter-lags after its stretch: the draft went in at the target's position and was refused, so the
        drafter is left behind for good (as stale-drafter's)."""
        if self._silent("drafter-lags") and self.lagged >= self.cfg.lag_cycles and dret != 0:
            self.drafter_in_sync = False

    def _verify(self, id_last: int, drafts: list[int], n_past: int) -> tuple[int, int] | None:
        """The target verifies [id_last, d1..dk] in one batch (a plain decode step when there is no draft):
        (drafts accepted, the token after them), or None when llama.cpp refused the batch."""
        T = self.target
        tret = self.decode(T, [id_last] + drafts, n_past, all_logits=True, step="verify")
        if tret != 0:
            self.lines.target_failed(0, self.cfg.n_batch, tret)
            return None
        a = 0
        while a < len(drafts) and self._argmax(T, a) == drafts[a]:
            a += 1
        return a, self._argmax(T, a)

    def _count_accepted(self, a: int, width: int) -> None:
        """The acceptance statistics the server prints: calls, tokens, drafts and per position (`width` wide)."""
        st = self.stats
        st.n_acc_calls += 1
        st.n_acc_tokens += a
        st.n_acc_drafts += 1 if a else 0
        if len(st.acc_per_pos) < width:
            st.acc_per_pos += [0] * (width - len(st.acc_per_pos))
        for j in range(a):
            st.acc_per_pos[j] += 1

    def _advance(self, slot: Slot, task: int, drafts: list[int], a: int, new_token: int) -> None:
        """The slot keeps the accepted drafts and the target's next token."""
        slot.tokens += drafts[:a] + [new_token]
        slot.n_past += a + 1
        slot.id_last = new_token
        if drafts:
            self.lines.accepted(task, a, len(drafts), slot.n_past)

    def _maxes(self) -> tuple[int, int]:
        return self.target.kv_range()[1], self.drafter.kv_range()[1]

    def _draft(self, n_past: int, id_last: int) -> tuple[list[int], int]:
        """Draft k tokens starting at n_past. Returns (drafts, ret of the drafter decode)."""
        D, k = self.drafter, self.cfg.draft
        if self.cfg.drafting == "block":
            ret = self.decode(D, [id_last] + [self.mask] * k, n_past, all_logits=True, step="draft")
            return ([self._argmax(D, j) for j in range(k)] if ret == 0 else []), ret
        drafts: list[int] = []
        token = id_last
        for j in range(k):
            ret = self.decode(D, [token], n_past + j, all_logits=True, step="draft")
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
        if todo and self._silent("silent-stale"):
            todo = [self.stale_token] * len(todo)  # at the right positions, the wrong tokens
        if todo:
            ret = self.decode(D, todo, pos, all_logits=False, step="commit")
            if ret != 0:
                self.lines.commit_failed(ret, len(todo))

    def run(self) -> None:
        from tqdm import tqdm

        total = self.cfg.requests * self.cfg.cycles
        slot = Slot()
        with tqdm(
            total=total, disable=not self.cfg.progress, file=sys.stderr, unit="cycle", desc="capture", leave=False
        ) as bar:
            for index in range(self.cfg.requests):
                self.run_request(index, slot, lambda: bar.update(1))
        self.lines.all_idle()
