"""The lines llama-server and its speculative code print around the decodes the engine makes.

The embedded engine plays the server slot and the DFlash drafter, so at each point where the real code
logs, it prints the same line in the same format (docs/llama-cpp-lines.md#builds-and-sources: beellama.cpp
v0.3 = `fork`, v0.2.0 = `fork-v0.2`, upstream mid-2026 = `upstream`). Only lines real code prints: nothing here
tells which context a batch belongs to; the reader has to infer that, as it must for a real log.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvtrace.capture.engine.llama_log import CONT, DEBUG, ERROR, INFO, WARN, LogWriter

if TYPE_CHECKING:  # numpy stays out of `kvtrace --help`, which reads FLAVORS from here
    import numpy as np

FLAVORS = ("fork", "fork-v0.2", "upstream")


def slot_prefix(func: str, slot: int, task: int) -> str:
    """SLT_* macros: `slot %12.*s: id %2d | task %d | ` with __func__ cut to 12 and right-aligned."""
    return f"slot {func[:12]:>12}: id {slot:2d} | task {task} | "


def srv_prefix(func: str) -> str:
    return f"srv  {func[:12]:>12}: "


def spc_prefix(func: str) -> str:
    return f"spec {func[:12]:>12}: "


@dataclass(slots=True)
class SpecStats:
    """common_speculative's counters, cumulative over the process like the real ones."""

    n_begin: int = 0
    n_gen_calls: int = 0
    n_acc_calls: int = 0
    n_gen_drafts: int = 0
    n_acc_drafts: int = 0
    n_gen_tokens: int = 0
    n_acc_tokens: int = 0
    t_begin_ms: float = 0.0
    t_gen_ms: float = 0.0
    t_acc_ms: float = 0.0
    acc_per_pos: list[int] = field(default_factory=list)


@dataclass(slots=True)
class RequestTimings:
    n_prompt: int
    t_prompt_ms: float
    n_decoded: int
    t_gen_ms: float
    n_reused: int
    n_drafted: int
    n_accepted: int
    n_verify_steps: int


def _rate_line(t_ms: float, n: int) -> str:
    per_token = t_ms / n if n else 0.0
    per_second = 1e3 * n / t_ms if t_ms > 0 else 0.0
    return f"{t_ms:10.2f} ms / {n:5d} tokens ({per_token:8.2f} ms per token, {per_second:8.2f} tokens per second)"


class ServerLines:
    """Prints one flavour's server/speculative lines into the capture's raw.log."""

    def __init__(self, writer: LogWriter, flavor: str = "fork", slot: int = 0) -> None:
        if flavor not in FLAVORS:
            raise ValueError(f"unknown flavour {flavor!r} (choose from {', '.join(FLAVORS)})")
        self.w = writer
        self.flavor = flavor
        self.slot = slot
        # Upstream does most per-slot work in lambdas, so its lines carry `operator()`.
        self.slot_func = "operator()" if flavor == "upstream" else "update_slots"

    def _slot(self, level: int, func: str, task: int, msg: str) -> None:
        self.w.emit(level, slot_prefix(func, self.slot, task) + msg + "\n")

    # -- prompt -------------------------------------------------------------------------------
    def new_prompt(self, task: int, n_ctx_slot: int, n_keep: int, n_tokens: int) -> None:
        self._slot(
            INFO,
            self.slot_func,
            task,
            f"new prompt, n_ctx_slot = {n_ctx_slot}, n_keep = {n_keep}, task.n_tokens = {n_tokens}",
        )

    def cached(self, task: int, n_past: int) -> None:
        if self.flavor == "fork-v0.2":
            self._slot(INFO, self.slot_func, task, f"n_tokens = {n_past}, memory_seq_rm [{n_past}, end)")
        else:
            self._slot(INFO, self.slot_func, task, f"cached n_tokens = {n_past}, memory_seq_rm [{n_past}, end)")

    def prompt_progress(self, task: int, n_tokens: int, batch_n_tokens: int, progress: float, done: bool) -> None:
        """v0.2.0 (old upstream wording) only; the new scheme prints these at most every 3 s."""
        if self.flavor != "fork-v0.2":
            return
        self._slot(
            INFO,
            self.slot_func,
            task,
            f"prompt processing progress, n_tokens = {n_tokens}, batch.n_tokens = {batch_n_tokens}, "
            f"progress = {progress:f}",
        )
        if done:
            self._slot(
                INFO,
                self.slot_func,
                task,
                f"prompt processing done, n_tokens = {n_tokens}, batch.n_tokens = {batch_n_tokens}",
            )

    # -- speculative cycle ----------------------------------------------------------------------
    def accepted(self, task: int, n_accepted: int, n_draft: int, n_tokens: int) -> None:
        self._slot(
            DEBUG, self.slot_func, task, f"accepted {n_accepted}/{n_draft} draft tokens, new n_tokens = {n_tokens}"
        )

    def draft_failed(self, ret: int, process: bool = False) -> None:
        """The drafter's batch was refused: the fork's flat `draft()`, or upstream's `draft` (draft-dflash calls
        llama_process, older copies and draft-simple llama_decode)."""
        if self.flavor == "upstream":
            self.w.emit(WARN, f"draft: {'llama_process' if process else 'llama_decode'} returned {ret}\n")
        else:
            self.w.emit(ERROR, f"dflash: drafter decode failed with {ret}\n")

    def inject_failed(self, ret: int, n_tokens: int) -> None:
        """DFlash process(): the injection of the target's layer inputs into the drafter was refused."""
        if self.flavor == "upstream":
            self.w.emit(ERROR, f"process: llama_process(ctx_dft) failed rc={ret} (n_tokens={n_tokens}, offset=0)\n")
        else:
            self.w.emit(ERROR, f"dflash: drafter decode failed with {ret}\n")

    def speculative_batch_failed(self) -> None:
        """Upstream's server after a failed process(): it logs this and throws (the request ends)."""
        self.w.emit(ERROR, srv_prefix("decode") + "failed to process speculative batch\n")

    def dflash_added(self, n_max: int, block_size: int, mask: int, layer_ids: list[int], n_embd: int,
                     n_layer_target: int) -> None:
        """The DFlash implementation's start-up lines: upstream's constructor, or the fork's contract line
        (v0.3 on; cross_ctx is the fork's --spec-dflash-cross-ctx default)."""
        if self.flavor == "upstream":
            func = "common_speculative_impl_draft_dflash"
            self.w.emit(INFO, f"{func}: adding speculative implementation 'draft-dflash'\n")
            self.w.emit(INFO, f"{func}: - n_max={n_max}, n_min=0, p_min=0.00\n")
            self.w.emit(
                INFO,
                f"{func}: - block_size={block_size}, mask_token_id={mask}, n_extract={len(layer_ids)}, "
                "sample_from_anchor=false\n",
            )
        elif self.flavor == "fork":
            ids = "[" + ",".join(str(i) for i in layer_ids) + "]"
            self.w.emit(
                INFO,
                f"dflash: contract ok: block_size={block_size} mask_token={mask} target_layer_ids={ids} "
                f"n_target_layers={len(layer_ids)} n_embd={n_embd} n_target_features={n_embd * len(layer_ids)} "
                f"target_layers={n_layer_target} cross_ctx=512\n",
            )

    def eagle3_added(self, n_max: int) -> None:
        """EAGLE3's constructor (SPC_TRC: trace lines, printed at debug level)."""
        func = spc_prefix("common_speculative_impl_draft_eagle3")
        self.w.emit(DEBUG, f"{func}adding speculative implementation 'draft-eagle3'\n")
        self.w.emit(DEBUG, f"{func}- n_max={n_max}, n_min=0, p_min=0.000000, backend_sampling=1\n")

    def eagle3_failed(self, step: str, ret: int, n_tokens: int, pos: int, i: int = 0) -> None:
        """EAGLE3's own SPC_ERR lines (upstream's wording in every flavour: the forks' EAGLE3 is upstream's)."""
        if step == "encode":
            msg = f"{spc_prefix('process')}llama_process(ctx_dft) failed rc={ret} (n_tokens={n_tokens}, offset=0)"
        elif step == "inject":
            msg = (f"{spc_prefix('process')}llama_process(ctx_dft) failed rc={ret} (n_tokens={n_tokens}, "
                   f"ubatch_pos[0]={pos})")
        else:
            msg = f"{spc_prefix('draft')}llama_process{f'[{i}]' if i else ''} returned {ret}"
        self.w.emit(ERROR, msg + "\n")

    def dflash_clamp(self, n_max: int, block_size: int) -> None:
        self.w.emit(
            WARN,
            f"common_speculative_impl_draft_dflash: requested draft size (n_max={n_max}, n_min=0) exceeds the "
            f"trained block size {block_size} -- clamping to {block_size - 1}\n",
        )

    def draft_candidates(self, logits: np.ndarray, pos: int, banned: np.ndarray, piece: Callable[[int], str],
                         prefix: str = "") -> None:
        """draft()'s DBG lines for one drafted position: the top 3 of the backend's top-k 10 (DFlash's LOG_DBG
        has no prefix, EAGLE3's SPC_DBG has `spec        draft: `)."""
        import numpy as np

        z = logits.astype(np.float64)  # a copy: the drafter's logits stay as llama.cpp left them
        z[banned] = -np.inf
        top = np.argsort(-z, kind="stable")[:10]
        p = np.exp(z[top] - z[top[0]])
        p /= p.sum()
        for k in range(3):
            tok = int(top[k])
            self.w.emit(
                DEBUG,
                f"{prefix} - seq_id 0, draft candidate {k:3d}, pos {pos:3d}: {tok:6d} ({p[k]:8.3f}) '{piece(tok)}'\n",
            )

    def commit_failed(self, ret: int, n_tokens: int) -> None:
        """Feeding accepted tokens to the drafter failed (upstream draft-dflash [process])."""
        if self.flavor == "upstream":
            self.w.emit(ERROR, f"process: llama_decode(ctx_dft) failed rc={ret} (n_tokens={n_tokens}, offset=0)\n")
        else:
            self.w.emit(ERROR, f"dflash: drafter decode failed with {ret}\n")

    def target_failed(self, off: int, n_batch: int, ret: int) -> None:
        if self.flavor == "upstream":
            self.w.emit(
                ERROR, srv_prefix("decode") + f"Invalid input batch. off = {off}, n_batch = {n_batch}, ret = {ret}\n"
            )
        else:
            self.w.emit(
                ERROR,
                srv_prefix("update_slots") + f"Invalid input batch. i = {off}, n_batch = {n_batch}, ret = {ret}\n",
            )

    # -- end of request ---------------------------------------------------------------------------
    def print_timings(self, task: int, t: RequestTimings, stats: SpecStats) -> None:
        prompt = "prompt eval time = " + _rate_line(t.t_prompt_ms, t.n_prompt)
        evaluation = "       eval time = " + _rate_line(t.t_gen_ms, t.n_decoded)
        total = f"      total time = {t.t_prompt_ms + t.t_gen_ms:10.2f} ms / {t.n_prompt + t.n_decoded:5d} tokens"
        rate = t.n_accepted / t.n_drafted if t.n_drafted else 0.0
        if self.flavor == "fork-v0.2":
            # One SLT_INF starting with a newline, then continuation (unprefixed) lines.
            self.w.emit(INFO, slot_prefix("print_timings", self.slot, task) + f"\n{prompt}\n{evaluation}\n{total}\n")
            if t.n_drafted:
                self.w.emit(
                    CONT,
                    f"draft acceptance rate = {rate:0.5f} ({t.n_accepted:5d} accepted / {t.n_drafted:5d} generated)\n",
                )
        else:
            for line in (prompt, evaluation, total, f"   graphs reused = {t.n_reused:10d}"):
                self._slot(INFO, "print_timings", task, line)
            if t.n_drafted:
                line = f"draft acceptance = {rate:0.5f} ({t.n_accepted:5d} accepted / {t.n_drafted:5d} generated)"
                if self.flavor == "upstream":
                    mean_len = 1 + t.n_accepted / t.n_verify_steps if t.n_verify_steps else 1.0
                    line += f", mean len = {mean_len:5.2f}"
                self._slot(INFO, "print_timings", task, line)
        self.statistics(stats)

    def statistics(self, s: SpecStats) -> None:
        dur = f", dur(b,g,a) = {s.t_begin_ms:.3f}, {s.t_gen_ms:.3f}, {s.t_acc_ms:.3f} ms"
        if self.flavor == "fork-v0.2":
            self.w.emit(
                INFO,
                f"statistics dflash: #calls(b,g,a) = {s.n_begin} {s.n_gen_calls} {s.n_acc_calls}, "
                f"#gen drafts = {s.n_gen_drafts}, #acc drafts = {s.n_acc_drafts}, "
                f"#gen tokens = {s.n_gen_tokens}, #acc tokens = {s.n_acc_tokens}{dur}\n",
            )
            return
        counts = (
            f"#calls(b,g,a) = {s.n_begin:4d} {s.n_gen_calls:6d} {s.n_acc_calls:6d}, "
            f"#gen drafts = {s.n_gen_drafts:6d}, #acc drafts = {s.n_acc_drafts:5d}, "
            f"#gen tokens = {s.n_gen_tokens:6d}, #acc tokens = {s.n_acc_tokens:5d}"
        )
        if self.flavor == "fork":
            self.w.emit(INFO, f"statistics {'dflash':>16}: {counts}{dur}\n")
            return
        mean = 1 + s.n_acc_tokens / s.n_acc_calls if s.n_acc_calls else 0.0
        per_pos = ", ".join(f"{n / s.n_acc_calls:.3f}" for n in s.acc_per_pos) if s.n_acc_calls else ""
        extra = f", #mean acc len = {mean:.2f}, #acc rate/pos = ({per_pos})"
        self.w.emit(
            INFO,
            spc_prefix("common_speculative_print_stats") + f"statistics {'draft-dflash':>16}: {counts}{extra}{dur}\n",
        )

    def release(self, task: int, n_tokens: int, truncated: bool) -> None:
        self._slot(INFO, "release", task, f"stop processing: n_tokens = {n_tokens}, truncated = {int(truncated)}")

    def all_idle(self) -> None:
        self.w.emit(INFO, srv_prefix("update_slots") + "all slots are idle\n")
