"""Named failure signatures: which known bug a log shows, why, and what to do next.

The catalogue is data: one `Signature` per bug family, tried in order (most specific first), each with a rule
(analyze/findings/rules.py) over the reader's ParseResult. Next steps are templates filled from the log's own
environment (build, GPUs, flags, spec type), and a step can say when it applies, so the advice fits the
reporter's setup. Explanations and steps are the tool's own words only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvtrace.analyze.findings.cycles import CycleStats, cycle_stats
from kvtrace.analyze.findings.rules import (
    Env,
    Match,
    env_of,
    rule_abort_outside_spec,
    rule_decode_compute,
    rule_decode_invalid_batch,
    rule_device_lost,
    rule_draft_kv_full,
    rule_draft_load,
    rule_encoder_decode,
    rule_fallback,
    rule_healthy,
    rule_hidden_state,
    rule_invalid_logits,
    rule_kv_full,
    rule_model_load,
    rule_mrope,
    rule_multimodal,
    rule_not_continuous,
    rule_not_rolled_back,
    rule_out_of_memory,
    rule_parallel_slot,
    rule_server_error,
    rule_spec_assert,
    rule_stale_drafter,
    rule_target_positions,
    rule_told_in_prose,
    rule_wrapper_failure,
)

if TYPE_CHECKING:
    from kvtrace.analyze.reader.parser import ParseResult

DEBUG_ENV = "LLAMA_BATCH_DEBUG=1 LLAMA_KV_CACHE_DEBUG=1 GGML_DFLASH_DEBUG=1"


@dataclass(slots=True, frozen=True)
class Step:
    """One next step: a template over Env.fields(), shown when `when(env)` holds (always if None)."""

    text: str
    when: Callable[[Env], bool] | None = None

    def render(self, env: Env) -> str | None:
        if self.when is not None and not self.when(env):
            return None
        return self.text.format(**env.fields())


@dataclass(slots=True, frozen=True)
class Signature:
    name: str
    title: str
    rule: Callable[[ParseResult, CycleStats], Match | None]
    explanation: str
    next_steps: tuple[Step, ...]
    failure: bool = True  # False for the healthy signature


@dataclass(slots=True)
class SignatureMatch:
    signature: Signature
    match: Match
    env: Env
    steps: list[str]
    cycles: CycleStats

    @property
    def name(self) -> str:
        return self.signature.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "signature": self.signature.name, "title": self.signature.title, "failure": self.signature.failure,
            "detail": self.match.detail, "key": self.match.key, "facts": self.match.facts,
            "evidence": [{"line": n, "text": t} for n, t in self.match.evidence],
            "explanation": self.signature.explanation, "next_steps": self.steps,
            "cycles": self.cycles.to_dict(),
        }


# ---- the catalogue ------------------------------------------------------------------------------------

def _no_debug(e: Env) -> bool:
    return e.debug_missing


RERUN_DEBUG = Step(f"Rerun with `{DEBUG_ENV}` and `-v` (or `kvtrace capture run -- llama-server ...`) so every "
                   "batch and every stored KV position is in the log.", _no_debug)
SINGLE_GPU = Step("Try a single GPU (`--split-mode none`, or `CUDA_VISIBLE_DEVICES=0`): the log shows {n_gpus} "
                  "devices ({device_list}){drafter_on}, and a failure that goes away on one device points at the "
                  "split.", lambda e: e.n_gpus > 1)
NO_KVU = Step("Rerun without `--kv-unified`: with one shared KV stream, slots and the drafter see each "
              "other's positions.", lambda e: e.kv_unified)
PARALLEL_1 = Step("Rerun with `--parallel 1`: the log runs {parallel} slots; if one slot works, the bug is in "
                  "how slots map to sequences.", lambda e: (e.parallel or 0) > 1)
REPORT_BUILD = Step("Quote the build (`{build}`) when reporting, and retest on the newest release first.",
                    lambda e: bool(e.build))

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "told_in_prose", "Told in prose only", rule_told_in_prose,
        "Only a sentence of the report tells of this: no log line shows it, so kvtrace names no side, no cause and "
        "no fix (a sentence that names the drafter does not say which context failed).",
        (Step("Attach the server's whole log, start-up to the failure, as a file or in a fenced block: its lines "
              "show the side and the cause."),
         Step("Or rerun under `kvtrace capture run -- llama-server ...`, which keeps the command, the build, the "
              "devices and every debug line in one log.")),
        failure=False,
    ),
    Signature(
        "stale_drafter_kv", "Stale drafter KV cache", rule_stale_drafter,
        "The drafter's KV cache kept positions from an earlier request or cycle: its stored max (X) stays "
        "fixed while every new draft batch arrives at the target's current position (Y), so llama.cpp refuses "
        "each one. The target was rewound or cleared (new prompt, prefix reuse, context shift) and the drafter "
        "was not, which is the DFlash bug this tool was built for.",
        (
            Step("Known fix: beellama.cpp v0.3.0 clears stale drafter KV before drafting (it logs "
                 "`dflash: clearing stale drafter KV for seq=...`); upgrade and retest.",
                 lambda e: e.dflash and not e.stale_kv_clear),
            Step("The log already shows the v0.3.0 stale-KV clear running, yet the drafter is still stale: this is "
                 "a path the fix does not cover; report it with this log.", lambda e: e.stale_kv_clear),
            Step("Clear the drafter's sequence whenever the target's is cleared or truncated "
                 "(`llama_memory_seq_rm` on both contexts with the same range).", lambda e: not e.dflash),
            RERUN_DEBUG, SINGLE_GPU, NO_KVU, PARALLEL_1, REPORT_BUILD,
        ),
    ),
    Signature(
        "multimodal_positions", "Multimodal chunk left a position hole", rule_multimodal,
        "A batch failed right next to an image (or other media) chunk or find_slot's `non-consecutive token "
        "position` warnings: the chunk's tokens were placed at positions that leave a hole or overlap what the "
        "cache holds (M-RoPE models count image positions differently from text), so the next text batch does "
        "not continue the sequence.",
        (Step("Rerun the same request with a text-only prompt: if it passes, the image chunk's positions are the "
              "cause."),
         Step("Try a smaller image (fewer chunks) or one image per request, and note the model's vision projector."),
         Step("Disable speculative decoding for image requests: a draft context must place the same image "
              "positions as the target.", lambda e: e.speculative),
         RERUN_DEBUG, REPORT_BUILD),
    ),
    Signature(
        "mrope_position_order", "M-RoPE position order", rule_mrope,
        "The model uses M-RoPE (multimodal rotary positions), where llama.cpp only requires positions to "
        "grow (X < Y upstream, X <= Y in forks and older builds) instead of Y = X + 1. A batch arrived at a "
        "position at or below what the cache already holds: usually a draft context (MTP/EAGLE) that was not "
        "trimmed after a rejection, or image tokens whose positions were counted differently by the two sides.",
        (
            Step("Check whether the failing side's cache is trimmed after rejected drafts (the batch's Y is below "
                 "the stored X)."),
            PARALLEL_1, NO_KVU,
            Step("Rerun with a text-only prompt: if the failure needs an image, the vision positions are the cause."),
            RERUN_DEBUG, SINGLE_GPU, REPORT_BUILD,
        ),
    ),
    Signature(
        "drafter_not_rolled_back", "Drafter not rolled back", rule_not_rolled_back,
        "The drafter's cache is ahead of the batch (X >= Y): positions of rejected draft tokens were kept "
        "instead of being removed after verification, so the next draft overlaps them.",
        (
            Step("Make sure rejected draft positions are removed from the drafter "
                 "(`llama_memory_seq_rm(drafter, seq, n_accepted_pos, -1)`) after every verification."),
            Step("Known fix: beellama.cpp v0.3.0 clears stale drafter KV before drafting; upgrade and retest.",
                 lambda e: e.dflash and not e.stale_kv_clear),
            RERUN_DEBUG, PARALLEL_1, NO_KVU, SINGLE_GPU, REPORT_BUILD,
        ),
    ),
    Signature(
        "parallel_slot_mismatch", "Parallel-slot sequence mismatch", rule_parallel_slot,
        "The failing sequence id is not the slot the server was working on, or several slots fail at once: "
        "llama-server maps slot N to sequence N, so one slot's batch met another slot's cache state (slots "
        "sharing a unified KV stream, or a slot reused without clearing its sequence).",
        (PARALLEL_1, NO_KVU, RERUN_DEBUG,
         Step("Note which requests were in flight (the `task` ids) when it failed; a reproducer with two "
              "concurrent requests is what maintainers need."),
         SINGLE_GPU, REPORT_BUILD),
    ),
    Signature(
        "positions_not_continuous", "Positions not continuous inside one batch", rule_not_continuous,
        "llama.cpp refused a batch whose own positions for one sequence skip, go backwards, or disagree with a "
        "coupled sequence: the caller built the batch wrong, before any KV state was involved.",
        (Step("Look at the caller that builds this batch (draft block or verify batch): positions must be "
              "consecutive per sequence."), RERUN_DEBUG, PARALLEL_1, REPORT_BUILD),
    ),
    Signature(
        "target_position_mismatch", "Target cache and slot positions disagree", rule_target_positions,
        "The target refused a batch the server built for one of its own slots: the server's count of the slot's "
        "tokens and the target's KV cache disagree (a prompt-cache or checkpoint restore, a context shift, or a "
        "speculative rollback that removed the wrong positions).",
        (Step("Rerun with `--cache-ram 0` and without `--cache-reuse` to rule out the prompt cache and reuse."),
         Step("Turn speculative decoding off once (`--spec-type none` or no `-md`): if it passes, the rollback "
              "after rejected drafts is the cause.", lambda e: e.speculative),
         PARALLEL_1, NO_KVU, RERUN_DEBUG, REPORT_BUILD),
    ),
    Signature(
        "hidden_state_mismatch", "Hidden-state or embedding mismatch between target and drafter", rule_hidden_state,
        "An assert on the tensors the drafter reads from the target: EAGLE3 and MTP drafters take the target's "
        "hidden states (layer inputs, embeddings). The target's architecture does not expose those layers yet, or "
        "the two models disagree on the embedding size.",
        (Step("Check that the drafter was converted for this exact target (same hidden size, same layer ids); a "
              "drafter for a sibling model does not fit."),
         Step("Check whether this target architecture supports the drafter's hooks in your build; retest on the "
              "newest release."),
         REPORT_BUILD),
    ),
    Signature(
        "device_lost", "A device went away", rule_device_lost,
        "llama.cpp lost one of its devices while running: an RPC server (`--rpc`) that exited, was killed or "
        "became unreachable (ggml-rpc aborts with `Remote RPC server crashed or returned malformed response`), "
        "or a GPU the driver reset. The failure is the device's, not the draft/verify bookkeeping's.",
        (Step("Check the RPC server's own output (it ran on one of {device_list}) and that it is still up; "
              "restart it and rerun.", lambda e: any(d.startswith("RPC") for d in e.devices)),
         Step("Check the driver's log (`dmesg`) for a reset GPU, and its memory and temperature.",
              lambda e: not any(d.startswith("RPC") for d in e.devices)),
         SINGLE_GPU, REPORT_BUILD),
    ),
    Signature(
        "draft_context_failed", "Draft/MTP context failed to load or initialise", rule_draft_load,
        "The draft side (a draft model, an MTP head, an EAGLE3 or DFlash drafter) could not be loaded or its "
        "context could not be created: the file does not fit the requested speculative type, its vocabulary or "
        "architecture does not match the target, or its buffers do not fit in memory. The server stops before "
        "serving.",
        (Step("Check that the draft file fits the speculative type (`--spec-type {spec_type}`): an MTP type needs a "
              "model with MTP layers or a matching MTP head; a draft model needs the target's vocabulary.",
              lambda e: bool(e.spec_type)),
         Step("Check that the draft file fits the speculative type: an MTP type needs MTP layers or an MTP head; a "
              "draft model needs the target's vocabulary.", lambda e: not e.spec_type),
         Step("Give the draft context room: lower `--ctx-size-draft`/`--ctx-size`, or put fewer draft layers on the "
              "GPU (`--spec-draft-ngl`)."),
         Step("Load the draft file alone (`llama-cli -m DRAFT`) to tell a broken file from a broken pairing."),
         REPORT_BUILD),
    ),
    Signature(
        "model_load_failed", "Model failed to load at start-up", rule_model_load,
        "llama.cpp stopped while loading a model, before the first request: the devices cannot hold the "
        "requested layout (RPC devices, for one, cannot hold row-split tensors), the file is broken, or it "
        "does not fit in memory.",
        (Step("Use `--split-mode layer` (or `none`): `--split-mode row` needs devices that hold split buffers, and "
              "RPC devices do not (this log lists {device_list}).",
              lambda e: e.split_mode == "row" or any(d.startswith("RPC") for d in e.devices)),
         Step("Check the device list (`llama-server --list-devices`, with the same `--rpc`/`--device` flags) and "
              "the memory each one has free."),
         REPORT_BUILD),
    ),
    Signature(
        "speculative_assert", "Assert or abort in the speculative path", rule_spec_assert,
        "llama.cpp hit an assertion or aborted while drafting or verifying. A DFlash drafter is non-causal and "
        "goes through encode(), which requires the whole batch in one ubatch (n_ubatch >= n_tokens).",
        (
            Step("Raise the drafter's `--ubatch-size` (or lower `--draft-max`) so a draft block fits one ubatch.",
                 lambda e: e.dflash),
            Step("Paste the whole backtrace (all frames): the frames name the code path."),
            RERUN_DEBUG, SINGLE_GPU, REPORT_BUILD,
        ),
    ),
    Signature(
        "abort_outside_speculation", "Abort without speculative decoding", rule_abort_outside_spec,
        "llama.cpp hit an assertion or aborted in a run that uses no speculative decoding at all: the bug is in the "
        "model, the backend or the caller, not in a draft/verify cycle.",
        (Step("Paste the whole backtrace (all frames): the frames name the code path."),
         Step("Retry on the CPU backend (`-ngl 0`) to tell a backend bug from a model bug.",
              lambda e: e.n_gpus != 1),
         SINGLE_GPU, REPORT_BUILD),
    ),
    Signature(
        "draft_kv_full", "Draft context's KV cache full", rule_draft_kv_full,
        "The draft context ran out of KV cells (`ret = 1` right after a draft call): it has its own context size, "
        "and a long prompt that fits the target does not fit the drafter.",
        (Step("Give the drafter as much context as the target (`--ctx-size-draft`, or the same `--ctx-size`)."),
         Step("Lower `--parallel` or `--draft-max` so the draft context needs fewer cells."),
         REPORT_BUILD),
    ),
    Signature(
        "kv_cache_full", "KV cache full or fragmented", rule_kv_full,
        "The KV cache had no free cells for a batch (`ret = 1`, no memory slot, context exceeded): the context "
        "is full, or split among too many slots, or fragmented so no contiguous run is free.",
        (Step("Raise `--ctx-size`, or lower `--parallel` (each slot gets ctx-size / parallel cells)."),
         Step("Lower `--batch-size` / `--ubatch-size`, or turn on context shift if the build has it."),
         Step("With a draft model, give the drafter its own context size (`--ctx-size-draft`).",
              lambda e: e.speculative),
         REPORT_BUILD),
    ),
    Signature(
        "encoder_model_decoded", "Encoder-only model called with decode", rule_encoder_decode,
        "An embedding or reranking (encoder-only) model was given to llama_decode, which refuses every batch: the "
        "runtime should call llama_encode for it.",
        (Step("Serve the model as an embedding model (`--embedding`, or the runtime's embedding endpoint) rather "
              "than for generation."),
         Step("Update the runtime: newer llama.cpp calls encode() for such models itself."), REPORT_BUILD),
    ),
    Signature(
        "decode_compute_failed", "Decode could not prepare or compute the batch", rule_decode_compute,
        "llama_decode returned -2/-3 (or `failed to prepare ubatch`, `Compute error`): the batch could not be "
        "split, allocated or computed, usually memory for the compute graph, a context larger than the model or "
        "runtime supports, or a backend failure; not a position or cache-room problem.",
        (Step("Lower the context size and `--batch-size`/`--ubatch-size`; stay within the model's trained context."),
         Step("Retry on another backend or the CPU to tell a backend failure from a memory limit."),
         SINGLE_GPU, REPORT_BUILD),
    ),
    Signature(
        "decode_invalid_batch", "Decode refused the batch as invalid (ret = -1)", rule_decode_invalid_batch,
        "llama_decode returned -1: the input-batch checks refused the batch before computing it (positions that do "
        "not continue the sequence's cache, a sequence id past the context's sequences, a token outside the "
        "vocabulary). llama.cpp logs which check just before it; a second call that fails where the first "
        "worked usually means the cache still holds the previous call's positions.",
        (Step("Turn on llama.cpp's log (the runtime's verbose mode or log callback) and rerun: the `init:` lines "
              "just before the failure name the check that refused the batch."),
         Step("Between independent calls, clear the context's memory (`llama_memory_clear`, the runtime's "
              "`reset()`), or start the next call's positions where the cache ends."),
         Step("Check the batch's sequence ids (below `--parallel` / `n_seq_max`) and token ids (below the "
              "model's vocabulary size)."),
         REPORT_BUILD),
    ),
    Signature(
        "invalid_logits", "Logits asked for a position that has none", rule_invalid_logits,
        "llama.cpp was asked for the logits of a batch position that was not marked for output (`invalid logits "
        "id`, `-1` when the batch produced none): the caller built the batch without `logits` set where it reads "
        "them, or an image/embedding step left no output row; newer builds abort there.",
        (Step("Check the caller's batch: the position it reads logits for must have `logits`/`output` set (the "
              "last token of each sequence at least)."),
         Step("If it happens with images or an embedding model, rerun text-only or with the model's own endpoint: "
              "the multimodal or embedding path produced no output row."),
         REPORT_BUILD),
    ),
    Signature(
        "out_of_memory", "Out of memory on a device or the host", rule_out_of_memory,
        "An allocation failed: the model's layers, the KV cache or the compute buffers did not fit in the free "
        "memory of the device (or the host). Not a position or cache bookkeeping problem.",
        (Step("Put fewer layers on the GPU (`-ngl`), lower `--ctx-size` and `--batch-size`/`--ubatch-size`, or "
              "quantize the KV cache (`--cache-type-k q8_0`)."),
         Step("Check what else holds the device's memory (`nvidia-smi`, another server or model still loaded)."),
         Step("With a draft model, count its weights and its own context too (`--ctx-size-draft`, "
              "`--spec-draft-ngl`).", lambda e: e.speculative),
         REPORT_BUILD),
    ),
    Signature(
        "server_error_response", "The server answered with an internal error", rule_server_error,
        "A client got an HTTP 500 (`server_error`) from llama-server, and the text holds no server line that says "
        "why. The message in the answer names the part that failed (a decode, the chat-format parser, a tool "
        "call), and the server's own log at that moment holds the cause.",
        (Step("Find the server's log lines at the time of the 500 (`-v` shows each request) and attach them."),
         Step("If the message names the output format or a parser, retry with another chat template or without "
              "tools/grammar: the model's output, not the decode, failed."),
         REPORT_BUILD),
    ),
    Signature(
        "runtime_reported_failure", "A failure told only in a runtime's words", rule_wrapper_failure,
        "A runtime around llama.cpp (a binding, ollama, a server wrapper) reported a failed decode, a full KV "
        "cache or a crash in its own words (a return-code enum, an exception, a Go panic, a signal), without "
        "llama.cpp's own log lines. The code tells the family: 1 is no KV slot, -1 an invalid batch, -2/-3 a "
        "compute or allocation failure.",
        (Step("Turn on the runtime's llama.cpp logging (verbose, or its log callback) and rerun, so llama.cpp's "
              "own failure lines are in the log."),
         Step("A full KV cache (`NoKvSlot`, code 1): raise the context size or lower the number of parallel "
              "sequences; keep the prompt within the context."),
         Step("Quote the runtime's version and the llama.cpp build it bundles."),
         REPORT_BUILD),
    ),
    Signature(
        "healthy_speculative", "Healthy speculative run", rule_healthy,
        "Speculative decoding ran without a failure. Acceptance says how often the target agreed with the "
        "drafter; the mean accepted length is tokens per verification (1 + accepted / verify steps).",
        (Step("No failure was read. If the output went bad without one (garbage, repeats), say after how many "
              "tokens, and capture that run: a drafter that stops matching shows in acceptance over time."),
         Step("To speed up, compare acceptance across `--draft-max` values."),
         Step("If a failure happens elsewhere, capture that run with `" + DEBUG_ENV + "` and `-v`.")),
        failure=False,
    ),
    Signature(
        "unclassified", "No known signature", rule_fallback,
        "The log does not match a known signature; the verdict says what the reader found.",
        (RERUN_DEBUG, SINGLE_GPU, PARALLEL_1, NO_KVU, REPORT_BUILD,
         Step("Attach the whole log (not an excerpt): the lines before the first failure matter.")),
    ),
)

BY_NAME: dict[str, Signature] = {s.name: s for s in SIGNATURES}
ORDER: dict[str, int] = {s.name: i for i, s in enumerate(SIGNATURES)}


def match_signature(result: ParseResult) -> SignatureMatch:
    """The most specific signature whose rule matches (the catalogue is ordered; the last always matches)."""
    env = env_of(result)
    cycles = cycle_stats(result)
    for sig in SIGNATURES:
        m = sig.rule(result, cycles)
        if m is None:
            continue
        if sig.name == "unclassified" and result.verdict.kind in ("no_log", "other") and not len(result.errors):
            sig = Signature(sig.name, "No failure found", sig.rule,
                            "The log has no failure and no draft statistics.", sig.next_steps, failure=False)
        steps = [s for s in (step.render(env) for step in sig.next_steps) if s]
        return SignatureMatch(sig, m, env, list(dict.fromkeys(steps)), cycles)
    raise AssertionError("the fallback signature always matches")
